"""Requests to a forge's REST API (GitHub, GitLab) from a CI step: a short timeout, a retry only where the
forge says when (`Retry-After`, or GitHub's rate-limit reset), and every failure one `ForgeError` naming the
request and the forge's own message, which the reporters turn into a warning in the step's log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

TIMEOUT_S = 15.0
ATTEMPTS = 3
MAX_RETRY_WAIT_S = 60.0  # a longer Retry-After gives up: a CI step should not idle for minutes on a report


class ForgeError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ForgeApi:
    def __init__(self, base_url: str, headers: dict[str, str], what: str, timeout_s: float = TIMEOUT_S) -> None:
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        self.what = what

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON (None for an empty body)."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TimeoutException as error:
                raise ForgeError(f"{self.what}: {method} {path} timed out after {self.http.timeout.read:g} s") from error
            except httpx.TransportError as error:
                raise ForgeError(f"{self.what}: {method} {path}: {error or type(error).__name__}") from error
            if response.status_code < 400:
                return response.json() if response.content else None
            wait = retry_after(response)
            if wait is None or attempt == ATTEMPTS or wait > MAX_RETRY_WAIT_S:
                waited = f" (asked to retry after {wait:g} s)" if wait is not None else ""
                raise ForgeError(f"{self.what}: {method} {path}: HTTP {response.status_code}: "
                                 f"{_message(response)}{waited}", response.status_code)
            time.sleep(wait)
        raise AssertionError("unreachable")


def retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait before retrying, where the forge says so: `Retry-After` on 429, 403 (GitHub's
    secondary rate limit) or 5xx, or GitHub's primary limit spent (`x-ratelimit-remaining: 0`) until its reset."""
    if response.status_code not in (403, 429) and response.status_code < 500:
        return None
    header = response.headers.get("retry-after", "").strip()
    if header.isdigit():
        return float(header)
    if response.headers.get("x-ratelimit-remaining") == "0" and response.headers.get("x-ratelimit-reset", "").isdigit():
        return max(0.0, float(response.headers["x-ratelimit-reset"]) - time.time())
    return None


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        text = body.get("message") or body.get("error") or json.dumps(body)
        return str(text)[:300]
    return json.dumps(body)[:300]


def attempt_each(steps: list[Callable[[], str | None]], advice: Callable[[list[ForgeError]], str]) -> list[str]:
    """Run every step (the commit's check, the pull request's comment), one failing not stopping the next;
    what each did, one line each. A ForgeError naming every failure, with `advice` and what was done, after."""
    done, errors = [], []
    for step in steps:
        try:
            line = step()
        except ForgeError as error:
            errors.append(error)
            continue
        if line:
            done.append(line)
    if errors:
        message = "; ".join(str(e) for e in errors) + advice(errors)
        if done:
            message += f" (done: {'; '.join(done)})"
        raise ForgeError(message, errors[0].status)
    return done
