"""Post alerts to a project's hooks, with retries, and log every attempt (alert_delivery).

Slack-compatible hooks get `{"text": message}`; generic JSON hooks get `{"alert": {...}}`. A hook
that keeps failing is logged and left; suspected timing alerts are not posted (their confirmation is); it never fails the job or the request that raised the alert.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, AlertDelivery, Hook
from service.usecases.alerts import alert_dict

log = logging.getLogger("fusionwatch.alerts")

ATTEMPTS = 3
BACKOFF_S = (0.2, 1.0)  # before the second and third attempts
TIMEOUT_S = 5.0


def deliver(session_factory: Callable[[], Session], alert_ids: list[int]) -> None:
    """Post each alert to its project's hooks. No transaction stays open across a network call: the
    payloads are read first, and each attempt is logged in a short transaction of its own."""
    if not alert_ids:
        return
    with session_factory() as session:
        posts = []
        for alert_id in alert_ids:
            alert = session.get(Alert, alert_id)
            if alert.state == "suspected":
                continue  # a timing alert is delivered once a second measurement confirms it
            hooks = session.scalars(select(Hook).where(Hook.project_id == alert.project_id)).all()
            body = alert_dict(session, alert) if hooks else None
            # One alert can stand for several results (both engines' lost BiasGelu): each hook hears of it once.
            tried = set(session.scalars(select(AlertDelivery.hook_id).where(AlertDelivery.alert_id == alert.id)))
            for hook in hooks:
                if hook.id in tried:
                    continue
                payload = {"text": _slack_text(alert, body)} if hook.format == "slack" else {"alert": body}
                posts.append((alert.id, hook.id, hook.url, payload))
        session.rollback()
    for alert_id, hook_id, url, payload in posts:
        _post_with_retries(session_factory, alert_id, hook_id, url, payload)


def _slack_text(alert: Alert, body: dict | None) -> str:
    """The message, and under a fusion-regression its near misses as a person reads them."""
    lines = [f"[fusionwatch] {alert.kind}: {alert.message}"]
    cause = (body or {}).get("cause") or {}
    lines += [f"• {line}" for line in cause.get("near_miss_lines") or []]
    if body and body.get("repro_url"):
        lines.append(f"repro: {body['repro_url']} and {body['repro_url']}?side=baseline")
    return "\n".join(lines)


def _post_with_retries(session_factory, alert_id: int, hook_id: int, url: str, payload: dict) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        status, error = None, None
        try:
            response = httpx.post(url, json=payload, timeout=TIMEOUT_S)
            status = response.status_code
            if not response.is_success:
                error = f"HTTP {status}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        with session_factory() as session, session.begin():
            session.add(AlertDelivery(alert_id=alert_id, hook_id=hook_id, attempt=attempt, status_code=status, error=error))
        if error is None:
            return
        log.warning("alert delivery failed", extra={"alert_id": alert_id, "hook_id": hook_id, "attempt": attempt, "error": error})
        if attempt < ATTEMPTS:
            time.sleep(BACKOFF_S[attempt - 1])
