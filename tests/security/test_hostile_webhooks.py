"""Both webhooks and POST /results under a hostile client: bodies too deep, too large or the wrong shape,
signatures that are not ASCII, pushes listing tens of thousands of commits. Each is answered 4xx naming
the problem (or, for the long push, recorded capped), and nothing is stored from a refused request."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from service.api.request_bodies import MAX_GITHUB_BODY, MAX_RESULTS_BODY
from service.models import Commit, Job, Model, Result, Run, WebhookDelivery
from service.schemas.github import MAX_PUSH_COMMITS
from tests import hostile_models
from tests.service.github_deliveries import SECRET, deliver_push, push_body, signed

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.fixture
def project(client):
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine", "webhook_secret": SECRET,
                                          "settings": {"levels": ["basic"], "engines": ["fusionwatch"]}}).raise_for_status()
    model = hostile_models.many_nodes(3).SerializeToString()
    client.post("/api/v1/projects/engine/models", files={"file": ("relu.onnx", model)}).raise_for_status()
    return "engine"


def _stored(session) -> tuple[int, ...]:
    session.rollback()
    return tuple(session.scalar(select(func.count()).select_from(t))
                 for t in (Commit, Run, Job, WebhookDelivery, Result))


def _deep_object() -> bytes:
    return b'{"repository": {"name": "engine"}, "x": ' + DEEP + b"}"


def test_json_nested_200000_deep_is_422_on_every_json_route(client, project, session):
    reply = deliver_push(client, DEEP, "deep-1", signed(DEEP))
    assert reply.status_code == 422 and "webhook body is not JSON" in reply.json()["detail"], reply.text
    body = _deep_object()
    reply = deliver_push(client, body, "deep-2", signed(body))
    assert reply.status_code == 422 and "webhook body is not JSON" in reply.json()["detail"], reply.text
    reply = client.post("/api/v1/results", content=DEEP, headers={"content-type": "application/json"})
    assert reply.status_code == 422 and "results document is not JSON" in reply.json()["detail"], reply.text
    reply = client.post("/api/v1/webhooks/ci", content=DEEP, headers={"content-type": "application/json"})
    assert reply.status_code == 422 and "CI webhook is not JSON" in reply.json()["detail"], reply.text
    assert _stored(session) == (0, 0, 0, 0, 0)


def test_a_body_of_millions_of_values_is_refused_before_parsing(client, project, session):
    body = b'{"repository": {"name": "engine"}, "x": [' + b"[]," * 1_000_000 + b"[]]}"
    reply = deliver_push(client, body, "values-1", signed(body))
    assert reply.status_code == 422 and "more than 500000 JSON values" in reply.json()["detail"], reply.text
    assert _stored(session) == (0, 0, 0, 0, 0)


def test_a_signature_in_latin1_is_401_not_a_crash(client, project, session):
    body = push_body("a" * 40, "0" * 40, [])
    reply = client.post("/api/v1/webhooks/github", content=body, headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": "latin-1", "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=éé".encode("latin-1")})
    assert reply.status_code == 401 and "X-Hub-Signature-256 does not match" in reply.json()["detail"], reply.text
    assert _stored(session) == (0, 0, 0, 0, 0)


@pytest.mark.parametrize(("change", "named"), [
    ({"commits": 5}, "GitHub delivery: commits: Input should be a valid list"),
    ({"commits": [{"id": "../../etc/passwd"}]}, "GitHub delivery: commits.0.id"),
    ({"head_commit": {"id": "a" * 40, "timestamp": "yesterday"}}, "GitHub delivery: head_commit.timestamp"),
    ({"head_commit": {"id": "a" * 40, "message": "nul\0"}}, "GitHub delivery: head_commit.message"),
    ({"repository": "engine"}, "GitHub delivery: repository"),
])
def test_a_signed_push_of_the_wrong_shape_is_422_naming_the_field(client, project, session, change, named):
    body = json.dumps({**json.loads(push_body("a" * 40, "0" * 40, [])), **change}).encode()
    reply = deliver_push(client, body, "shape", signed(body))
    assert reply.status_code == 422 and named in reply.json()["detail"], reply.text
    assert _stored(session) == (0, 0, 0, 0, 0)


@pytest.mark.parametrize(("path", "limit"), [("/api/v1/webhooks/github", MAX_GITHUB_BODY),
                                             ("/api/v1/results", MAX_RESULTS_BODY)])
def test_a_100mb_body_is_413_by_its_content_length(client, project, session, path, limit):
    reply = client.post(path, content=b" " * (100 * 1024**2), headers={
        "content-type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": "big"})
    assert reply.status_code == 413, reply.text
    assert reply.json()["detail"] == f"request body is {100 * 1024**2} bytes; at most {limit} here"
    assert _stored(session) == (0, 0, 0, 0, 0)


def _long_push(count: int) -> bytes:
    """A push of `count` commits, each listed by its id alone (a full entry is ~600 bytes, and 40,000 of
    them would be over the body's limit)."""
    shas = [f"{i:040x}" for i in range(1, count + 1)]
    return json.dumps({"ref": "refs/heads/main", "before": "0" * 40, "repository": {"name": "engine"},
                       "commits": [{"id": sha} for sha in shas], "head_commit": {"id": shas[-1]}}).encode()


def test_a_push_listing_40000_commits_records_the_head_and_its_parent(client, project, session):
    body = _long_push(40_000)
    assert len(body) < MAX_GITHUB_BODY
    reply = deliver_push(client, body, "long", signed(body))
    assert reply.status_code == 202, reply.text
    session.rollback()
    commits = {c.sha: c.parents for c in session.scalars(select(Commit))}
    assert commits == {f"{40_000:040x}": [f"{39_999:040x}"], f"{39_999:040x}": [f"{39_998:040x}"]}


def test_a_push_at_the_cap_records_every_commit(client, project, session):
    body = _long_push(MAX_PUSH_COMMITS + 1)  # the head and MAX_PUSH_COMMITS before it
    assert deliver_push(client, body, "capped", signed(body)).status_code == 202
    session.rollback()
    assert session.scalar(select(func.count()).select_from(Commit)) == MAX_PUSH_COMMITS + 1
    first = session.scalar(select(Commit).where(Commit.sha == f"{1:040x}"))
    assert first.parents == []  # "before" was all zeros: a new branch


def test_nothing_is_stored_for_a_refused_upload_of_a_model_named_like_a_path(client, project, session):
    reply = client.post("/api/v1/results", json={"project": "engine", "commit": {"sha": "c1"}, "results": [
        {"model": "..", "engine": "onnxruntime", "engine_version": "1", "level": "basic", "fusions": {}}]})
    assert reply.status_code == 422 and "body.results.0.model" in reply.json()["detail"]
    session.rollback()
    assert session.scalar(select(func.count()).select_from(Model)) == 1  # the uploaded relu.onnx only


def _multipart(payload: dict, model: bytes) -> tuple[bytes, str]:
    import httpx

    request = httpx.Request("POST", "http://x", data={"payload": json.dumps(payload)},
                            files=[("files", ("relu.onnx", model, "application/octet-stream"))])
    return request.read(), request.headers["content-type"]


def test_a_signed_multipart_upload_is_checked_from_its_spool_and_a_wrong_signature_stores_nothing(client, project,
                                                                                                  session):
    model = hostile_models.many_nodes(5).SerializeToString()
    body, content_type = _multipart({"project": "engine", "sha": "c" * 40}, model)
    headers = {"content-type": content_type}
    refused = client.post("/api/v1/webhooks/ci", content=body, headers={**headers, "X-Hub-Signature-256": signed(body, "wrong")})
    assert refused.status_code == 401 and "X-Hub-Signature-256 does not match" in refused.json()["detail"]
    assert _stored(session) == (0, 0, 0, 0, 0)
    accepted = client.post("/api/v1/webhooks/ci", content=body, headers={**headers, "X-Hub-Signature-256": signed(body)})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["models"] == ["relu.onnx"] and accepted.json()["jobs"] == 1
