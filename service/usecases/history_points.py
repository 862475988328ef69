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
import functools
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import orjson
from sqlalchemy import Text, bindparam, case, cast, func, select, true
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


class Points:
    """A series' points, oldest first: as dicts (`items`, when read from the database) or as each
    point's JSON (`fragments`), each made from the other when first asked for; `rendered`, the list a
    reply carries, is rendered from whichever is there. Points are merged, cut to a read's limit and
    stored in kept_history as fragments, so points read back from there are never parsed: orjson took
    30 ms to parse 10,000 points that a reply only splices back. Points read whole are rendered as
    one list (rendering each point apart costs several times more), and their fragments are made
    when first needed, mostly after the reply (store_reads)."""

    def __init__(self, *, items: list[dict[str, Any]] | None = None, fragments: list[bytes] | None = None) -> None:
        if items is not None:
            self.__dict__["items"] = items  # as cached_property keeps it
        if fragments is not None:
            self.__dict__["fragments"] = fragments

    @cached_property
    def fragments(self) -> list[bytes]:
        return [orjson.dumps(point) for point in self.items]

    @cached_property
    def rendered(self) -> bytes:
        if "fragments" not in self.__dict__:
            return orjson.dumps(self.items)
        return b"[" + b",".join(self.fragments) + b"]"

    @cached_property
    def digest(self) -> str:
        return hashlib.sha1(self.rendered, usedforsecurity=False).hexdigest()

    @cached_property
    def items(self) -> list[dict[str, Any]]:
        return orjson.loads(self.rendered)


@dataclass(frozen=True)
class SeriesPoints:
    """A series' points with what reads and merges use of them beside them, so that neither parses
    the points: each point's commit seq, commit, p10 and result."""

    key: SeriesKey
    points: Points  # shared, never changed
    seqs: list[int]
    shas: list[str]
    p10s: list[float | None]
    result_ids: list[int]
    total: int  # commits in the whole series, of which `points` are the last

    @classmethod
    def of(cls, key: SeriesKey, items: list[dict[str, Any]], seqs: list[int], total: int) -> SeriesPoints:
        return cls(key, Points(items=items), seqs, [p["commit"] for p in items],
                   [p["p10_ms"] for p in items], [p["result_id"] for p in items], total)

    def cut(self, limit: int) -> SeriesPoints:
        """The last `limit` points."""
        if len(self.seqs) <= limit:
            return self
        return SeriesPoints(self.key, Points(fragments=self.points.fragments[-limit:]), self.seqs[-limit:], self.shas[-limit:],
                            self.p10s[-limit:], self.result_ids[-limit:], self.total)

    # What every read of these points works out from them, worked out once (they never change).
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
        whole series; worked out once, `windows` asked for each window's result the first time."""
        found = self.__dict__.get("_change_points")
        if found is None:
            found = []
            if len(self.timed) >= 6:
                values = [self.p10s[i] for i in self.timed]
                found = change_points(values, first=self.total - len(self.seqs), results=windows)
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


_STORED = select(KeptHistory.results_count, KeptHistory.results_max_id, KeptHistory.last_commit_id,
                 KeptHistory.commits_filled, KeptHistory.points).where(KeptHistory.key == bindparam("key"))


@functools.cache
def _stored_sql(dialect) -> str:
    return str(_STORED.compile(dialect=dialect))


def _stored(session: Session, key: str) -> _Kept | None:
    """The points kept_history holds for `key`, as a kept read; None where it holds none."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        # psycopg reads bytea as hex text unless asked for binary, which decodes megabytes several times faster.
        with connection.connection.driver_connection.cursor(binary=True) as cursor:
            row = cursor.execute(_stored_sql(connection.dialect), {"key": key}).fetchone()
    else:
        row = connection.execute(_STORED, {"key": key}).one_or_none()
    if row is None:
        return None
    count, max_id, last_commit_id, filled, payload = row
    payload = bytes(payload)  # psycopg's binary bytea may come as a memoryview
    return _Kept((count, max_id), last_commit_id, filled, tuple(_unpacked(payload)))


# kept_history.points: a line of JSON, each series' key, seqs, commits, p10s, results, total and the
# length of each point's rendering, then those renderings one after another. A restarted process
# splices them into its replies as they are instead of rendering 10,000 points again (orjson escapes
# newlines in strings, so the first one ends the line).
_HEAD = ("key", "seqs", "shas", "p10s", "result_ids", "total")


def _packed(series: tuple[SeriesPoints, ...]) -> bytes:
    heads = [[getattr(s, field) for field in _HEAD] + [[len(f) for f in s.points.fragments]] for s in series]
    return b"".join([orjson.dumps(heads), b"\n", *(f for s in series for f in s.points.fragments)])


def _unpacked(payload: bytes) -> list[SeriesPoints]:
    line, _, rest = payload.partition(b"\n")
    series, at = [], 0
    for *head, lengths in orjson.loads(line):
        fragments = []
        for length in lengths:
            fragments.append(rest[at:at + length])
            at += length
        key, seqs, shas, p10s, result_ids, total = head
        series.append(SeriesPoints(tuple(key), Points(fragments=fragments), seqs, shas, p10s, result_ids, total))
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
    return [SeriesPoints.of(key, points, seqs, total) for key, (points, seqs, total) in series.items()]


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
    kept_series = {s.key: s for s in kept.series}
    changed: dict[SeriesKey, tuple[list, ...]] = {}  # (fragments, seqs, shas, p10s, result ids, [total])
    builder = _PointBuilder()
    for row in rows:
        key = (row[1], row[2], row[3], row[4])
        found = changed.get(key)
        if found is None:
            was = kept_series.get(key)
            found = changed[key] = ((list(was.points.fragments), list(was.seqs), list(was.shas), list(was.p10s),
                                     list(was.result_ids), [was.total]) if was else ([], [], [], [], [], [0]))
        fragments, seqs, shas, p10s, result_ids, total = found
        point = builder.point(row)
        seq, fragment = row[19], orjson.dumps(point)
        at = bisect.bisect_left(seqs, seq)
        if at < len(seqs) and seqs[at] == seq and shas[at] == row[15]:  # a commit shown, measured again
            fragments[at], p10s[at], result_ids[at] = fragment, point["p10_ms"], point["result_id"]
        elif at == len(seqs):  # newer than every commit shown, so than every commit of the series
            fragments.append(fragment)
            seqs.append(seq)
            shas.append(row[15])
            p10s.append(point["p10_ms"])
            result_ids.append(point["result_id"])
            total[0] += 1
        else:
            return None
    merged = kept_series | {
        key: SeriesPoints(key, Points(fragments=fragments), seqs, shas, p10s, result_ids, total).cut(limit)
        for key, (fragments, seqs, shas, p10s, result_ids, [total]) in changed.items()}
    ordered = sorted(merged.values(), key=lambda s: (s.seqs[0], s.result_ids[0]))
    return _Kept(results_now, kept.last_commit_id, kept.commits_filled, tuple(ordered))


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
