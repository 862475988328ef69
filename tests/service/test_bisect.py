"""Bisect: GET /alerts/{id}/bisect names the next commit to measure when an alert spans unmeasured
commits, and `fusionwatch bisect` drives it to the culprit (exact for fusions, statistical for timings)."""

from __future__ import annotations

import pytest

from service.cli_bisect import BisectError, drive, run_step
from service.usecases.commits import record_commit
from service.usecases.projects import get_project

GOOD = {"com.microsoft.BiasGelu": 2, "com.microsoft.SkipLayerNormalization": 4}
BROKEN = {"com.microsoft.SkipLayerNormalization": 4}
SHAPE = [1.0 + 0.02 * ((i * 7) % 11 - 5) / 5 for i in range(30)]
CULPRIT = 6  # c6 broke it: c1..c5 good, c6..c9 bad


def _post(client, sha, parents, fusions, level=1.0):
    document = {
        "project": "engine", "commit": {"sha": sha, "parents": parents},
        "machine": {"machine_class": "cpu", "cpu": "test cpu", "cores": 2},
        "results": [{"model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.20", "level": "extended",
                     "fusions": fusions, "execute_ms": [level * s for s in SHAPE]}],
    }
    reply = client.post("/api/v1/results", json=document)
    assert reply.status_code == 201, reply.text
    return reply.json()


def _measure(client, timing: bool = False):
    """What --cmd does for commit c<i>: measure it and post the result (here: the truth for that commit)."""
    measured = []

    def measure(sha: str) -> None:
        i = int(sha[1:])
        bad = i >= CULPRIT
        fusions = GOOD if timing or not bad else BROKEN
        _post(client, sha, [f"c{i - 1}"], fusions, 1.3 if timing and bad else 1.0)
        measured.append(sha)

    return measure, measured


@pytest.fixture
def gap(client, session):
    """c0 measured; c1..c9 recorded (a GitHub push lists every commit) but never measured."""
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    _post(client, "c0", [], GOOD)
    project = get_project(session, "engine")
    for i in range(1, 10):
        record_commit(session, project, f"c{i}", "main", [f"c{i - 1}"])
    session.commit()


def test_an_alert_spanning_unmeasured_commits_names_the_middle_one(client, gap):
    [alert] = _post(client, "c10", ["c9"], BROKEN)["alerts"]
    assert (alert["commit"], alert["baseline_commit"]) == ("c10", "c0")
    step = client.get(f"/api/v1/alerts/{alert['id']}/bisect").json()
    assert [c["commit"] for c in step["commits"]] == [f"c{i}" for i in range(1, 10)]
    assert (step["next"], step["culprit"], step["remaining"], step["kind"]) == ("c5", None, 9, "fusion")
    measure, _ = _measure(client)
    measure("c5")  # good: the regression is later
    assert client.get(f"/api/v1/alerts/{alert['id']}/bisect").json()["next"] == "c7"
    measure("c7")  # bad
    step = client.get(f"/api/v1/alerts/{alert['id']}/bisect").json()
    assert step["next"] == "c6" and [c["verdict"] for c in step["commits"]][4:7] == ["good", None, "bad"]
    measure("c6")
    step = client.get(f"/api/v1/alerts/{alert['id']}/bisect").json()
    assert (step["next"], step["culprit"]) == (None, "c6")
    assert client.get("/api/v1/alerts/999/bisect").status_code == 404


def test_the_client_drives_a_fusion_bisect_to_the_culprit_in_log2_steps(client, gap):
    _post(client, "c10", ["c9"], BROKEN)
    measure, measured = _measure(client)
    culprit = drive(client, "engine", {"good": "c0", "bad": "c10"}, measure)
    assert culprit == "c6" and len(measured) <= 4 and "c6" in measured


def test_the_client_drives_a_timing_bisect_with_the_commits_it_names(client):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    _post(client, "c0", [], GOOD)
    _post(client, "c10", ["c9"], GOOD, 1.3)  # the server never heard of c1..c9: the client lists them
    measure, measured = _measure(client, timing=True)
    request = {"good": "c0", "bad": "c10", "model": "bert.onnx", "kind": "timing",
               "commits": [f"c{i}" for i in range(1, 10)]}
    assert drive(client, "engine", request, measure) == "c6"
    assert len(measured) <= 4
    reply = client.post("/api/v1/projects/engine/bisect", json={"good": "c0", "bad": "c10"})
    assert reply.status_code == 422 and "pass the commits between" in reply.json()["detail"]


def test_a_command_that_posts_nothing_or_fails_stops_the_client(client, gap, tmp_path):
    _post(client, "c10", ["c9"], BROKEN)
    with pytest.raises(BisectError, match="has no result for it"):
        drive(client, "engine", {"good": "c0", "bad": "c10"}, lambda sha: None)
    log = tmp_path / "log"
    run_step(f"echo {{commit}} $FUSIONWATCH_BISECT_COMMIT >> {log}", "c5")
    assert log.read_text() == "c5 c5\n"
    with pytest.raises(BisectError, match="exit status 3"):
        run_step("exit 3", "c5")
