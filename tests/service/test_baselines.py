"""The measured ancestors a result is compared with (service/usecases/baselines.py): nearest first,
breadth-first over parents (another branch's commits count), and a few statements whatever the
depth: POST /results walks 100 of them for its timing window."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select

from service.models import Commit, Result
from service.usecases.baselines import measured_ancestors


def _post(client, sha: str, parents: list[str], branch: str = "main") -> None:
    document = {
        "project": "engine", "commit": {"sha": sha, "parents": parents, "branch": branch},
        "results": [{"model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.20", "level": "extended",
                     "fusions": {}, "execute_ms": [1.0, 1.01, 0.99, 1.0, 1.02]}],
    }
    client.post("/api/v1/results", json=document).raise_for_status()


def _latest_result(session, sha: str) -> Result:
    session.rollback()  # a fresh snapshot
    return session.scalars(select(Result).join(Commit, Commit.id == Result.commit_id)
                           .where(Commit.sha == sha).order_by(Result.id.desc())).first()


def _shas(session, results: list[Result]) -> list[str]:
    return [session.get(Commit, result.commit_id).sha for result in results]


@pytest.fixture
def statements(session):
    ran: list[str] = []
    engine = session.get_bind()
    note = lambda _connection, _cursor, statement, *_args: ran.append(statement)  # noqa: E731
    event.listen(engine, "before_cursor_execute", note)
    yield ran
    event.remove(engine, "before_cursor_execute", note)


def test_ancestors_come_breadth_first_across_branches_nearest_first(client, session):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    # c0 - c1 - c2 ---- m      (main; m merges b2)
    #         \        /
    #          b1 - b2         (feature; b2 never measured, recorded by its merge only)
    _post(client, "c0", [])
    _post(client, "c1", ["c0"])
    _post(client, "b1", ["c1"], branch="feature")
    _post(client, "c2", ["c1"])
    _post(client, "b2", ["b1"], branch="feature")
    _post(client, "m", ["c2", "b2"])
    _post(client, "b2", ["b1"], branch="feature")  # b2 measured again: its latest result counts
    merge = _latest_result(session, "m")
    assert _shas(session, measured_ancestors(session, merge, limit=10)) == ["c2", "b2", "c1", "b1", "c0"]
    assert _shas(session, measured_ancestors(session, merge, limit=3)) == ["c2", "b2", "c1"]
    [b2] = [r for r in measured_ancestors(session, merge, limit=2) if r.commit_id != _latest_result(session, "c2").commit_id]
    assert b2.id == _latest_result(session, "b2").id


def test_a_long_history_is_walked_in_a_few_statements(client, session, statements):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    for i in range(130):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [])
    last = _latest_result(session, "c129")
    statements.clear()
    nearest = measured_ancestors(session, last, limit=100)
    walked = list(statements)
    assert _shas(session, nearest[:3]) == ["c128", "c127", "c126"] and len(nearest) == 100
    # The commit, the branch's commits read ahead, one batch of results (not two statements a generation).
    assert len(walked) <= 3, walked


def test_without_measured_ancestors_the_branch_order_stands_in_one_result_per_commit(client, session):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    for sha in ("a0", "a1", "a2", "a3", "a3", "a4", "a4", "a4", "a5"):  # parentless: CI named no parents
        _post(client, sha, [])
    last = _latest_result(session, "a5")
    for timings_only in (False, True):
        nearest = measured_ancestors(session, last, limit=3, timings_only=timings_only)
        assert _shas(session, nearest) == ["a4", "a3", "a2"]
        assert [r.id for r in nearest[:2]] == [_latest_result(session, "a4").id, _latest_result(session, "a3").id]
    assert _shas(session, measured_ancestors(session, last, limit=10)) == ["a4", "a3", "a2", "a1", "a0"]


def _post_at(client, sha: str, hour: int, model: str = "bert.onnx") -> None:
    document = {
        "project": "engine",
        "commit": {"sha": sha, "parents": [], "branch": "main", "timestamp": f"2026-11-20T{hour:02d}:00:00Z"},
        "results": [{"model": model, "engine": "onnxruntime", "engine_version": "1.20", "level": "extended",
                     "fusions": {}, "execute_ms": [1.0, 1.01, 0.99, 1.0, 1.02]}],
    }
    client.post("/api/v1/results", json=document).raise_for_status()


def test_the_branch_order_goes_by_time_and_pages_past_commits_the_series_skipped(client, session, statements):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    # Parentless commits, timed; t2 arrives before t1 and t1b (t1's time, arrived after it).
    _post_at(client, "t0", 0)
    _post_at(client, "t2", 2)
    _post_at(client, "t1", 1)
    _post_at(client, "t1b", 1)
    for i in range(40):  # another model's commits, later than all of those: pages with none of the series
        _post_at(client, f"g{i}", 3 + i % 20, model="gpt.onnx")
    _post_at(client, "last", 23)
    last = _latest_result(session, "last")
    statements.clear()
    nearest = measured_ancestors(session, last, limit=10)
    walked = list(statements)
    assert _shas(session, nearest) == ["t2", "t1b", "t1", "t0"]
    assert _shas(session, measured_ancestors(session, last, limit=3)) == ["t2", "t1b", "t1"]
    # The commit, the walk's read-ahead, then pages of two statements (its commits, their results),
    # doubling: 13, 26 and 52 commits cover the 44 earlier ones.
    assert len(walked) == 2 + 2 * 3, walked


def test_a_fully_measured_branch_fills_the_window_in_one_page(client, session, statements):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    for i in range(110):
        _post(client, f"a{i}", [])
    last = _latest_result(session, "a109")
    statements.clear()
    nearest = measured_ancestors(session, last, limit=100, timings_only=True)
    walked = list(statements)
    assert _shas(session, nearest[:2]) == ["a108", "a107"] and len(nearest) == 100
    # The commit, the walk's read-ahead, then one page of the branch and its results.
    assert len(walked) <= 4, walked
