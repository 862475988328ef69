"""The points of a history read: each series' latest result at each of its last `limit` commits.

A point is rendered once, when its result is stored (`record_point`), into history_point
(service/models/history_point.py) beside its series, commit and p10; a commit that gains a message or
a timestamp has its points rendered again (`render_commit_again`). A read is then one aggregate over
the project's series and, per series, one range of one index, newest first, whose points' JSON is
spliced into the reply as stored: nothing is found, joined, rendered or parsed per point.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC
from functools import cached_property
from typing import Any

import orjson
from sqlalchemy import Insert, bindparam, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.alerts.change_points import ChangePoint, WindowResults, change_points
from service.models import Commit, HistoryPoint, Model, Project, Result
from service.usecases.change_point_windows import Series, SeriesWindows

SeriesKey = tuple[str, str, str, str]  # model name, engine, level, machine class


# Change points are computed per window of the series and each window's result kept, here and in
# the database (service/alerts/change_points.py, usecases/change_point_windows.py): a read after a new
# result recomputes the last window or two, not E-divisive's permutation tests over all 10,000
# commits, and a restarted process reads the windows instead of computing them.
windows_seen = WindowResults()


def series_windows(session: Session, model_id: int, key: SeriesKey) -> SeriesWindows:
    """What `SeriesPoints.change_points` asks for the series `key` (of model `model_id`) and tells
    about the windows it computes (`store_computed` writes them)."""
    _, engine, level, machine_class = key
    return SeriesWindows(session, windows_seen, Series(model_id, engine, level, machine_class))


def render_point(result: Result, commit: Any) -> str:
    """The JSON a history reply shows for `result` at `commit` (a Commit, or a row with its sha,
    branch, message and timestamp)."""
    message = commit.message
    return orjson.dumps({
        "commit": commit.sha,
        "branch": commit.branch,
        # The first line's first 200 characters, without splitting a 10,000-character message whole.
        "message": message[:201].splitlines()[0][:200] if message else "",
        "timestamp": commit.timestamp.astimezone(UTC).isoformat() if commit.timestamp else None,  # as stored
        "result_id": result.id,
        "engine_version": result.engine_version,
        "graph_hash": result.graph_hash,
        "fusions": result.fusions,
        "nodes_after": result.nodes_after,
        "median_ms": result.median_ms,
        "p10_ms": result.p10_ms,
        "p90_ms": result.p90_ms,
        "mad_ms": result.mad_ms,
        "samples": len(result.execute_ms or ()),
        "numeric_ok": result.numeric_ok,
    }).decode()


# The commit's row is read under a share lock: a webhook filling the commit in (its UPDATE) waits for
# this transaction and then renders its points again, this one among them; or this waits for the
# webhook's and renders the commit as filled in. (SQLite writes one transaction at a time.)
_COMMIT_FOR_POINT = (
    select(Commit.sha, Commit.branch, Commit.message, Commit.timestamp, Commit.seq)
    .where(Commit.id == bindparam("id")).with_for_update(read=True)
)
_SERIES_COLUMNS = ("model_id", "engine", "level", "machine_class", "commit_id")


def _upsert(dialect_insert) -> Insert:
    insert = dialect_insert(HistoryPoint.__table__)
    table = HistoryPoint.__table__
    return insert.on_conflict_do_update(
        index_elements=list(_SERIES_COLUMNS),
        set_={"result_id": insert.excluded.result_id, "p10_ms": insert.excluded.p10_ms, "point": insert.excluded.point},
        where=insert.excluded.result_id > table.c.result_id,  # a later measurement of the commit replaces it
    )


_UPSERT = {"postgresql": _upsert(postgresql.insert), "sqlite": _upsert(sqlite.insert)}


def record_point(session: Session, result: Result) -> None:
    """Make the stored `result` its series' point at its commit, unless a later result is; in the
    caller's transaction."""
    commit = session.execute(_COMMIT_FOR_POINT, {"id": result.commit_id}).one()
    connection = session.connection()
    connection.execute(_UPSERT[connection.dialect.name], {
        "model_id": result.model_id, "engine": result.engine, "level": result.level,
        "machine_class": result.machine_class, "commit_id": result.commit_id, "project_id": result.project_id,
        "commit_seq": commit.seq, "sha": commit.sha, "result_id": result.id, "p10_ms": result.p10_ms,
        "point": render_point(result, commit),
    })  # fmt: skip


def render_commit_again(session: Session, commit: Commit) -> None:
    """Render `commit`'s points again, once it gained a message or a timestamp (its change is flushed
    first, which on PostgreSQL waits for results being stored at it: see _COMMIT_FOR_POINT)."""
    session.flush()
    results = session.scalars(
        select(Result).join(HistoryPoint, HistoryPoint.result_id == Result.id).where(HistoryPoint.commit_id == commit.id)
    ).all()
    for result in results:
        session.execute(update(HistoryPoint).where(HistoryPoint.result_id == result.id)
                        .values(point=render_point(result, commit)))


class Points:
    """A series' points, oldest first, each as its JSON; `rendered`, the list a reply carries."""

    def __init__(self, fragments: list[str]) -> None:
        self.fragments = fragments

    @cached_property
    def rendered(self) -> bytes:
        return ("[" + ",".join(self.fragments) + "]").encode()

    @cached_property
    def digest(self) -> str:
        return hashlib.sha1(self.rendered, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class SeriesPoints:
    """A series' points with what a read uses of them beside them, so that it never parses the points:
    each point's commit seq, commit, p10 and result."""

    key: SeriesKey
    model_id: int
    points: Points
    seqs: list[int]
    shas: list[str]
    p10s: list[float | None]
    result_ids: list[int]
    timed_total: int  # points with a p10 in the whole series, of which `points` show the last

    @cached_property
    def timed(self) -> list[int]:
        """The points with a p10, by index."""
        return [i for i, p10 in enumerate(self.p10s) if p10]

    @cached_property
    def positions(self) -> dict[str, int]:
        """Each point's index, by its commit."""
        return {sha: i for i, sha in enumerate(self.shas)}

    def change_points(self, windows: SeriesWindows) -> list[ChangePoint]:
        """E-divisive means over the timed points' p10 (indices into `timed`), windows placed on the
        series' timed points from its first (as history_windows.py places them when results arrive)."""
        if len(self.timed) < 6:
            return []
        values = [self.p10s[i] for i in self.timed]
        return change_points(values, first=self.timed_total - len(values), results=windows)


_POINTS = (
    select(HistoryPoint.commit_seq, HistoryPoint.sha, HistoryPoint.p10_ms, HistoryPoint.result_id, HistoryPoint.point)
    .where(HistoryPoint.project_id == bindparam("project_id"), HistoryPoint.model_id == bindparam("model_id"),
           HistoryPoint.engine == bindparam("engine"), HistoryPoint.level == bindparam("level"),
           HistoryPoint.machine_class == bindparam("machine_class"))
    .order_by(HistoryPoint.commit_seq.desc(), HistoryPoint.result_id.desc())
    .limit(bindparam("limit"))
)
_TIMED_BEFORE = (
    select(func.count())
    .where(*_POINTS.whereclause.clauses, HistoryPoint.p10_ms != 0,
           tuple_(HistoryPoint.commit_seq, HistoryPoint.result_id) < tuple_(bindparam("seq"), bindparam("result_id")))
)


def series_points(
    session: Session, project: Project, model: Model | None, engine: str | None, level: str | None, limit: int,
) -> list[SeriesPoints]:
    """Each series' last `limit` points, the series ordered by their oldest point shown."""
    filters = [HistoryPoint.project_id == project.id]
    if model is not None:
        filters.append(HistoryPoint.model_id == model.id)
    if engine is not None:
        filters.append(HistoryPoint.engine == engine)
    if level is not None:
        filters.append(HistoryPoint.level == level)
    series_key = (HistoryPoint.model_id, HistoryPoint.engine, HistoryPoint.level, HistoryPoint.machine_class)
    connection = session.connection()  # Core rows: the ORM's processing of 10,000 rows is time for nothing
    found = []
    for name, model_id, engine_name, level_name, machine_class, total in connection.execute(
        select(Model.name, *series_key, func.count())  # from the series index alone
        .join(Model, Model.id == HistoryPoint.model_id).where(*filters).group_by(Model.name, *series_key)
    ):
        series = {"project_id": project.id, "model_id": model_id, "engine": engine_name, "level": level_name,
                  "machine_class": machine_class}
        rows = connection.execute(_POINTS, series | {"limit": limit}).all()
        rows.reverse()
        seqs, shas, p10s, result_ids, fragments = (list(column) for column in zip(*rows, strict=True))
        timed_total = sum(1 for p10 in p10s if p10)
        if total > len(rows):  # and the timed points before those shown
            timed_total += connection.execute(_TIMED_BEFORE, series | {"seq": seqs[0], "result_id": result_ids[0]}).scalar_one()
        found.append(SeriesPoints((name, engine_name, level_name, machine_class), model_id, Points(fragments),
                                  seqs, shas, p10s, result_ids, timed_total))
    return sorted(found, key=lambda s: (s.seqs[0], s.result_ids[0]))
