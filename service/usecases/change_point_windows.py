"""A series' change-point windows during a history read: this process's memory first, then the
change_point_window table, and computed only when neither has them; what was computed is written
afterwards (`store_computed`), so a restarted or second API process finds it.

Running every window's permutation tests again costs a 10,000-commit series 0.5-0.9 s, so the
first history read after a restart reads the series' rows in one query instead. A process that keeps its
memory asks the table only when a window is missing there, e.g. after a new result, and then only
for the windows from the first one missing on (the last one or two).

A window still filling up (the series' newest, a window cut at the front of a read) is stored too,
under its own digest; when the window at that position is complete, the rows it left stale are
deleted, so a series keeps about one row per window position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import bindparam, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from service.domain.change_points import WINDOW, WindowResults
from service.models import ChangePointWindow
from service.models.base import utc_now

Splits = list[tuple[int, float]]
_SERIES_COLUMNS = ("model_id", "engine", "level", "machine_class")


@dataclass(frozen=True)
class Series:
    model_id: int
    engine: str
    level: str
    machine_class: str


def _same_series() -> list:
    return [getattr(ChangePointWindow, column) == bindparam(column) for column in _SERIES_COLUMNS]


_STORED_FROM = select(ChangePointWindow.digest, ChangePointWindow.splits).where(
    *_same_series(), ChangePointWindow.position >= bindparam("from_position"))


def _insert(dialect_insert):
    return dialect_insert(ChangePointWindow.__table__).on_conflict_do_nothing(
        index_elements=[*_SERIES_COLUMNS, "position", "digest"])


_INSERT = {"postgresql": _insert(postgresql.insert), "sqlite": _insert(sqlite.insert)}
_DELETE_STALE = delete(ChangePointWindow).where(
    *_same_series(), ChangePointWindow.position == bindparam("at"), ChangePointWindow.digest != bindparam("kept"))


class SeriesWindows:
    """What `change_points(..., results=)` asks (`splits`) and tells (`keep`), for one series."""

    def __init__(self, session: Session, memory: WindowResults, series: Series) -> None:
        self.session, self.memory, self.series = session, memory, series
        self._stored: dict[str, Splits] | None = None
        self.computed: list[dict] = []  # rows for change_point_window

    def splits(self, values: np.ndarray, seed: tuple[int, int], p_value: float) -> Splits | None:
        key = self.memory.key(values, seed, p_value)
        found = self.memory.splits_by_key(key)
        if found is not None:
            return found
        if self._stored is None:
            # Windows are asked for in order: the rows from the first missing one on are all that can help.
            self._stored = self._read_stored(from_position=seed[1])
        found = self._stored.get(key)
        if found is not None:
            self.memory.remember(key, found)
        return found

    def keep(self, values: np.ndarray, seed: tuple[int, int], p_value: float, splits: Splits) -> None:
        self.memory.keep(values, seed, p_value, splits)
        self.computed.append({
            **{column: getattr(self.series, column) for column in _SERIES_COLUMNS},
            "position": seed[1], "digest": self.memory.key(values, seed, p_value),
            "splits": [[offset, p] for offset, p in splits], "created_at": utc_now(),
            "complete": len(values) == WINDOW,
        })

    def _read_stored(self, from_position: int) -> dict[str, Splits]:
        rows = self.session.execute(_STORED_FROM, {**vars(self.series), "from_position": from_position})
        return {digest: [(int(offset), float(p)) for offset, p in splits] for digest, splits in rows}


def store_computed(session_factory: sessionmaker[Session], windows: list[SeriesWindows]) -> None:
    """Write the windows `windows` computed, in a transaction of its own (a read's session may not
    write: on SQLite its transactions never take the write lock), and delete the rows each completed
    window made stale. A window another process stored meanwhile is left as it is: its splits are
    the same, since its digest is."""
    rows = [row for series in windows for row in series.computed]
    if not rows:
        return
    with session_factory() as session, session.begin():
        connection = session.connection()
        connection.execute(_INSERT[connection.dialect.name], [{k: v for k, v in row.items() if k != "complete"}
                                                               for row in rows])
        completed = [{**{column: row[column] for column in _SERIES_COLUMNS}, "at": row["position"], "kept": row["digest"]}
                     for row in rows if row["complete"]]
        if completed:
            connection.execute(_DELETE_STALE, completed)
