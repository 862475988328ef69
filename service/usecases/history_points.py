"""The points of a history read: each series' latest result at each of its last `limit` commits,
read from the database once and then kept, brought up to date with the results that arrived since.

A 10,000-commit read costs about 100 ms of query and of building points, and a series changes by a
result at a time: so the points read last are kept per (database, project, filters, limit), with
what they were read at, and each read first asks the database, with two aggregates, what changed:

- results: their count and largest id under the read's filters. Results are only ever added (and
  deleted only with their project, model or commit), so an unchanged pair means unchanged results,
  and new ones are those with a larger id: they are read alone and merged in, when each is a later
  measurement of a commit the series shows or a commit newer than every commit it shows (anything
  else, e.g. a result for a commit older than the series' newest, reads everything again);
- commits: a commit seen again only gains what it lacked (usecases/commits.py: record_commit), so
  how many of the project's commits up to the largest id seen have a message, a timestamp and an
  author can only grow, and grows exactly when a commit a point may show was filled in: then
  everything is read again.

The kept points are shared by the reads that find them: nobody may change them.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import orjson
from sqlalchemy import Text, case, cast, func, select, true
from sqlalchemy.orm import Session, sessionmaker

from service.alerts.change_points import ChangePoint, WindowResults, change_points
from service.models import Commit, KeptHistory, Model, Project, Result
from service.usecases.change_point_windows import Series, SeriesWindows

SeriesKey = tuple[str, str, str, str]  # model name, engine, level, machine class


# Change points are computed per window of the series and each window's result kept, here and in
# the database (service/alerts/change_points.py, usecases/change_point_windows.py): points brought up
# to date with a new result recompute the last window or two, not E-divisive's permutation tests over
# all 10,000 commits, and a restarted process reads the windows instead of computing them.
windows_seen = WindowResults()


def series_windows(session: Session, model_id: int, key: SeriesKey) -> SeriesWindows:
    """What `SeriesPoints.change_points` asks for the series `key` (of model `model_id`) and tells
    about the windows it computes (`store_computed` writes them)."""
    _, engine, level, machine_class = key
    return SeriesWindows(session, windows_seen, Series(model_id, engine, level, machine_class))


class Points(list):
    """A series' points, oldest first, with their JSON rendered once when first asked for (orjson
    renders a list subclass as the list it is; the API splices `rendered` in as it is)."""

    @cached_property
    def rendered(self) -> bytes:
        return orjson.dumps(self)

    @cached_property
    def digest(self) -> str:
        return hashlib.sha1(self.rendered, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class SeriesPoints:
    key: SeriesKey
    points: Points  # shared, never changed
    seqs: list[int]  # each point's commit seq
    total: int  # commits in the whole series, of which `points` are the last

    # What every read of these points works out from them, worked out once (they never change).
    @cached_property
    def timed(self) -> list[int]:
        """The points with a p10, by index."""
        return [i for i, point in enumerate(self.points) if point["p10_ms"]]

    @cached_property
    def positions(self) -> dict[str, int]:
        """Each point's index, by its commit."""
        return {point["commit"]: i for i, point in enumerate(self.points)}

    def change_points(self, windows: SeriesWindows) -> list[ChangePoint]:
        """E-divisive means over the timed points' p10 (indices into `timed`), windows placed on the
        whole series; worked out once, `windows` asked for each window's result the first time."""
        found = self.__dict__.get("_change_points")
        if found is None:
            found = []
            if len(self.timed) >= 6:
                values = [self.points[i]["p10_ms"] for i in self.timed]
                found = change_points(values, first=self.total - len(self.points), results=windows)
            self.__dict__["_change_points"] = found  # frozen, as cached_property writes it
        return found


@dataclass(frozen=True)
class _Kept:
    results: tuple[int, int]  # count and largest id of the results under the read's filters
    last_commit_id: int
    commits_filled: int  # messages, timestamps and authors among commits up to last_commit_id
    series: tuple[SeriesPoints, ...]


KEPT_READS = 16  # (project, filters, limit) combinations kept; a 10,000-point one is ~10 MB
_kept: OrderedDict[tuple, _Kept] = OrderedDict()
_kept_lock = threading.Lock()


def series_points(
    session: Session, project: Project, model: Model | None, engine: str | None, level: str | None, limit: int,
    to_store: list[StoredRead] | None = None,
) -> list[SeriesPoints]:
    """Each series' points, ordered by their oldest point (as one query over everything orders them).

    Points this process has not kept are looked for in the kept_history table before everything is
    read again; points read whole are added to `to_store`, for the caller to write (`store_reads`)
    once its reply is out."""
    filters = [Result.project_id == project.id]
    if model is not None:
        filters.append(Result.model_id == model.id)
    if engine is not None:
        filters.append(Result.engine == engine)
    if level is not None:
        filters.append(Result.level == level)
    key = (str(session.get_bind().url), project.id, model.id if model else None, engine, level, limit)
    with _kept_lock:
        kept = _kept.get(key)
    in_memory = kept is not None
    stored_key = hashlib.sha256(orjson.dumps(key[1:])).hexdigest()
    if not in_memory:
        kept = _stored(session, stored_key)
    # Aggregates before rows: on PostgreSQL each statement sees its own moment, so rows read after
    # them may be newer than they say, which only makes the next read do more than it needed to.
    results_now = tuple(session.execute(select(func.count(), func.coalesce(func.max(Result.id), 0)).where(*filters)).one())
    last_commit_id, filled_before, filled_now = _commits_state(session, project, kept.last_commit_id if kept else 0)
    fresh = None
    if kept is not None and filled_before == kept.commits_filled:  # no commit a point shows was filled in
        if kept.results == results_now:
            fresh = kept
        elif results_now[0] > kept.results[0]:
            fresh = _merged(session, kept, filters, limit, results_now)
    read_whole = fresh is None
    if read_whole:
        fresh = _Kept(results_now, 0, 0, tuple(_read_all(session, filters, limit)))
    if fresh is not kept or not in_memory or kept.last_commit_id != last_commit_id:
        fresh = replace(fresh, last_commit_id=last_commit_id, commits_filled=filled_now)
        with _kept_lock:
            _kept[key] = fresh
            _kept.move_to_end(key)
            while len(_kept) > KEPT_READS:
                _kept.popitem(last=False)
    if read_whole and to_store is not None:
        to_store.append(StoredRead(stored_key, project.id, fresh))
    return list(fresh.series)


@dataclass(frozen=True)
class StoredRead:
    """Points read whole, to be written to kept_history (`store_reads`)."""

    key: str
    project_id: int
    kept: _Kept


def _stored(session: Session, key: str) -> _Kept | None:
    """The points kept_history holds for `key`, as a kept read; None where it holds none."""
    row = session.execute(
        select(KeptHistory.results_count, KeptHistory.results_max_id, KeptHistory.last_commit_id,
               KeptHistory.commits_filled, KeptHistory.points).where(KeptHistory.key == key)
    ).one_or_none()
    if row is None:
        return None
    count, max_id, last_commit_id, filled, payload = row
    return _Kept((count, max_id), last_commit_id, filled, tuple(_unpacked(payload)))


# kept_history.points: a line of JSON, each series' key, seqs, total and the length of its rendered
# points, then those renderings one after another. A restarted process splices them into its
# replies as they are instead of rendering 10,000 points again (orjson escapes newlines in strings,
# so the first one ends the line).
def _packed(series: tuple[SeriesPoints, ...]) -> bytes:
    heads = [[list(s.key), s.seqs, s.total, len(s.points.rendered)] for s in series]
    return b"".join([orjson.dumps(heads), b"\n", *(s.points.rendered for s in series)])


def _unpacked(payload: bytes) -> list[SeriesPoints]:
    line, _, rest = payload.partition(b"\n")
    series, at = [], 0
    for key, seqs, total, length in orjson.loads(line):
        rendered = rest[at:at + length]
        at += length
        points = Points(orjson.loads(rendered))
        points.__dict__["rendered"] = rendered  # as cached_property keeps it
        series.append(SeriesPoints(tuple(key), points, seqs, total))
    return series


def store_reads(session_factory: sessionmaker[Session], reads: list[StoredRead]) -> None:
    """Write `reads` to kept_history, each replacing what its key held, in a transaction of its own
    (a read's session may not write: on SQLite its transactions never take the write lock)."""
    with session_factory() as session, session.begin():
        for read in reads:
            payload = _packed(read.kept.series)
            session.merge(KeptHistory(
                key=read.key, project_id=read.project_id, results_count=read.kept.results[0],
                results_max_id=read.kept.results[1], last_commit_id=read.kept.last_commit_id,
                commits_filled=read.kept.commits_filled, points=payload,
            ))  # fmt: skip


def _commits_state(session: Session, project: Project, up_to: int) -> tuple[int, int, int]:
    """The project's largest commit id; how many messages, timestamps and authors its commits up to
    `up_to` have; and how many all its commits have."""
    def filled(where):
        message, timestamp, author = (case((where & condition, 1), else_=0) for condition in
                                      (Commit.message != "", Commit.timestamp.is_not(None), Commit.author != ""))
        return message + timestamp + author

    last, before, now = session.execute(
        select(func.coalesce(func.max(Commit.id), 0), func.coalesce(func.sum(filled(Commit.id <= up_to)), 0),
               func.coalesce(func.sum(filled(true())), 0))
        .where(Commit.project_id == project.id)
    ).one()
    return int(last), int(before), int(now)


_POINT_COLUMNS = (
    Result.id, Model.name.label("model"), Result.engine, Result.level, Result.machine_class,
    Result.engine_version, Result.graph_hash, cast(Result.fusions, Text).label("fusions"), Result.nodes_after,
    Result.median_ms, Result.p10_ms, Result.p90_ms, Result.mad_ms,
    func.json_array_length(Result.execute_ms).label("samples"), Result.numeric_ok,
    Commit.sha, Commit.branch, Commit.message, Commit.timestamp, Commit.seq,
)


def _read_all(session: Session, filters: list, limit: int) -> list[SeriesPoints]:
    # Narrow first: the latest result per series and commit, from the series index alone; then each
    # series' last `limit` commits; only then the wide columns, for the rows kept (sorted here, since a
    # database sorting wide rows took longer than reading them).
    series_key = (Result.model_id, Result.engine, Result.level, Result.machine_class)
    latest = (
        select(func.max(Result.id).label("id"), *series_key, Result.commit_id)
        .where(*filters)
        .group_by(*series_key, Result.commit_id)
        .subquery()
    )
    partition = (latest.c.model_id, latest.c.engine, latest.c.level, latest.c.machine_class)
    ranked = (
        select(latest.c.id, func.row_number().over(partition_by=partition, order_by=Commit.seq.desc()).label("rank"),
               func.count().over(partition_by=partition).label("total"))
        .join(Commit, Commit.id == latest.c.commit_id)
        .subquery()
    )
    query = (
        select(*_POINT_COLUMNS, ranked.c.total)
        .select_from(ranked)
        .join(Result, Result.id == ranked.c.id)
        .join(Commit, Commit.id == Result.commit_id)
        .join(Model, Model.id == Result.model_id)
        .where(ranked.c.rank <= limit)
    )
    # Through the connection: the ORM session's own processing of 10,000 plain rows is time for nothing.
    rows = sorted(session.connection().execute(query).all(), key=lambda row: (row[19], row[0]))  # (seq, result id)
    builder = _PointBuilder()
    series: dict[SeriesKey, tuple[list, list, int]] = {}
    for row in rows:
        key = (row[1], row[2], row[3], row[4])
        found = series.get(key)
        if found is None:
            found = series[key] = ([], [], row[20])
        found[0].append(builder.point(row))
        found[1].append(row[19])
    return [SeriesPoints(key, Points(points), seqs, total) for key, (points, seqs, total) in series.items()]


def _merged(session: Session, kept: _Kept, filters: list, limit: int, results_now: tuple[int, int]) -> _Kept | None:
    """`kept` with the results added since merged in; None when one of them is not simply a later
    measurement of a shown commit or a newer commit (then everything is read again)."""
    rows = session.execute(
        select(*_POINT_COLUMNS)
        .join(Commit, Commit.id == Result.commit_id)
        .join(Model, Model.id == Result.model_id)
        .where(*filters, Result.id > kept.results[1])
        .order_by(Result.id)
    ).all()
    if len(rows) != results_now[0] - kept.results[0]:
        return None  # results were deleted meanwhile too
    series = {s.key: [list(s.points), list(s.seqs), s.total] for s in kept.series}
    builder = _PointBuilder()
    for row in rows:
        key = (row[1], row[2], row[3], row[4])
        points, seqs, total = series.setdefault(key, [[], [], 0])
        seq = row[19]
        at = bisect.bisect_left(seqs, seq)
        if at < len(seqs) and seqs[at] == seq and points[at]["commit"] == row[15]:  # a commit shown, measured again
            points[at] = builder.point(row)
        elif at == len(seqs):  # newer than every commit shown, so than every commit of the series
            points.append(builder.point(row))
            seqs.append(seq)
            series[key][2] = total + 1
        else:
            return None
    merged = []
    for key, (points, seqs, total) in series.items():
        merged.append(SeriesPoints(key, Points(points[-limit:]), seqs[-limit:], total))
    merged.sort(key=lambda s: (s.seqs[0], s.points[0]["result_id"]))
    return _Kept(results_now, kept.last_commit_id, kept.commits_filled, tuple(merged))


class _PointBuilder:
    """Points from rows of _POINT_COLUMNS; fused-op counts are read as text and parsed once per distinct
    value (a series repeats the same few)."""

    def __init__(self) -> None:
        self._parsed: dict[str | None, dict[str, int]] = {None: {}}

    def point(self, row) -> dict[str, Any]:
        (result_id, _, _, _, _, engine_version, graph_hash, fusions_text, nodes_after, median_ms, p10_ms, p90_ms,
         mad_ms, samples, numeric_ok, sha, branch, message, timestamp) = row[:19]
        fusions = self._parsed.get(fusions_text)
        if fusions is None:
            fusions = self._parsed[fusions_text] = json.loads(fusions_text)
        return {
            "commit": sha,
            "branch": branch,
            # The first line's first 200 characters, without splitting a 10,000-character message whole.
            "message": message[:201].splitlines()[0][:200] if message else "",
            "timestamp": timestamp.isoformat() if timestamp else None,
            "result_id": result_id,
            "engine_version": engine_version,
            "graph_hash": graph_hash,
            "fusions": fusions,
            "nodes_after": nodes_after,
            "median_ms": median_ms,
            "p10_ms": p10_ms,
            "p90_ms": p90_ms,
            "mad_ms": mad_ms,
            "samples": samples or 0,
            "numeric_ok": numeric_ok,
        }
