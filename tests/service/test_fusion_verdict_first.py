"""Issue 28's "fusion verdict first": before any job of a run is timed, the worker counts every job's
fused ops, and GET /runs says the fusion verdict (regression with the lost op, or ok) while the run is
still running; once the jobs are done, the alerts speak for them."""

from __future__ import annotations

import json

from service.commands.count_run_fusions import count_run_fusions
from service.models import Job
from tests.service.jobs import drain

ERF = "tests/models/bert_torchscript_opset14.onnx"
SIGMOID = "tests/models/bert_quickgelu_torchscript_opset14.onnx"  # BiasGelu cannot fuse
SETTINGS = {"runs": 2, "warmup": 0, "levels": ["disabled", "extended"], "threads": 1, "sequence_length": 16}


def _post(client, sha, parents, path, project="bert"):
    payload = {"project": project, "sha": sha, "branch": "main", "parents": parents, "message": f"export {sha[:4]}"}
    files = [("files", ("bert.onnx", open(path, "rb").read(), "application/octet-stream"))]
    response = client.post("/api/v1/webhooks/ci", data={"payload": json.dumps(payload)}, files=files)
    assert response.status_code == 202, response.text
    return response.json()


def _counted(client, answer):
    """What the first worker to take a job of the run does before timing it."""
    assert count_run_fusions(client.app.state.services, answer["run_id"]) == answer["jobs"] == 4
    return client.get(answer["run_url"]).json()


def test_the_fusion_verdict_is_known_before_any_job_is_timed(client):
    assert client.post("/api/v1/projects", json={"name": "bert", "settings": SETTINGS}).status_code == 201
    a, b, c = "a" * 40, "b" * 40, "c" * 40

    first = _counted(client, _post(client, a, [], ERF))
    assert first["state"] == "running" and first["jobs_done"] == 0
    assert first["fusions"] == {"done": True, "verdict": "ok", "lost": []}  # nothing to compare with yet
    assert drain(client) == 4

    run = _counted(client, _post(client, b, [a], SIGMOID))
    assert run["state"] == "running" and run["jobs_done"] == 0 and run["verdict"] == "running"
    assert run["fusions"]["done"] and run["fusions"]["verdict"] == "regression"
    lost = sorted((e["engine"], e["level"], e["op"], e["before"], e["after"], e["pending"]) for e in run["fusions"]["lost"])
    assert lost == [("fusionwatch", "extended", "com.microsoft.BiasGelu", 2, 0, True),
                    ("onnxruntime", "extended", "com.microsoft.BiasGelu", 2, 0, True)]

    assert drain(client, limit=2) == 2  # our engine's jobs timed: its alert speaks for it, counts for the rest
    run = client.get(f"/api/v1/runs/{run['id']}").json()
    assert run["verdict"] == "regression" and run["fusions"]["verdict"] == "regression"
    assert sorted(e["pending"] for e in run["fusions"]["lost"]) == [False, True]

    assert drain(client) == 2
    run = client.get(f"/api/v1/runs/{run['id']}").json()
    assert run["state"] == "done" and run["verdict"] == "regression"
    assert [e["pending"] for e in run["fusions"]["lost"]] == [False, False]
    assert {e["engine"] for e in run["fusions"]["lost"]} == {"fusionwatch", "onnxruntime"}

    fixed = _counted(client, _post(client, c, [b], ERF))
    assert fixed["fusions"] == {"done": True, "verdict": "ok", "lost": []}  # BiasGelu back: a rise, no loss
    assert drain(client) == 4
    assert client.get(f"/api/v1/runs/{fixed['id']}").json()["verdict"] == "ok"


def test_the_first_job_counts_the_run_and_a_run_of_one_job_is_not_counted(client):
    settings = SETTINGS | {"levels": ["extended"]}
    assert client.post("/api/v1/projects", json={"name": "bert", "settings": settings}).status_code == 201
    answer = _post(client, "d" * 40, [], ERF)
    assert drain(client, limit=1) == 1
    with client.app.state.services.session_factory() as session:
        jobs = session.query(Job).filter(Job.run_id == answer["run_id"]).order_by(Job.id).all()
        assert [job.state for job in jobs] == ["done", "queued"]
        assert all(job.counts["fusions"].get("com.microsoft.BiasGelu") == 2 for job in jobs)
        assert {job.counts["engine_version"] for job in jobs} and all(len(job.counts["fingerprint"]) == 64 for job in jobs)
    assert drain(client) == 1

    solo = {"name": "solo", "settings": settings | {"engines": ["fusionwatch"]}}
    assert client.post("/api/v1/projects", json=solo).status_code == 201
    one = _post(client, "e" * 40, [], ERF, project="solo")
    assert one["jobs"] == 1
    assert count_run_fusions(client.app.state.services, one["run_id"]) == 0  # its result is its verdict
    assert client.get(one["run_url"]).json()["fusions"] == {"done": False, "verdict": "running", "lost": []}
    assert drain(client) == 1
    assert client.get(one["run_url"]).json()["fusions"] == {"done": True, "verdict": "ok", "lost": []}


def test_a_commit_pushed_while_another_is_timed_has_its_verdict_after_one_job(client):
    assert client.post("/api/v1/projects", json={"name": "bert", "settings": SETTINGS}).status_code == 201
    a, b = "a" * 40, "b" * 40
    _post(client, a, [], ERF)
    assert drain(client) == 4
    _post(client, a[:39] + "1", [a], ERF)
    later = _post(client, b, [a], SIGMOID)
    assert client.get(later["run_url"]).json()["fusions"]["done"] is False
    assert drain(client, limit=1) == 1  # one job of the earlier commit: the later one is counted first
    run = client.get(later["run_url"]).json()
    assert run["jobs_done"] == 0 and run["fusions"]["done"] and run["fusions"]["verdict"] == "regression"
    assert {e["op"] for e in run["fusions"]["lost"]} == {"com.microsoft.BiasGelu"}
