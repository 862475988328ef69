"""Done-when 3 of the service issue: a GitHub push delivery with a good signature starts one run; a replay of
the same delivery id starts none; a bad or missing signature gets 401 and writes nothing."""

from __future__ import annotations

import json

from sqlalchemy import func, select

from service.models import Commit, Job, Run, WebhookDelivery
from tests import hostile_models
from tests.service.github_deliveries import SECRET, deliver_push, push_body, signed


def _counts(session):
    session.rollback()  # a fresh snapshot
    return tuple(session.scalar(select(func.count()).select_from(t)) for t in (Run, Job, Commit, WebhookDelivery))


def test_signed_push_starts_one_run_and_a_replay_none(client, session):
    settings = {"levels": ["basic"], "engines": ["fusionwatch", "onnxruntime"]}
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine", "webhook_secret": SECRET, "settings": settings}).raise_for_status()
    model = hostile_models.many_nodes(3).SerializeToString()
    client.post("/api/v1/projects/engine/models", files={"file": ("relu.onnx", model)}).raise_for_status()
    assert _counts(session) == (0, 0, 0, 0)

    body = push_body("f" * 40, "e" * 40, ["d" * 40, "f" * 40])
    accepted = deliver_push(client, body, "delivery-1", signed(body))
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["jobs"] == 2  # the registered model × two engines × one level
    assert _counts(session) == (1, 2, 2, 1)
    head = session.scalar(select(Commit).where(Commit.sha == "f" * 40))
    assert head.parents == ["d" * 40] and head.author == "Ada" and head.branch == "main"

    replay = deliver_push(client, body, "delivery-1", signed(body))
    assert replay.status_code == 202 and replay.json()["status"] == "duplicate"
    assert _counts(session) == (1, 2, 2, 1)


def test_bad_or_missing_signature_is_401_and_writes_nothing(client, session):
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine", "webhook_secret": SECRET}).raise_for_status()
    body = push_body("a" * 40, "0" * 40, ["a" * 40])
    for signature in (signed(body, "wrong"), None, "sha256=" + "0" * 64, signed(body + b" ")):
        reply = deliver_push(client, body, "delivery-2", signature)
        assert reply.status_code == 401, reply.text
        assert "X-Hub-Signature-256" in reply.json()["detail"]
    assert _counts(session) == (0, 0, 0, 0)


def test_malformed_pushes_are_4xx_naming_the_problem(client):
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine"}).raise_for_status()
    reply = deliver_push(client, b"{not json", "d3", None)
    assert reply.status_code == 422 and "not JSON" in reply.json()["detail"]
    reply = deliver_push(client, json.dumps({"repository": {"full_name": "nobody/x", "name": "x"}}).encode(), "d4", None)
    assert reply.status_code == 404 and "no project named 'x'" in reply.json()["detail"]
    body = push_body("b" * 40, "0" * 40, ["b" * 40])
    reply = deliver_push(client, body, "d5", None)
    assert reply.status_code == 422 and "no uploaded models" in reply.json()["detail"]


def test_a_commit_ci_reported_first_keeps_its_place_and_gains_what_github_says(client, session):
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine", "webhook_secret": SECRET}).raise_for_status()
    model = hostile_models.many_nodes(3).SerializeToString()
    client.post("/api/v1/projects/engine/models", files={"file": ("relu.onnx", model)}).raise_for_status()
    for sha in ("d" * 40, "c" * 40):  # the commit, then another after it
        body = json.dumps({"project": "engine", "sha": sha}).encode()
        ci = client.post("/api/v1/webhooks/ci", content=body,
                         headers={"X-Hub-Signature-256": signed(body), "Content-Type": "application/json"})
        assert ci.status_code == 202, ci.text
    session.rollback()
    first = session.scalar(select(Commit).where(Commit.sha == "d" * 40))
    assert (first.message, first.author, first.parents) == ("", "", [])
    seq = first.seq

    body = push_body("d" * 40, "e" * 40, [])
    assert deliver_push(client, body, "delivery-1", signed(body)).status_code == 202
    session.rollback()
    again = session.scalar(select(Commit).where(Commit.sha == "d" * 40))
    assert (again.id, again.seq) == (first.id, seq)  # the same row, its arrival order unchanged
    assert (again.message, again.author, again.parents) == (f"change {'d' * 6}", "Ada", ["e" * 40])
    assert session.scalar(select(func.count()).select_from(Commit)) == 2
