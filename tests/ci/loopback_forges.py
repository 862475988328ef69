"""GitHub's and GitLab's REST APIs as far as fusionwatch's CI reporting uses them, on a loopback port, with
their state kept (check runs, statuses, comments, notes) and every request's shape checked as the real API
checks it: a missing or misspelled field gets the 422 (GitHub) or 400 (GitLab) the forge would answer, and
`problems` lists it so that a test fails even where the CLI only warns. Behaviours a test asks for: refuse
check runs (a token without `checks: write`), refuse every write (a fork's read-only token), rate-limit
the first write with `Retry-After`, or hang (a timeout)."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "ghs_loopbacktoken"
GITLAB_TOKEN = "glpat-loopback"
CONCLUSIONS = {"action_required", "cancelled", "failure", "neutral", "success", "skipped", "stale", "timed_out"}
CHECK_STATUSES = {"queued", "in_progress", "completed"}
STATUS_STATES = {"error", "failure", "pending", "success"}
GITLAB_STATES = {"pending", "running", "success", "failed", "canceled", "skipped"}
SHA = re.compile(r"[0-9a-f]{40}")


@dataclass
class Behaviour:
    refuse_check_runs: bool = False
    read_only: bool = False
    rate_limit_first_write: bool = False
    hang_s: float = 0.0


@dataclass
class Request:
    method: str
    path: str
    body: Any
    headers: dict[str, str]


@dataclass
class LoopbackForge:
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: list[Request] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    check_runs: dict[int, dict] = field(default_factory=dict)
    statuses: list[dict] = field(default_factory=list)
    comments: dict[int, dict] = field(default_factory=dict)  # id → {"issue", "body"}; GitLab: notes
    merge_bases: dict[tuple[str, str], str] = field(default_factory=dict)
    next_id: int = 1000
    rate_limited: bool = False

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]


class _Server:
    def __init__(self, forge: LoopbackForge, handle) -> None:
        self.forge = forge
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw.decode(errors="replace")
                request = Request(self.command, self.path, body, {k.lower(): v for k, v in self.headers.items()})
                if forge.behaviour.hang_s and self.command != "GET":
                    time.sleep(forge.behaviour.hang_s)
                with lock:
                    forge.requests.append(request)
                    status, answer, headers = handle(forge, request)
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the timeout test): nothing left to answer

            do_GET = do_POST = do_PATCH = do_PUT = _serve  # noqa: N815 (http.server's names)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def loopback_github(forge: LoopbackForge | None = None) -> _Server:
    return _Server(forge or LoopbackForge(), _github)


def loopback_gitlab(forge: LoopbackForge | None = None) -> _Server:
    return _Server(forge or LoopbackForge(), _gitlab)


# --- GitHub ----------------------------------------------------------------------------------------------


def _github(forge: LoopbackForge, request: Request) -> tuple[int, Any, dict]:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return 401, {"message": "Bad credentials"}, {}
    if request.headers.get("accept") != "application/vnd.github+json" or "x-github-api-version" not in request.headers:
        forge.problems.append(f"{request.method} {request.path}: Accept/X-GitHub-Api-Version headers missing")
    path, _, query = request.path.partition("?")
    if request.method != "GET":
        if forge.behaviour.read_only:
            return 403, {"message": "Resource not accessible by integration"}, {}
        if forge.behaviour.rate_limit_first_write and not forge.rate_limited:
            forge.rate_limited = True
            return 403, {"message": "You have exceeded a secondary rate limit"}, {"Retry-After": "1"}
    parts = path.strip("/").split("/")
    if len(parts) < 4 or parts[0] != "repos":
        return 404, {"message": "Not Found"}, {}
    rest, body = parts[3:], request.body if isinstance(request.body, dict) else {}
    if rest == ["check-runs"] and request.method == "POST":
        if forge.behaviour.refuse_check_runs:
            return 403, {"message": "Resource not accessible by integration"}, {}
        return _check_run(forge, request, body, None)
    if len(rest) == 2 and rest[0] == "check-runs" and request.method == "PATCH":
        run_id = int(rest[1])
        if run_id not in forge.check_runs:
            return 404, {"message": "Not Found"}, {}
        return _check_run(forge, request, body, run_id)
    if len(rest) == 2 and rest[0] == "statuses" and request.method == "POST":
        problems = _github_status_problems(rest[1], body)
        if problems:
            forge.problems += problems
            return 422, {"message": "Validation Failed", "errors": problems}, {}
        forge.statuses.append({"sha": rest[1], **body})
        return 201, {"id": forge.new_id(), **body}, {}
    if len(rest) == 3 and rest[0] == "issues" and rest[2] == "comments":
        number = int(rest[1])
        if request.method == "GET":
            page = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("page", 1))
            per_page = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("per_page", 30))
            found = [{"id": i, "body": c["body"]} for i, c in sorted(forge.comments.items()) if c["issue"] == number]
            return 200, found[(page - 1) * per_page: page * per_page], {}
        if request.method == "POST":
            if not isinstance(body.get("body"), str) or not body["body"]:
                forge.problems.append("comment without a body")
                return 422, {"message": "Validation Failed"}, {}
            comment_id = forge.new_id()
            forge.comments[comment_id] = {"issue": number, "body": body["body"]}
            return 201, {"id": comment_id, "body": body["body"]}, {}
    if len(rest) == 3 and rest[:2] == ["issues", "comments"] and request.method == "PATCH":
        comment_id = int(rest[2])
        if comment_id not in forge.comments:
            return 404, {"message": "Not Found"}, {}
        forge.comments[comment_id]["body"] = body["body"]
        return 200, {"id": comment_id, "body": body["body"]}, {}
    if len(rest) == 2 and rest[0] == "compare" and request.method == "GET":
        base, _, head = rest[1].partition("...")
        merge_base = forge.merge_bases.get((base, head))
        if merge_base is None:
            return 404, {"message": "Not Found"}, {}
        return 200, {"merge_base_commit": {"sha": merge_base}, "status": "diverged"}, {}
    forge.problems.append(f"unexpected request {request.method} {request.path}")
    return 404, {"message": "Not Found"}, {}


def _check_run(forge: LoopbackForge, request: Request, body: dict, run_id: int | None) -> tuple[int, Any, dict]:
    problems = []
    if run_id is None and (not isinstance(body.get("name"), str) or not SHA.fullmatch(str(body.get("head_sha")))):
        problems.append("check run needs name and a 40-hex head_sha")
    status, conclusion = body.get("status"), body.get("conclusion")
    if status is not None and status not in CHECK_STATUSES:
        problems.append(f"status {status!r}")
    if conclusion is not None and conclusion not in CONCLUSIONS:
        problems.append(f"conclusion {conclusion!r}")
    if (status == "completed") != (conclusion is not None):
        problems.append("a completed check run needs a conclusion, and only a completed one")
    output = body.get("output")
    if output is not None and (not output.get("title") or not output.get("summary") or len(output["summary"]) > 65535):
        problems.append("output needs title and summary (at most 65535 characters)")
    unknown = set(body) - {"name", "head_sha", "details_url", "external_id", "status", "started_at", "conclusion",
                           "completed_at", "output", "actions"}
    if unknown:
        problems.append(f"unknown check-run fields {sorted(unknown)}")
    if problems:
        forge.problems += problems
        return 422, {"message": "Validation Failed", "errors": problems}, {}
    if run_id is None:
        run_id = forge.new_id()
        forge.check_runs[run_id] = dict(body)
        return 201, {"id": run_id, **body}, {}
    forge.check_runs[run_id].update(body)
    forge.check_runs[run_id].setdefault("updates", 0)
    forge.check_runs[run_id]["updates"] += 1
    return 200, {"id": run_id, **forge.check_runs[run_id]}, {}


def _github_status_problems(sha: str, body: dict) -> list[str]:
    problems = []
    if not SHA.fullmatch(sha):
        problems.append(f"status sha {sha!r}")
    if body.get("state") not in STATUS_STATES:
        problems.append(f"status state {body.get('state')!r}")
    if len(str(body.get("description") or "")) > 140:
        problems.append("status description over 140 characters")
    return problems


# --- GitLab ----------------------------------------------------------------------------------------------


def _gitlab(forge: LoopbackForge, request: Request) -> tuple[int, Any, dict]:
    if request.headers.get("private-token") != GITLAB_TOKEN:
        return 401, {"message": "401 Unauthorized"}, {}
    path, _, query = request.path.partition("?")
    if not path.startswith("/api/v4/projects/"):
        return 404, {"message": "404 Not Found"}, {}
    if request.method != "GET" and forge.behaviour.read_only:
        return 403, {"message": "403 Forbidden"}, {}
    rest, body = path.removeprefix("/api/v4/projects/").split("/")[1:], request.body if isinstance(request.body, dict) else {}
    if len(rest) == 2 and rest[0] == "statuses" and request.method == "POST":
        state = body.get("state")
        if state not in GITLAB_STATES or not SHA.fullmatch(rest[1]):
            forge.problems.append(f"GitLab status state {state!r} on {rest[1]!r}")
            return 400, {"message": "state does not have a valid value"}, {}
        earlier = [s for s in forge.statuses if s["sha"] == rest[1] and s.get("name") == body.get("name")]
        if earlier and earlier[-1]["state"] == state:
            return 400, {"message": f"Cannot transition status via :{state} from :{state}"}, {}
        forge.statuses.append({"sha": rest[1], **body})
        return 201, {"id": forge.new_id(), **body}, {}
    if len(rest) == 3 and rest[0] == "merge_requests" and rest[2] == "notes":
        iid = int(rest[1])
        if request.method == "GET":
            params = dict(p.split("=") for p in query.split("&") if "=" in p)
            page, per_page = int(params.get("page", 1)), int(params.get("per_page", 20))
            found = [{"id": i, "body": n["body"], "system": False} for i, n in sorted(forge.comments.items())
                     if n["issue"] == iid]
            return 200, found[(page - 1) * per_page: page * per_page], {}
        if request.method == "POST" and isinstance(body.get("body"), str) and body["body"]:
            note_id = forge.new_id()
            forge.comments[note_id] = {"issue": iid, "body": body["body"]}
            return 201, {"id": note_id, "body": body["body"]}, {}
    if len(rest) == 4 and rest[0] == "merge_requests" and rest[2] == "notes" and request.method == "PUT":
        note_id = int(rest[3])
        if note_id not in forge.comments:
            return 404, {"message": "404 Not found"}, {}
        forge.comments[note_id]["body"] = body["body"]
        return 200, {"id": note_id, "body": body["body"]}, {}
    forge.problems.append(f"unexpected request {request.method} {request.path}")
    return 404, {"message": "404 Not Found"}, {}
