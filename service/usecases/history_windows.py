"""Change-point windows computed when results arrive, so that the first history read of a series finds
them stored (change_point_window) rather than running every window's permutation tests (0.3-0.6 s
over 10,000 commits).

After a result is stored (POST /results once its reply is out; the worker once the job's result is
committed), every HALF-th result of a series that this process stores (and the first) is followed by
a pass over the series' end: its last TAIL timed points and how many it has. That is one query over
the whole series; run after every result, it took POST /results from 10-11 to 19 ms of CPU in
bench.load (SQLite, 10,000 commits). The windows placed on the whole series
(service/domain/change_points.py) that are complete among those, the last SETTLED of them, are
asked for as a read of the whole series asks for them: each is found in this process's memory or
in the table, or computed and stored. A window completes once per HALF timed points, so a pass
usually computes one window or none; SETTLED covers the windows that settled while other processes
(API processes, workers) took the series' results.

A window is taken only once the series has LAG points past its end. Results posted together commit
out of order (each commit is numbered when inserted), so a process may see a series with a point
missing near its end: a window computed then would hold values no read asks for. On PostgreSQL at
load average 12-15 a POST /results took up to 3.5 s (its p99 in bench.load), while about 100 others
committed: LAG keeps the windows taken clear of results that late; the read computes the newest
five itself (about 1 ms each).

Whatever a process computes is right for what it saw: a window's row is keyed by its values' digest,
and two processes computing the same window insert the same row (ON CONFLICT DO NOTHING). A result
for a commit older than the series' newest, or a commit measured again, changes windows before the
last SETTLED: those the next read computes, as it did before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.domain.change_points import WINDOW, change_points
from service.models import HistoryPoint, Result
from service.usecases import history_points
from service.usecases.change_point_windows import Series, SeriesWindows, store_computed

HALF = WINDOW // 2  # windows start every HALF positions of the series
LAG = 4 * HALF  # points past a window's end before it is taken
SETTLED = 3  # complete windows taken at the series' end
TAIL = LAG + HALF - 1 + WINDOW + (SETTLED - 1) * HALF  # points the SETTLED windows can lie in


@dataclass(frozen=True)
class ArrivedSeries:
    """A series a result joined (the series' key, as change_point_window and the history name it)."""

    project_id: int
    series: Series


def arrived(result: Result) -> ArrivedSeries:
    return ArrivedSeries(result.project_id, Series(result.model_id, result.engine, result.level, result.machine_class))


# The series' timed points (those with a p10: a read shows the others without a change point) from its
# newest commit back, with how many there are in all.
_TAIL = (
    select(HistoryPoint.p10_ms, func.count().over())
    .where(*history_points.SERIES, HistoryPoint.p10_ms != 0)
    .order_by(HistoryPoint.commit_seq.desc(), HistoryPoint.result_id.desc())  # a read's order, reversed
    .limit(TAIL)
)


_arrivals: dict[ArrivedSeries, int] = {}  # each series' results this process stored, modulo HALF
_arrivals_lock = threading.Lock()


def _due(series: ArrivedSeries) -> bool:
    with _arrivals_lock:
        seen = _arrivals.get(series, 0)
        _arrivals[series] = (seen + 1) % HALF
    return seen == 0


def compute_windows(
    read_session_factory: sessionmaker[Session], session_factory: sessionmaker[Session], series: Iterable[ArrivedSeries]
) -> None:
    """After each of `series` gained a result: when a pass is due, compute and store its settled
    windows that neither this process's memory nor the table holds (read with `read_session_factory`,
    written with `session_factory`)."""
    for each in filter(_due, dict.fromkeys(series)):
        with read_session_factory() as session:
            windows = _settled_windows(session, each)
        if windows is not None:
            store_computed(session_factory, [windows])


def _settled_windows(session: Session, arrived: ArrivedSeries) -> SeriesWindows | None:
    rows = session.execute(_TAIL, {"project_id": arrived.project_id, **vars(arrived.series)}).all()
    if not rows:
        return None
    total = rows[0][1]
    end = (total - LAG) // HALF * HALF  # the end of the last window LAG points behind the newest
    if end < WINDOW:
        return None
    start = max(0, end - WINDOW - (SETTLED - 1) * HALF)
    values = [p10 for p10, _ in reversed(rows)]  # oldest first, the first at position total - len(rows)
    offset = total - len(rows)
    windows = SeriesWindows(session, history_points.windows_seen, arrived.series)
    # Values from `start` to `end` hold exactly the windows starting at start, start + HALF, ..., end - WINDOW,
    # each whole: the same values, position and seed as when the whole series is read.
    change_points(values[start - offset:end - offset], first=start, results=windows)
    return windows
