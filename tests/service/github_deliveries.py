"""GitHub push deliveries as tests send them: a push body, its signature, and the post."""

from __future__ import annotations

import hashlib
import hmac
import json

SECRET = "s3cret-for-tests"


def push_body(head: str, before: str, commits: list[str]) -> bytes:
    return json.dumps(
        {
            "ref": "refs/heads/main",
            "before": before,
            "repository": {"full_name": "acme/engine", "name": "engine"},
            "commits": [{"id": sha, "message": f"change {sha[:6]}", "timestamp": "2026-11-24T10:00:00Z",
                         "author": {"name": "Ada"}} for sha in commits],
            "head_commit": {"id": head, "message": f"change {head[:6]}", "timestamp": "2026-11-24T10:00:00Z",
                            "author": {"name": "Ada"}},
        }
    ).encode()


def signed(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def deliver_push(client, body: bytes, delivery: str, signature: str | None):
    headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": delivery, "Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    return client.post("/api/v1/webhooks/github", content=body, headers=headers)
