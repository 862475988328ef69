"""Change points computed per window (service/domain/change_points.py): a window's result depends on its
values alone, so a new result recomputes the last windows only and never moves earlier points, and
reading the last N commits of a longer series finds the steps the whole series shows."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from sqlalchemy import select

from service.domain import change_points as cp
from service.domain.change_points import WindowResults, change_points
from service.models import ChangePointWindow


class CountingResults(WindowResults):
    def __init__(self) -> None:
        super().__init__()
        self.computed = 0

    def keep(self, values, seed, p_value, splits) -> None:
        self.computed += 1
        super().keep(values, seed, p_value, splits)


def stepped_series(n: int, steps: dict[int, float], seed: int = 3) -> np.ndarray:
    values = np.exp(np.random.default_rng(seed).normal(0, 0.03, n))
    for at, factor in steps.items():
        values[at:] *= factor
    return values


def test_steps_are_found_where_the_whole_pass_finds_them():
    values = stepped_series(1000, {300: 1.15, 640: 1 / 1.15, 641 + 200: 1.2})
    assert [p.index for p in change_points(values)] == [300, 640, 841]
    assert change_points(stepped_series(1000, {})) == []


def test_a_new_result_recomputes_the_last_windows_only_and_moves_no_earlier_point():
    values = stepped_series(1001, {300: 1.15, 640: 1 / 1.15})
    results = CountingResults()
    before = change_points(values[:1000], results=results)
    assert results.computed == len(cp._windows(0, 1000, cp.WINDOW, 0))
    results.computed = 0
    after = change_points(values, results=results)
    assert results.computed <= 2
    assert [(p.index, p.p_value) for p in after if p.index < 950] == [(p.index, p.p_value) for p in before if p.index < 950]
    # Without the kept windows the result is the same: keeping them changes the cost, not the answer.
    assert [(p.index, p.p_value) for p in change_points(values)] == [(p.index, p.p_value) for p in after]


def test_reading_the_last_commits_of_a_longer_series_places_windows_on_the_whole_series():
    values = stepped_series(1200, {300: 1.15, 1000: 1.2})
    results = CountingResults()
    whole = change_points(values, results=results)
    assert [p.index for p in whole] == [300, 1000]
    results.computed = 0
    tail = change_points(values[201:], first=201, results=results)
    assert [p.index + 201 for p in tail] == [300, 1000]
    assert results.computed == 1  # the window cut at the front; every other one is the whole series' own


def test_windows_cover_every_point_and_overlap_by_half():
    for first, n in ((0, 30), (0, 50), (0, 60), (0, 1000), (7, 993), (30, 10), (24, 1)):
        spans = cp._windows(first, n, 50, 0)
        covered = set()
        for start, stop, (_, position) in spans:
            assert 0 <= start < stop <= n and stop - start <= 50
            assert position % 25 == 0 or (start, stop) == (0, n)
            covered |= set(range(start, stop))
        assert covered == set(range(n)), (first, n)


def _post_result(client, values, i: int) -> None:
    document = {"project": "engine", "commit": {"sha": f"c{i}", "parents": [f"c{i - 1}"] if i else []},
                "results": [{"model": "bert.onnx", "engine": "fusionwatch", "engine_version": "1", "level": "all",
                             "fusions": {}, "execute_ms": [float(values[i])] * 5}]}
    client.post("/api/v1/results", json=document).raise_for_status()


def _forgetful_history(monkeypatch) -> CountingResults:
    """The history's window memory replaced by an empty one that counts computations, and its points
    forgotten (as a restarted process has neither)."""
    from service.usecases import history_points

    results = CountingResults()
    monkeypatch.setattr(history_points, "windows_seen", results)
    monkeypatch.setattr(history_points, "_kept", OrderedDict())
    return results


def _engine_series(client, values, count: int) -> None:
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    for i in range(count):
        _post_result(client, values, i)


def test_history_after_a_new_result_recomputes_the_last_windows(client, monkeypatch):
    results = _forgetful_history(monkeypatch)
    values = stepped_series(121, {60: 1.25})
    _engine_series(client, values, 120)
    [series] = client.get("/api/v1/projects/engine/history").json()["series"]
    assert [p["commit"] for p in series["change_points"]] == ["c60"]
    first = results.computed
    assert first == len(cp._windows(0, 120, cp.WINDOW, 0))
    _post_result(client, values, 120)
    [series] = client.get("/api/v1/projects/engine/history?limit=120").json()["series"]
    assert [p["commit"] for p in series["change_points"]] == ["c60"]
    assert series["points"][0]["commit"] == "c1"
    # The last 120 of 121 commits: the window cut at the front and the one at the end are new.
    assert results.computed - first <= 3


def _stored_positions(session) -> list[int]:
    """The position of each stored window (a row each), in order."""
    session.rollback()  # a fresh snapshot
    return sorted(session.scalars(select(ChangePointWindow.position)))


def test_a_process_that_forgot_its_windows_reads_them_from_the_database(client, session, monkeypatch):
    results = _forgetful_history(monkeypatch)
    values = stepped_series(100, {45: 1.25})
    _engine_series(client, values, 90)
    [series] = client.get("/api/v1/projects/engine/history").json()["series"]
    assert [p["commit"] for p in series["change_points"]] == ["c45"]
    assert results.computed == 3  # windows at 0, 25 and 50 (the last one 40 commits long so far)
    assert _stored_positions(session) == [0, 25, 50]

    # A restart, as far as the history goes: no windows in memory.
    results = _forgetful_history(monkeypatch)
    [again] = client.get("/api/v1/projects/engine/history").json()["series"]
    assert again["change_points"] == series["change_points"]
    assert results.computed == 0
    assert len(results) == 3  # read from the database, and kept in memory again

    # The last window fills up a result at a time, each version stored; once it is complete, the
    # versions it replaced are deleted.
    for i in range(90, 100):
        _post_result(client, values, i)
        client.get("/api/v1/projects/engine/history").raise_for_status()
    assert results.computed == 10
    assert _stored_positions(session) == [0, 25, 50]
