"""History reads keep their points and bring them up to date (service/usecases/history_points.py):
whatever happened in between, a read gives what reading everything afresh gives."""

from __future__ import annotations

import orjson
import pytest
from sqlalchemy import select

from service.models import KeptHistory
from service.usecases import history_points


def _result(client, sha: str, parents: list[str], ms: float, model: str = "bert.onnx", level: str = "all",
            commit: dict | None = None) -> None:
    document = {"project": "engine", "commit": {"sha": sha, "parents": parents} | (commit or {}),
                "results": [{"model": model, "engine": "fusionwatch", "engine_version": "1", "level": level,
                             "fusions": {"com.microsoft.BiasGelu": 2}, "execute_ms": [ms] * 5}]}
    client.post("/api/v1/results", json=document).raise_for_status()


@pytest.fixture
def engine_project(client):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    with open("tests/models/resnet_tiny_opset17.onnx", "rb") as model:  # CI hooks run the project's models
        client.post("/api/v1/projects/engine/models", files={"file": ("resnet.onnx", model)}).raise_for_status()
    for i in range(8):
        _result(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0 + i / 100)
    return client


@pytest.fixture
def full_reads(monkeypatch) -> list[int]:
    """One entry per read of everything (the kept points not brought up to date)."""
    reads: list[int] = []
    real = history_points._read_all
    monkeypatch.setattr(history_points, "_read_all", lambda *args: reads.append(1) or real(*args))
    return reads


def _read(client, query: str = "limit=6") -> dict:
    reply = client.get(f"/api/v1/projects/engine/history?{query}")
    assert reply.status_code == 200, reply.text
    return reply.json()


def _afresh(client, query: str = "limit=6") -> dict:
    history_points._kept.clear()
    return _read(client, query)


def _check(client, query: str = "limit=6") -> dict:
    kept = _read(client, query)
    assert kept == _afresh(client, query)
    return kept


def test_reads_follow_new_commits_remeasurements_and_new_series(engine_project, full_reads):
    client = engine_project
    _check(client)
    full_reads.clear()
    assert _read(client)["series"][0]["points"][-1]["commit"] == "c7"
    assert full_reads == []  # read again: kept
    _result(client, "c8", ["c7"], 1.5)
    read = _read(client)
    assert [p["commit"] for p in read["series"][0]["points"]] == [f"c{i}" for i in range(3, 9)]
    _result(client, "c8", ["c7"], 1.7)  # measured again: the point is replaced
    assert _read(client)["series"][0]["points"][-1]["p10_ms"] == pytest.approx(1.7)
    _result(client, "c9", ["c8"], 1.1, level="basic")  # a new series
    assert [s["level"] for s in _read(client)["series"]] == ["all", "basic"]
    assert full_reads == []  # each merged in, none read everything again
    _check(client)


def test_a_result_for_an_older_commit_and_a_commit_filled_in_later_are_read_again(engine_project):
    client = engine_project
    _check(client)
    _result(client, "c1", ["c0"], 3.0)  # older than the points shown: everything is read again
    assert _check(client)["series"][0]["points"][0]["commit"] == "c2"
    _result(client, "c4", ["c3"], 2.0)  # shown: measured again
    assert _check(client)["series"][0]["points"][2]["p10_ms"] == pytest.approx(2.0)
    # GitHub describes a commit CI reported without a message: the point shows it from the next read on.
    assert _read(client)["series"][0]["points"][-1]["message"] == ""
    hook = {"project": "engine", "sha": "c7", "branch": "main", "message": "Fuse Gelu again\n\nlong text"}
    client.post("/api/v1/webhooks/ci", json=hook).raise_for_status()
    assert _check(client)["series"][0]["points"][-1]["message"] == "Fuse Gelu again"


def test_new_commits_without_results_keep_the_points(engine_project, full_reads):
    client = engine_project
    _check(client)
    full_reads.clear()
    for i in range(3):
        client.post("/api/v1/webhooks/ci", json={"project": "engine", "sha": f"w{i}", "branch": "main"}).raise_for_status()
        _read(client)
    assert full_reads == []
    _check(client)


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


def test_points_read_from_kept_history_come_rendered_as_the_reply_carries_them(engine_project, session, full_reads):
    client = engine_project
    _result(client, "c8", ["c7"], 1.5, level="basic")  # two series, stored one after the other
    first = _read(client, "limit=5")
    history_points._kept.clear()  # a restart
    [key] = session.scalars(select(KeptHistory.key))
    kept = history_points._stored(session, key)
    for series, read in zip(kept.series, first["series"], strict=True):
        assert "items" not in series.points.__dict__  # not parsed: a reply splices the renderings in
        assert orjson.loads(series.points.rendered) == read["points"]
        assert series.shas == [p["commit"] for p in read["points"]] and series.p10s == [p["p10_ms"] for p in read["points"]]
    assert _read(client, "limit=5") == first
    # A new result merges into the points read back, the series it joined parsed and the other not.
    _result(client, "c9", ["c8"], 1.5, level="basic")
    history_points._kept.clear()
    full_reads.clear()
    after = _read(client, "limit=5")
    assert full_reads == []
    assert [p["commit"] for p in after["series"][1]["points"]] == ["c8", "c9"]
    assert after["series"][0] == first["series"][0]
