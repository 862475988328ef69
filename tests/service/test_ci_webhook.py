"""A replayed CI delivery starts no second run (issue 12, Isolation): the CI hook's
X-Fusionwatch-Delivery id is remembered, as GitHub's X-GitHub-Delivery is."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from service.models import Job, Run

BERT = Path("tests/models/bert_torchscript_opset14.onnx")


def _project_with_a_model(client, name: str) -> None:
    client.post("/api/v1/projects", json={"name": name, "kind": "engine", "settings": {"levels": ["extended"]}}).raise_for_status()
    with BERT.open("rb") as handle:
        client.post(f"/api/v1/projects/{name}/models", files={"file": ("bert.onnx", handle)}).raise_for_status()


def _ci(client, project: str, sha: str, delivery: str | None = None):
    headers = {"X-Fusionwatch-Delivery": delivery} if delivery is not None else {}
    return client.post("/api/v1/webhooks/ci", json={"project": project, "sha": sha}, headers=headers)


def test_a_replayed_delivery_answers_with_the_first_run(client, session):
    _project_with_a_model(client, "bert")
    first = _ci(client, "bert", "a" * 40, "delivery-1")
    assert first.status_code == 202, first.text
    replay = _ci(client, "bert", "a" * 40, "delivery-1")
    assert replay.status_code == 202
    assert replay.json() == {"status": "duplicate", "run_id": first.json()["run_id"],
                             "run_url": first.json()["run_url"], "jobs": first.json()["jobs"], "models": ["bert.onnx"]}
    assert session.scalar(select(func.count()).select_from(Run)) == 1
    assert session.scalar(select(func.count()).select_from(Job)) == first.json()["jobs"] == 2

    # Without an id, or with a new one, a post is a new measurement of the commit.
    assert _ci(client, "bert", "a" * 40).json()["run_id"] != first.json()["run_id"]
    assert _ci(client, "bert", "a" * 40, "delivery-2").json()["run_id"] != first.json()["run_id"]
    session.rollback()  # a fresh snapshot: SQLite's read transaction still sees the first count
    assert session.scalar(select(func.count()).select_from(Run)) == 3


def test_a_delivery_id_is_one_projects_and_bounded(client, session):
    _project_with_a_model(client, "bert")
    _project_with_a_model(client, "gpt2")
    assert _ci(client, "bert", "a" * 40, "shared").status_code == 202
    clash = _ci(client, "gpt2", "a" * 40, "shared")
    assert clash.status_code == 409
    assert clash.json()["detail"] == "delivery id 'shared' was already used for another project"
    long = _ci(client, "bert", "b" * 40, "x" * 91)
    assert long.status_code == 422 and "X-Fusionwatch-Delivery is longer than 90" in long.json()["detail"]
    assert session.scalar(select(func.count()).select_from(Run)) == 1


def test_a_model_sent_under_another_field_name_is_refused_by_name(client, session):
    _project_with_a_model(client, "stray-field")
    with BERT.open("rb") as handle:
        reply = client.post(
            "/api/v1/webhooks/ci",
            data={"payload": '{"project": "stray-field", "sha": "c0ffee1"}'},
            files=[("file", ("bert.onnx", handle, "application/octet-stream"))],
        )
    assert reply.status_code == 422, reply.text
    assert "'file'" in reply.json()["detail"] and "'files'" in reply.json()["detail"]
    # Nothing was recorded for the commit: its run would have measured the older upload instead.
    assert session.scalar(select(func.count()).select_from(Run)) == 0
