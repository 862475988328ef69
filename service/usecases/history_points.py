"""The points of a history read: each series' latest result at each of its last `limit` commits.

A point is rendered once, when its result is stored (`record_point`), into history_point
(service/models/history_point.py) beside its series, commit and p10; a commit that gains a message or
a timestamp has its points rendered again (`render_commit_again`). A read is then one aggregate over
the project's series and, per series, one range of one index, newest first, whose points' JSON is
spliced into the reply as stored: nothing is found, joined, rendered or parsed per point.

Every write of a point gives it a new version, larger than all before it, so the aggregate's count and
sum of versions per series tell a read whether the series changed since this process read it: if not,
its points are used as they were (rendered, hashed, change points found); if so, the points written
since are read and merged in, and the series is read again only when they do not add up.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC
from functools import cached_property
from typing import Any

import orjson
from sqlalchemy import Insert, bindparam, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from service.domain.change_points import ChangePoint, WindowResults, change_points
from service.models import Commit, HistoryPoint, Model, Project, Result
from service.models.history_point import VERSIONS
from service.usecases.change_point_windows import Series, SeriesWindows

SeriesKey = tuple[str, str, str, str]  # model name, engine, level, machine class


# Change points are computed per window of the series and each window's result kept, here and in
# the database (service/domain/change_points.py, usecases/change_point_windows.py): a read after a new
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


def _next_version(dialect_name: str):
    if dialect_name == "postgresql":
        return VERSIONS.next_value()
    return select(func.coalesce(func.max(HistoryPoint.version), 0) + 1).scalar_subquery()


def _upsert(dialect_insert, dialect_name: str) -> Insert:
    insert = dialect_insert(HistoryPoint.__table__).values(version=_next_version(dialect_name))
    table = HistoryPoint.__table__
    return insert.on_conflict_do_update(
        index_elements=list(_SERIES_COLUMNS),
        set_={"result_id": insert.excluded.result_id, "p10_ms": insert.excluded.p10_ms, "point": insert.excluded.point,
              "version": _next_version(dialect_name)},
        where=insert.excluded.result_id > table.c.result_id,  # a later measurement of the commit replaces it
    )


_UPSERT = {"postgresql": _upsert(postgresql.insert, "postgresql"), "sqlite": _upsert(sqlite.insert, "sqlite")}


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
    next_version = _next_version(session.get_bind().dialect.name)
    for result in results:
        session.execute(update(HistoryPoint).where(HistoryPoint.result_id == result.id)
                        .values(point=render_point(result, commit), version=next_version))


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
    """A series' last points with what a read uses of them beside them, so that it never parses the
    points: each point's commit seq, commit, p10, result and version; and what the whole series was
    when they were read: its count and sum of versions (history_point.version), and its timed points."""

    key: SeriesKey
    model_id: int
    points: Points
    seqs: list[int]
    shas: list[str]
    p10s: list[float | None]
    result_ids: list[int]
    versions: list[int]
    count: int
    versions_sum: int
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
        series' timed points from its first (as history_windows.py places them when results arrive);
        worked out once, `windows` asked for each window's result the first time."""
        found = self.__dict__.get("_change_points")
        if found is None:
            found = []
            if len(self.timed) >= 6:
                values = [self.p10s[i] for i in self.timed]
                found = change_points(values, first=self.timed_total - len(values), results=windows)
            self.__dict__["_change_points"] = found  # frozen, as cached_property writes it
        return found


# One series' points, by the series' key as bound parameters (history_windows.py reads them too).
SERIES = (HistoryPoint.project_id == bindparam("project_id"), HistoryPoint.model_id == bindparam("model_id"),
           HistoryPoint.engine == bindparam("engine"), HistoryPoint.level == bindparam("level"),
           HistoryPoint.machine_class == bindparam("machine_class"))
_POINT_COLUMNS = (HistoryPoint.commit_seq, HistoryPoint.sha, HistoryPoint.p10_ms, HistoryPoint.result_id,
                  HistoryPoint.version, HistoryPoint.point)
_LAST_POINTS = (
    select(*_POINT_COLUMNS).where(*SERIES)
    .order_by(HistoryPoint.commit_seq.desc(), HistoryPoint.result_id.desc()).limit(bindparam("limit"))
)
_TIMED_BEFORE = select(func.count()).where(
    *SERIES, HistoryPoint.p10_ms != 0,
    tuple_(HistoryPoint.commit_seq, HistoryPoint.result_id) < tuple_(bindparam("seq"), bindparam("result_id")))
_WRITTEN_SINCE = (
    select(*_POINT_COLUMNS).where(*SERIES, HistoryPoint.version > bindparam("version"))
    .order_by(HistoryPoint.commit_seq, HistoryPoint.result_id)
)

# Each series' points as read last, per database, project, series and limit: a read whose series'
# count and sum of versions are unchanged uses them as they are (rendered, hashed, change points
# found); one whose series changed reads the points written since and merges them in.
KEPT_SERIES = 64  # a 10,000-point series is ~5 MB
_kept: OrderedDict[tuple, SeriesPoints] = OrderedDict()
_kept_lock = threading.Lock()


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
    url = str(connection.engine.url)
    found = []
    for name, model_id, engine_name, level_name, machine_class, count, versions_sum in connection.execute(
        select(Model.name, *series_key, func.count(), func.sum(HistoryPoint.version))  # the series index alone
        .join(Model, Model.id == HistoryPoint.model_id).where(*filters).group_by(Model.name, *series_key)
    ):
        key = (name, engine_name, level_name, machine_class)
        series = {"project_id": project.id, "model_id": model_id, "engine": engine_name, "level": level_name,
                  "machine_class": machine_class}
        kept_key = (url, *series.values(), limit)
        with _kept_lock:
            kept = _kept.get(kept_key)
        now = (count, int(versions_sum))
        if kept is None or (kept.count, kept.versions_sum) != now:
            fresh = kept and _merged(connection, kept, series, now, limit)
            if fresh is None:
                fresh = _read(connection, key, series, now, limit)
            with _kept_lock:
                _kept[kept_key] = kept = fresh
                _kept.move_to_end(kept_key)
                while len(_kept) > KEPT_SERIES:
                    _kept.popitem(last=False)
        found.append(kept)
    return sorted(found, key=lambda s: (s.seqs[0], s.result_ids[0]))


def warm_up(session_factory: sessionmaker[Session]) -> None:
    """Open a pooled connection and compile a read's statements, so that a process's first read does
    not pay for them (a first connection to PostgreSQL took ~15 ms)."""
    with session_factory() as session:
        nothing = {"project_id": -1, "model_id": -1, "engine": "", "level": "", "machine_class": ""}
        session.connection().execute(_LAST_POINTS, nothing | {"limit": 1}).all()
        session.connection().execute(_WRITTEN_SINCE, nothing | {"version": 0}).all()
        series_points(session, Project(id=-1, name=""), None, None, None, 1)


def _read(connection, key: SeriesKey, series: dict, now: tuple[int, int], limit: int) -> SeriesPoints:
    rows = connection.execute(_LAST_POINTS, series | {"limit": limit}).all()
    rows.reverse()
    seqs, shas, p10s, result_ids, versions, fragments = (list(column) for column in zip(*rows, strict=True))
    timed_total = sum(1 for p10 in p10s if p10)
    if now[0] > len(rows):  # and the timed points before those shown
        timed_total += connection.execute(_TIMED_BEFORE, series | {"seq": seqs[0], "result_id": result_ids[0]}).scalar_one()
    return SeriesPoints(key, series["model_id"], Points(fragments), seqs, shas, p10s, result_ids, versions, *now,
                        timed_total)


def _merged(connection, kept: SeriesPoints, series: dict, now: tuple[int, int], limit: int) -> SeriesPoints | None:
    """`kept` with the points written since merged in: a commit shown, measured again or described, or a
    commit newer than every commit shown. None where another point was written, or the series' count
    and sum of versions say points were written that the read did not see (on PostgreSQL a version
    may commit after larger ones) or deleted: then the series is read again."""
    rows = connection.execute(_WRITTEN_SINCE, series | {"version": max(kept.versions)}).all()
    fragments, seqs, shas, p10s, result_ids, versions = (
        list(kept.points.fragments), list(kept.seqs), list(kept.shas), list(kept.p10s), list(kept.result_ids),
        list(kept.versions))
    count, versions_sum, timed_total = kept.count, kept.versions_sum, kept.timed_total
    for seq, sha, p10, result_id, version, fragment in rows:
        at = kept.positions.get(sha)
        if at is not None:
            versions_sum += version - versions[at]
            timed_total += bool(p10) - bool(p10s[at])
            fragments[at], p10s[at], result_ids[at], versions[at] = fragment, p10, result_id, version
            if not (at == 0 or (seqs[at - 1], result_ids[at - 1]) < (seq, result_id)) or not (
                    at == len(seqs) - 1 or (seq, result_id) < (seqs[at + 1], result_ids[at + 1])):
                return None  # commits numbered alike (PostgreSQL) now ordered otherwise
        elif not seqs or (seq, result_id) > (seqs[-1], result_ids[-1]):
            fragments.append(fragment)
            seqs.append(seq)
            shas.append(sha)
            p10s.append(p10)
            result_ids.append(result_id)
            versions.append(version)
            count, versions_sum, timed_total = count + 1, versions_sum + version, timed_total + bool(p10)
        else:
            return None
    if (count, versions_sum) != now:
        return None
    cut = max(0, len(seqs) - limit)
    return SeriesPoints(kept.key, kept.model_id, Points(fragments[cut:]), seqs[cut:], shas[cut:], p10s[cut:],
                        result_ids[cut:], versions[cut:], count, versions_sum, timed_total)
