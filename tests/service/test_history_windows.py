"""Change-point windows computed when results arrive (service/usecases/history_windows.py): a first
history read finds every window but the newest five stored, and its change points are those
of the whole series computed from scratch, whatever order the results arrived in."""

from __future__ import annotations

import random
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from sqlalchemy import select

from service.domain.change_points import change_points
from service.models import ChangePointWindow, Commit
from service.usecases import history_points, history_windows
from service.usecases.commits import record_commit
from service.usecases.projects import get_project
from tests.service.jobs import drain
from tests.service.test_change_point_windows import CountingResults, stepped_series

N = 201  # windows at 0, 25, ..., 175 (the last 26 long so far), settled up to the one ending at 100


def _document(values, i: int, level: str = "all", machine_class: str = "cpu") -> dict:
    return {"project": "engine", "commit": {"sha": f"c{i}", "parents": [f"c{i - 1}"] if i else []},
            "machine": {"machine_class": machine_class},
            "results": [{"model": "bert.onnx", "engine": "fusionwatch", "engine_version": "1", "level": level,
                         "fusions": {}, "execute_ms": [float(values[i])] * 5}]}


def _post(client, values, i: int, **kwargs) -> None:
    client.post("/api/v1/results", json=_document(values, i, **kwargs)).raise_for_status()


def _restart(monkeypatch) -> CountingResults:
    """A restarted process, as far as the history goes (no windows or points in memory); its window
    memory counts what it computes."""
    results = CountingResults()
    monkeypatch.setattr(history_points, "windows_seen", results)
    monkeypatch.setattr(history_points, "_kept", OrderedDict())
    return results


def _stored(session) -> list[int]:
    session.rollback()  # a fresh snapshot
    return sorted(session.scalars(select(ChangePointWindow.position)))


def _from_scratch(series: dict) -> list[tuple[str, float]]:
    """The series' change points computed over its points afresh, no window kept anywhere."""
    points = series["points"]
    timed = [i for i, point in enumerate(points) if point["p10_ms"]]
    return [(points[timed[c.index]]["commit"], c.p_value) for c in change_points([points[i]["p10_ms"] for i in timed])]


def _read_afresh(client, monkeypatch) -> tuple[dict, CountingResults]:
    results = _restart(monkeypatch)
    reply = client.get(f"/api/v1/projects/engine/history?limit={N}")
    assert reply.status_code == 200, reply.text
    [series] = reply.json()["series"]
    assert [(c["commit"], c["p_value"]) for c in series["change_points"]] == _from_scratch(series)
    return series, results


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch) -> CountingResults:
    """This process's window memory, empty: the windows a test's values share with another test's were
    computed for another database."""
    results = CountingResults()
    monkeypatch.setattr(history_points, "windows_seen", results)
    monkeypatch.setattr(history_windows, "_arrivals", {})
    return results


@pytest.fixture
def engine(client):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    return client


def test_a_first_read_after_results_arrived_finds_the_settled_windows_stored(engine, session, monkeypatch):
    values = stepped_series(N, {60: 1.25})
    for i in range(N):
        _post(engine, values, i)
    assert _stored(session) == [0, 25, 50]  # the last whole window ending 100 commits or more before the newest
    series, results = _read_afresh(engine, monkeypatch)
    assert [c["commit"] for c in series["change_points"]] == ["c60"]
    assert results.computed == 5  # the windows at 75 to 150, ended 76 to 1 commits ago, and the one at 175
    assert _stored(session) == [0, 25, 50, 75, 100, 125, 150, 175]


def test_a_window_is_stored_at_the_first_pass_after_it_settled(engine, session):
    values = stepped_series(176, {})
    for i in range(150):
        _post(engine, values, i)
    # The window at 0 settled with the 150th result; the passes come with the 1st, 26th, ..., 151st...
    assert _stored(session) == []
    _post(engine, values, 150)
    assert _stored(session) == [0]
    for i in range(151, 176):
        _post(engine, values, i)
    assert _stored(session) == [0, 25]


def test_results_posted_concurrently_leave_the_same_windows_as_in_order(engine, session, monkeypatch):
    values = stepped_series(N, {70: 1.25})
    _post(engine, values, 0)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _post(engine, values, i), range(1, N)))
    # No window was taken while a result inside it was still in flight (a version no read asks for).
    assert _stored(session) == [0, 25, 50]
    series, results = _read_afresh(engine, monkeypatch)
    # Commits are numbered as their posts insert them: under load c71's post may overtake c70's, and
    # the step then shows at c71 in commit order. Whatever the order, the windows found stored must
    # give what the series computed afresh gives.
    assert [c["commit"] for c in series["change_points"]] == [commit for commit, _ in _from_scratch(series)]
    assert len(series["change_points"]) == 1  # the one step
    assert results.computed == 5


def test_results_arriving_out_of_order_give_the_change_points_of_the_whole_series(engine, session, monkeypatch):
    # The commits are known first (numbered in order), then measured in another order: within a few of
    # the newest (as results in flight together commit), and long after (a commit measured late).
    values = stepped_series(N, {40: 1.3, 95: 1 / 1.3})
    services = engine.app.state.services
    with services.session_factory() as writer, writer.begin():
        project = get_project(writer, "engine")
        for i in range(N):
            record_commit(writer, project, f"c{i}", "main", [f"c{i - 1}"] if i else [])
    order = list(range(N))
    shuffled = [i for block in range(0, N, 7) for i in random.Random(block).sample(order[block:block + 7], len(order[block:block + 7]))]
    late = shuffled.pop(shuffled.index(30))
    for i in [*shuffled, late]:
        _post(engine, values, i)
    with services.session_factory() as reader:
        assert [c for c in reader.scalars(select(Commit.sha).order_by(Commit.seq))] == [f"c{i}" for i in range(N)]
    series, results = _read_afresh(engine, monkeypatch)
    assert [c["commit"] for c in series["change_points"]] == ["c40", "c95"]
    # Commit 30, measured last, moved every later point by one: the windows stored meanwhile hold
    # values no read asks for. Its own result, the 201st, came with a pass, which took the windows
    # at 0, 25 and 50 again; the read computes the newest five.
    assert results.computed == 5
    # A commit measured again changes the windows holding it (at 75 and 100); the read finds the rest.
    _post(engine, np.full(N, 5.0), 110)
    series, results = _read_afresh(engine, monkeypatch)
    assert results.computed == 2


def test_each_series_a_post_joins_gets_its_windows(engine, session):
    values, basic = stepped_series(151, {}), stepped_series(151, {}, seed=4)
    for i in range(151):
        document = _document(values, i)
        document["results"].append(document["results"][0] | {"level": "basic", "execute_ms": [float(basic[i])] * 5})
        engine.post("/api/v1/results", json=document).raise_for_status()
    session.rollback()
    assert sorted(session.execute(select(ChangePointWindow.level, ChangePointWindow.position))) == [
        ("all", 0), ("basic", 0)]


def test_untimed_results_are_left_out_as_a_read_leaves_them_out(engine, session, monkeypatch):
    values = stepped_series(N, {50: 1.25})
    for i in range(N):
        document = _document(values, i)
        if i % 9 == 4:
            document["results"][0]["execute_ms"] = []  # no timing: no p10, no place among the windows
        engine.post("/api/v1/results", json=document).raise_for_status()
    # 179 timed points: the windows at 0 and 25 have settled (the one at 25 ends 104 points before the newest).
    assert _stored(session) == [0, 25]
    series, results = _read_afresh(engine, monkeypatch)
    assert [c["commit"] for c in series["change_points"]] == ["c50"]
    assert results.computed == 5


def test_the_worker_computes_the_windows_of_the_series_its_result_joins(client, session):
    settings = {"levels": ["basic"], "engines": ["fusionwatch"], "runs": 2, "warmup": 0}
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine", "settings": settings}).raise_for_status()
    with open("tests/models/resnet_tiny_opset17.onnx", "rb") as model:
        client.post("/api/v1/projects/engine/models", files={"file": ("bert.onnx", model)}).raise_for_status()
    values = stepped_series(150, {})
    for i in range(150):
        _post(client, values, i, level="basic")
    assert _stored(session) == []
    webhook = {"project": "engine", "sha": "c150", "branch": "main", "parents": ["c149"]}
    assert client.post("/api/v1/webhooks/ci", json=webhook).status_code == 202
    assert drain(client) == 1
    assert _stored(session) == [0]  # the worker's result is the 151st: a pass, and the window at 0 has settled
