"""API tokens (issue 12, Access): every route but health, the webhooks and sign-in needs one; reading
needs any token unless the server is configured public; writing needs a write token, limited to its
project when it has one; tokens are stored hashed and never shown again; webhooks take the project's
HMAC signature, or a write token when the project has no secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select, text
from typer.testing import CliRunner

from service.app import create_app
from service.auth import COOKIE
from service.cli import app as cli_app
from service.cli_client import CommitRef, Server
from service.core.config import settings
from service.models import ApiToken
from tests.service.db_fixtures import make_token

BERT = Path("tests/models/bert_torchscript_opset14.onnx")
SECRET = "s3cr3t-for-hmac"
# Routes that check their callers themselves, or must be reachable before signing in.
OPEN = {"/api/v1/health", "/api/v1/webhooks/github", "/api/v1/webhooks/ci", "/login", "/logout",
        "/static/{name}", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


@pytest.fixture
def anonymous(migrated_database_url, service_settings):
    """The app with no token at all; `make_token` gives the test what it needs."""
    with TestClient(create_app(migrated_database_url, service_settings), follow_redirects=False) as test_client:
        yield test_client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: "1" if m.group(0).endswith("_id}") else "p", path)


def _routes(routes, prefix: str = ""):
    """(path, methods) of every route, through included routers (FastAPI 0.16x keeps them nested)."""
    for route in routes:
        included = getattr(route, "include_context", None)
        if included is not None:
            yield from _routes(included.included_router.routes, prefix + included.prefix)
        elif isinstance(route, APIRoute):
            yield prefix + route.path, route.methods


def test_every_route_but_the_open_ones_refuses_a_request_without_a_token(anonymous):
    checked = 0
    for path, methods in _routes(anonymous.app.routes):
        if path in OPEN:
            continue
        for method in methods - {"HEAD"}:
            reply = anonymous.request(method, _concrete(path))
            checked += 1
            if path.startswith(("/api/", "/metrics")) or method != "GET":
                assert reply.status_code == 401, (method, path, reply.status_code, reply.text[:200])
            else:  # a dashboard page sends the browser to sign in, and back afterwards
                assert reply.status_code == 303, (method, path, reply.status_code)
                assert reply.headers["location"].startswith("/login?next=/"), reply.headers["location"]
    walked = {path for path, _ in _routes(anonymous.app.routes)}
    assert {"/api/v1/results", "/api/v1/alerts/{alert_id}/ack", "/metrics", "/alerts/{alert_id}/ack", "/"} <= walked
    assert checked >= 25  # the walk saw the API and the dashboard, not an empty app
    assert anonymous.get("/api/v1/health").status_code == 200


def test_read_tokens_read_and_write_tokens_write(anonymous, migrated_database_url):
    reader = make_token(migrated_database_url, "dashboard-viewer", scope="read")
    writer = make_token(migrated_database_url, "ci")
    assert anonymous.post("/api/v1/projects", json={"name": "bert"}, headers=_bearer(writer)).status_code == 201
    assert anonymous.get("/api/v1/projects", headers=_bearer(reader)).json()["total"] == 1
    refused = anonymous.post("/api/v1/projects", json={"name": "gpt2"}, headers=_bearer(reader))
    assert refused.status_code == 403
    assert refused.json()["detail"] == "token 'dashboard-viewer' is read-only; this needs a token with write scope"
    assert anonymous.get("/api/v1/projects", headers=_bearer(writer)).json()["total"] == 1


def test_a_project_token_writes_to_its_project_only(anonymous, migrated_database_url):
    admin = _bearer(make_token(migrated_database_url, "admin"))
    for name in ("bert", "gpt2"):
        anonymous.post("/api/v1/projects", json={"name": name}, headers=admin).raise_for_status()
    ci = _bearer(make_token(migrated_database_url, "ci-bert", project="bert"))

    with BERT.open("rb") as handle:
        own = anonymous.post("/api/v1/projects/bert/models", files={"file": ("bert.onnx", handle)}, headers=ci)
    assert own.status_code == 201, own.text
    with BERT.open("rb") as handle:
        other = anonymous.post("/api/v1/projects/gpt2/models", files={"file": ("bert.onnx", handle)}, headers=ci)
    assert other.status_code == 403
    assert other.json()["detail"] == "token 'ci-bert' may write to project 'bert' only, not 'gpt2'"
    result = {"model": "bert.onnx", "engine": "fusionwatch", "engine_version": "1", "level": "all", "fusions": {}}
    results = {"project": "gpt2", "commit": {"sha": "a" * 40}, "results": [result]}
    assert anonymous.post("/api/v1/results", json=results, headers=ci).status_code == 403
    assert anonymous.post("/api/v1/projects", json={"name": "new"}, headers=ci).status_code == 403
    assert anonymous.post("/api/v1/projects/gpt2/hooks", json={"url": "http://127.0.0.1:9/x"}, headers=ci).status_code == 403
    # Reading is not limited: a project token reads every project, as any read token does.
    assert anonymous.get("/api/v1/projects/gpt2", headers=ci).status_code == 200


def test_unknown_revoked_and_malformed_tokens_are_401(anonymous, migrated_database_url, monkeypatch, session):
    token = make_token(migrated_database_url, "soon-gone")
    assert anonymous.get("/api/v1/projects", headers=_bearer(token)).status_code == 200
    assert session.scalar(select(ApiToken.last_used_at).where(ApiToken.name == "soon-gone")) is not None
    monkeypatch.setattr(settings, "database_url", migrated_database_url)
    result = CliRunner().invoke(cli_app, ["token", "revoke", "soon-gone"])
    assert result.exit_code == 0, result.output
    for headers in (_bearer(token), _bearer("fw_" + "A" * 43), _bearer("not-a-token"), {"Authorization": "Basic abc"}):
        reply = anonymous.get("/api/v1/projects", headers=headers)
        assert reply.status_code == 401, headers
        assert token not in reply.text


def test_only_the_hash_is_stored_and_the_token_is_shown_once(migrated_database_url, session, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(settings, "database_url", migrated_database_url)
    env = {"COLUMNS": "200"}
    created = CliRunner().invoke(cli_app, ["token", "create", "alice", "--scope", "read"], env=env)
    assert created.exit_code == 0, created.output
    token = created.stdout.strip()
    assert re.fullmatch(r"fw_[A-Za-z0-9_-]{43}", token)
    assert token not in created.stderr

    row = session.scalar(select(ApiToken).where(ApiToken.name == "alice"))
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert (row.scope, row.project_id, row.prefix) == ("read", None, token[:8])
    for column in inspect(ApiToken).columns:  # no column holds the token itself
        assert getattr(row, column.key) != token
    dumped = session.execute(text("SELECT * FROM api_token")).all()
    assert token not in repr(dumped)

    listed = CliRunner().invoke(cli_app, ["token", "list"], env=env)
    assert listed.exit_code == 0 and "alice" in listed.stdout and token[:8] in listed.stdout
    assert token not in listed.stdout
    again = CliRunner().invoke(cli_app, ["token", "create", "alice"], env=env)
    assert again.exit_code == 2 and "a token named 'alice' already exists" in again.stderr
    assert token not in caplog.text


def test_public_read_opens_reading_only(migrated_database_url, service_settings):
    public = service_settings.model_copy(update={"public_read": True})
    with TestClient(create_app(migrated_database_url, public), follow_redirects=False) as anonymous:
        assert anonymous.get("/api/v1/projects").status_code == 200
        assert anonymous.get("/").status_code == 200
        assert anonymous.post("/api/v1/projects", json={"name": "bert"}).status_code == 401
        assert anonymous.post("/upload/project", data={"name": "bert"}).status_code == 401


def test_webhooks_take_the_projects_signature_or_else_a_write_token(anonymous, migrated_database_url):
    admin = _bearer(make_token(migrated_database_url, "admin"))
    anonymous.post("/api/v1/projects", json={"name": "signed", "webhook_secret": SECRET, "kind": "engine"},
                   headers=admin).raise_for_status()
    anonymous.post("/api/v1/projects", json={"name": "plain", "kind": "engine"}, headers=admin).raise_for_status()
    for project in ("signed", "plain"):  # an engine project's CI hook measures its registered models again
        with BERT.open("rb") as handle:
            anonymous.post(f"/api/v1/projects/{project}/models", files={"file": ("bert.onnx", handle)},
                           headers=admin).raise_for_status()

    def ci(project: str, sha: str, signature: str | None = None, headers=None):
        body = json.dumps({"project": project, "sha": sha, "branch": "main"}).encode()
        extra = dict(headers or {})
        if signature is not None:
            extra["X-Hub-Signature-256"] = signature
        return anonymous.post("/api/v1/webhooks/ci", content=body, headers=extra)

    def signed(project: str, sha: str) -> str:
        body = json.dumps({"project": project, "sha": sha, "branch": "main"}).encode()
        return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()

    # A project with a secret: only signed deliveries, whatever token comes with them.
    assert ci("signed", "a" * 40, signed("signed", "a" * 40)).status_code == 202
    unsigned = ci("signed", "b" * 40, headers=admin)
    assert unsigned.status_code == 401
    assert "X-Hub-Signature-256 is missing" in unsigned.json()["detail"]
    assert ci("signed", "b" * 40, signed("signed", "c" * 40)).status_code == 401
    # A project without one: a write token for it.
    assert ci("plain", "d" * 40).status_code == 401
    reader = _bearer(make_token(migrated_database_url, "reader", scope="read"))
    assert ci("plain", "d" * 40, headers=reader).status_code == 403
    assert ci("plain", "d" * 40, headers=admin).status_code == 202
    push = {"ref": "refs/heads/main", "after": "e" * 40, "head_commit": {"id": "e" * 40}, "commits": []}
    github = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1"}
    assert anonymous.post("/api/v1/webhooks/github?project=plain", json=push, headers=github).status_code == 401
    assert anonymous.post("/api/v1/webhooks/github?project=plain", json=push, headers=github | admin).status_code == 202


def test_the_cli_signs_its_delivery_when_given_the_secret(anonymous, migrated_database_url, monkeypatch):
    admin = _bearer(make_token(migrated_database_url, "admin"))
    anonymous.post("/api/v1/projects", json={"name": "signed", "webhook_secret": SECRET}, headers=admin).raise_for_status()
    server = Server(anonymous)
    monkeypatch.setenv("FUSIONWATCH_WEBHOOK_SECRET", SECRET)
    answer = server.submit("signed", CommitRef("f" * 40), [BERT])
    assert answer["models"] == ["bert_torchscript_opset14.onnx"] and answer["jobs"] > 0
    monkeypatch.setenv("FUSIONWATCH_WEBHOOK_SECRET", "another secret")
    with pytest.raises(Exception, match="does not match the body signed with the project's secret"):
        server.submit("signed", CommitRef("0" * 39 + "1"), [BERT])


def test_the_dashboard_signs_in_with_a_cookie_and_refuses_cross_site_posts(anonymous, migrated_database_url):
    token = make_token(migrated_database_url, "alice")
    first = anonymous.get("/alerts?state=open")
    assert first.status_code == 303 and first.headers["location"] == "/login?next=/alerts%3Fstate%3Dopen"
    assert anonymous.get("/login").status_code == 200
    wrong = anonymous.post("/login", data={"token": "fw_" + "x" * 43, "next": "/alerts"})
    assert wrong.status_code == 401 and "unknown, revoked or mistyped" in wrong.text
    outside = anonymous.post("/login", data={"token": token, "next": "https://evil.example/"})
    assert outside.headers["location"] == "/"  # never sends the browser off the site
    signed_in = anonymous.post("/login", data={"token": token, "next": "/alerts"})
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/alerts"
    cookie = signed_in.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert token not in anonymous.get("/alerts").text  # the page names the holder, never the token
    assert "alice" in anonymous.get("/").text
    cross = anonymous.post("/upload/project", data={"name": "evil"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    assert anonymous.post("/upload/project", data={"name": "mine"}, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 303
    anonymous.post("/logout")
    assert anonymous.get("/").status_code == 303
