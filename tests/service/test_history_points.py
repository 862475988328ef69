"""History points are rendered as results are stored (service/usecases/history_points.py): whatever
arrived in whatever order, a read gives each series' latest result at each of its last `limit`
commits, as the results and commits stored say, rendered here independently."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from service.adapters import migrate
from service.adapters.db import make_engine, make_session_factory
from service.models import Commit, Model, Result
from service.usecases import history_points
from service.usecases.commits import record_commit
from service.usecases.history_points import series_points
from service.usecases.projects import get_project
from service.usecases.results import Measurement, get_or_create_machine, record_result
from service.usecases.runs import record_only_run
from tests.service.db_fixtures import on_postgresql_only


def _result(client, sha: str, parents: list[str], ms: float, model: str = "bert.onnx", level: str = "all",
            commit: dict | None = None, samples: int = 5) -> None:
    document = {"project": "engine", "commit": {"sha": sha, "parents": parents} | (commit or {}),
                "results": [{"model": model, "engine": "fusionwatch", "engine_version": "1", "level": level,
                             "fusions": {"com.microsoft.BiasGelu": 2}, "execute_ms": [ms] * samples}]}
    client.post("/api/v1/results", json=document).raise_for_status()


@pytest.fixture
def engine_project(client):
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine"}).raise_for_status()
    with open("tests/models/resnet_tiny_opset17.onnx", "rb") as model:  # CI hooks run the project's models
        client.post("/api/v1/projects/engine/models", files={"file": ("resnet.onnx", model)}).raise_for_status()
    for i in range(8):
        _result(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0 + i / 100)
    return client


def _expected(session, limit: int) -> list[tuple[tuple, list[dict]]]:
    """Each series' points as the stored results and commits say, the series ordered by their oldest
    point shown: the oracle a read is compared with."""
    session.rollback()  # a fresh snapshot
    rows = session.execute(select(Result, Commit, Model.name).join(Commit, Commit.id == Result.commit_id)
                           .join(Model, Model.id == Result.model_id)).all()
    latest: dict[tuple, tuple] = {}
    for result, commit, name in rows:
        key = (name, result.engine, result.level, result.machine_class)
        if (key, commit.id) not in latest or latest[key, commit.id][0].id < result.id:
            latest[key, commit.id] = (result, commit)
    series: dict[tuple, list] = {}
    for (key, _), (result, commit) in latest.items():
        series.setdefault(key, []).append((commit.seq, result.id, _point(result, commit)))
    shown = [(key, sorted(points)[-limit:]) for key, points in series.items()]
    shown.sort(key=lambda entry: entry[1][0][:2])
    return [(key, [point for _, _, point in points]) for key, points in shown]


def _point(result: Result, commit: Commit) -> dict:
    return {
        "commit": commit.sha, "branch": commit.branch, "message": commit.message.split("\n")[0][:200],
        "timestamp": commit.timestamp.isoformat() if commit.timestamp else None, "result_id": result.id,
        "engine_version": result.engine_version, "graph_hash": result.graph_hash, "fusions": result.fusions,
        "nodes_after": result.nodes_after, "median_ms": result.median_ms, "p10_ms": result.p10_ms,
        "p90_ms": result.p90_ms, "mad_ms": result.mad_ms, "samples": len(result.execute_ms),
        "numeric_ok": result.numeric_ok,
    }


def _check(client, session, limit: int = 6) -> dict:
    reply = client.get(f"/api/v1/projects/engine/history?limit={limit}")
    assert reply.status_code == 200, reply.text
    read = reply.json()
    got = [((s["model"], s["engine"], s["level"], s["machine_class"]), s["points"]) for s in read["series"]]
    assert got == _expected(session, limit)
    return read


@pytest.fixture
def series_reads(monkeypatch) -> list[int]:
    """One entry per series read whole (not kept, nor brought up to date with the points written since)."""
    reads: list[int] = []
    real = history_points._read
    monkeypatch.setattr(history_points, "_read", lambda *args: reads.append(1) or real(*args))
    return reads


def test_reads_follow_new_commits_remeasurements_older_commits_and_new_series(engine_project, session, series_reads):
    client = engine_project
    assert [p["commit"] for p in _check(client, session)["series"][0]["points"]] == [f"c{i}" for i in range(2, 8)]
    assert len(series_reads) == 1
    _result(client, "c8", ["c7"], 1.5)
    assert [p["commit"] for p in _check(client, session)["series"][0]["points"]] == [f"c{i}" for i in range(3, 9)]
    _result(client, "c8", ["c7"], 1.7, samples=3)  # measured again: the point is replaced
    last = _check(client, session)["series"][0]["points"][-1]
    assert (last["p10_ms"], last["samples"]) == (pytest.approx(1.7), 3)
    _result(client, "c4", ["c3"], 2.0)  # an older commit shown, measured again
    assert _check(client, session)["series"][0]["points"][1]["p10_ms"] == pytest.approx(2.0)
    assert len(series_reads) == 1  # each merged into the points kept
    _result(client, "c1", ["c0"], 3.0)  # older than the points shown: they stay as they were
    assert _check(client, session)["series"][0]["points"][0]["commit"] == "c3"
    assert len(series_reads) == 2  # read again
    _result(client, "c9", ["c8"], 1.1, level="basic")  # a new series, after the first
    assert [s["level"] for s in _check(client, session)["series"]] == ["all", "basic"]
    _result(client, "x0", [], 1.1, model="gpt2.onnx")  # another model's series, after both
    assert [s["model"] for s in _check(client, session, limit=100)["series"]] == ["bert.onnx", "bert.onnx", "gpt2.onnx"]
    read = client.get("/api/v1/projects/engine/history?limit=100&model=gpt2.onnx").json()
    assert [s["model"] for s in read["series"]] == ["gpt2.onnx"]
    read = client.get("/api/v1/projects/engine/history?limit=100&level=basic").json()
    assert [(s["level"], [p["commit"] for p in s["points"]]) for s in read["series"]] == [("basic", ["c9"])]


def test_a_commit_described_after_its_results_shows_its_message_and_time(engine_project, session, series_reads):
    client = engine_project
    assert _check(client, session)["series"][0]["points"][-1]["message"] == ""
    hook = {"project": "engine", "sha": "c7", "branch": "main", "message": "Fuse Gelu again\n\nlong text",
            "timestamp": "2026-11-24T10:00:00+02:00"}
    client.post("/api/v1/webhooks/ci", json=hook).raise_for_status()
    last = _check(client, session)["series"][0]["points"][-1]
    assert (last["message"], last["timestamp"]) == ("Fuse Gelu again", "2026-11-24T08:00:00+00:00")
    assert len(series_reads) == 1  # the point rendered again, merged in
    # Described again, differently: a commit keeps what it had.
    client.post("/api/v1/webhooks/ci", json=hook | {"message": "Something else"}).raise_for_status()
    assert _check(client, session)["series"][0]["points"][-1]["message"] == "Fuse Gelu again"


def test_new_commits_without_results_change_no_point(engine_project, session):
    client = engine_project
    before = _check(client, session)
    for i in range(3):
        client.post("/api/v1/webhooks/ci", json={"project": "engine", "sha": f"w{i}", "branch": "main"}).raise_for_status()
    assert _check(client, session) == before


def test_an_unchanged_history_answers_304_to_its_etag(engine_project):
    client = engine_project
    first = client.get("/api/v1/projects/engine/history")
    etag = first.headers["etag"]
    again = client.get("/api/v1/projects/engine/history", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    _result(client, "c8", ["c7"], 1.5)
    changed = client.get("/api/v1/projects/engine/history", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.json()["series"][0]["points"][-1]["commit"] == "c8"


def test_the_migration_renders_the_stored_results_as_the_service_does(engine_project, session, migrated_database_url):
    client = engine_project
    described = {"message": "Fuse\nagain", "timestamp": "2026-11-24T10:00:00Z", "author": "a"}
    _result(client, "c8", ["c7"], 1.5, commit=described)
    _result(client, "c8", ["c7"], 1.6, level="basic")
    _result(client, "c5", ["c4"], 1.9)
    before = _check(client, session, limit=100)
    session.rollback()
    session.close()  # PostgreSQL: no transaction of the test's may hold the tables the migration drops
    migrate.downgrade("e8f3c6b1d592", migrated_database_url)  # before history_point
    migrate.upgrade(migrated_database_url)
    history_points._kept.clear()  # read afresh
    assert _check(client, session, limit=100) == before


@on_postgresql_only()
def test_a_commit_described_while_a_result_is_being_stored_at_it_shows_in_that_point(
    engine_project, migrated_database_url
):
    """PostgreSQL: the result's transaction reads the commit under a share lock, so the webhook's fill
    waits for it and renders its point again (without the lock, the point would keep the empty
    message it was rendered with). SQLite writes one transaction at a time."""
    engine = make_engine(migrated_database_url)
    factory = make_session_factory(engine)
    with factory() as reported, reported.begin():  # CI reported the commit without describing it
        record_commit(reported, get_project(reported, "engine"), "c8", parents=["c7"])

    def describe() -> None:
        with factory() as describing, describing.begin():
            record_commit(describing, get_project(describing, "engine"), "c8", message="Described meanwhile",
                          timestamp=datetime(2026, 11, 24, tzinfo=UTC))

    webhook = threading.Thread(target=describe)
    try:
        with factory() as storing:
            project = get_project(storing, "engine")
            commit = record_commit(storing, project, "c8", parents=["c7"])
            model = storing.scalar(select(Model).where(Model.project_id == project.id))
            run = record_only_run(storing, project, commit, "results")
            machine = get_or_create_machine(storing, {"machine_class": "cpu"})
            measurement = Measurement("fusionwatch", "1", "all", {}, execute_ms=[1.0] * 5)
            record_result(storing, run, model, measurement, machine)
            webhook.start()
            webhook.join(timeout=1.0)
            waited = webhook.is_alive()  # for the result's transaction
            storing.commit()
        webhook.join(timeout=10)
        assert waited and not webhook.is_alive()
    finally:
        webhook.join(timeout=10)
        engine.dispose()
    read = engine_project.get("/api/v1/projects/engine/history").json()
    assert read["series"][0]["points"][-1]["message"] == "Described meanwhile"


def test_a_series_cut_to_its_last_points_counts_the_timed_points_before_them(client, session):
    """Change-point windows are placed on the series' timed points from its first, when results arrive
    (usecases/history_windows.py) as when it is read cut: the read counts those it does not show."""
    client.post("/api/v1/projects", json={"name": "engine", "kind": "engine"}).raise_for_status()
    for i in range(10):
        _result(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0, samples=0 if i in (1, 3, 8) else 5)
    session.rollback()
    project = get_project(session, "engine")
    for limit, shown_timed in ((100, 7), (6, 5), (2, 1)):
        [series] = series_points(session, project, None, None, None, limit)
        assert (len(series.timed), series.timed_total) == (shown_timed, 7)


@on_postgresql_only()
def test_a_point_whose_version_commits_after_larger_ones_is_read(engine_project, session, migrated_database_url,
                                                                 series_reads):
    """PostgreSQL: a transaction takes its point's version before another that commits first; a read
    in between keeps the larger version, and the points written since it are then not all larger."""
    client = engine_project
    _check(client, session)
    engine = make_engine(migrated_database_url)
    try:
        with make_session_factory(engine)() as slow:
            project = get_project(slow, "engine")
            commit = record_commit(slow, project, "c8", parents=["c7"])
            model = slow.scalar(select(Model).where(Model.project_id == project.id))
            run = record_only_run(slow, project, commit, "results")
            machine = get_or_create_machine(slow, {"machine_class": "cpu"})
            record_result(slow, run, model, Measurement("fusionwatch", "1", "all", {}, execute_ms=[1.0] * 5), machine)
            _result(client, "c9", ["c8"], 1.5)  # its version is larger, and it commits first
            assert [p["commit"] for p in _check(client, session)["series"][0]["points"]][-2:] == ["c7", "c9"]
            slow.commit()
    finally:
        engine.dispose()
    reads = len(series_reads)
    assert {p["commit"] for p in _check(client, session)["series"][0]["points"][-3:]} == {"c7", "c8", "c9"}
    assert len(series_reads) == reads + 1  # the series' count and versions did not add up: read again
