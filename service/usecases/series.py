"""A model's history as the dashboard draws it: one series per engine × level × machine class, each
point a commit with its median, p10 and p90, its fused-op counts and its alerts.

Only the columns a chart needs are read (never the timing samples), and a long series is thinned to
at most `max_points` by min–max decimation: each bucket of consecutive commits keeps its fastest and
slowest point, and every commit where a fused-op count changed or an alert was raised is kept
whatever its bucket, so a step in either survives exactly at its commit. The points the chart drops
are still in the paged commit table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, Commit, Model, Project, Result
from service.usecases.overview import first_line, level_order

MAX_POINTS = 1200  # per series: above a chart's horizontal resolution, cheap for Plotly to draw


@dataclass
class Point:
    seq: int
    commit: str
    message: str
    timestamp: datetime | None
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    fusions: dict[str, int]


@dataclass
class Series:
    engine: str
    level: str
    machine_class: str
    points: list[Point]  # what the chart draws, oldest first
    total_points: int  # before thinning
    alerts: list[dict[str, Any]] = field(default_factory=list)  # {id, kind, commit, message, median_ms}

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.level}" + ("" if self.machine_class == "cpu" else f"/{self.machine_class}")

    def fused_ops(self) -> list[str]:
        return sorted({op for p in self.points for op in p.fusions})


@dataclass
class CommitRow:
    """One row of the paged commit table: a commit and each series' median there."""

    commit: str
    message: str
    timestamp: datetime | None
    medians: dict[str, float | None]  # series key -> median
    fused_totals: dict[str, int]


@dataclass
class ModelHistory:
    project: str
    model: str
    series: list[Series]
    rows: list[CommitRow]  # this page of the commit table, newest first
    page: int
    pages: int


def model_history(
    session: Session, project: Project, model: Model, max_points: int = MAX_POINTS, page: int = 1, page_size: int = 50
) -> ModelHistory:
    rows = session.execute(
        select(
            Result.fingerprint, Result.engine, Result.level, Result.machine_class, Result.median_ms,
            Result.p10_ms, Result.p90_ms, Result.fusions, Commit.seq, Commit.sha, Commit.message,
            Commit.timestamp, Commit.created_at,
        )
        .join(Commit, Commit.id == Result.commit_id)
        .where(Result.project_id == project.id, Result.model_id == model.id)
        .order_by(Commit.seq, Result.id)
    ).all()
    full: dict[str, tuple[Any, dict[int, Point]]] = {}
    for row in rows:
        _, points = full.setdefault(row.fingerprint, (row, {}))
        # A re-measurement of a commit replaces the earlier one (ids ascend within a commit).
        points[row.seq] = Point(
            seq=row.seq, commit=row.sha, message=first_line(row.message, 120), timestamp=row.timestamp or row.created_at,
            median_ms=row.median_ms, p10_ms=row.p10_ms, p90_ms=row.p90_ms, fusions=row.fusions,
        )
    alerts = _alerts_by_series(session, model)
    drawn: list[tuple[Series, dict[int, Point]]] = []
    for first, points in full.values():
        ordered = list(points.values())
        marked = [dict(a) for a in alerts.get((first.engine, first.level), [])]
        for alert in marked:
            at = points.get(alert["seq"])
            alert["median_ms"] = at.median_ms if at else None
        drawn.append((
            Series(
                engine=first.engine, level=first.level, machine_class=first.machine_class,
                points=thin(ordered, max_points, {a["commit"] for a in marked}), total_points=len(ordered),
                alerts=marked,
            ),
            points,
        ))
    drawn.sort(key=lambda pair: (pair[0].engine, level_order(pair[0].level), pair[0].machine_class))
    table, pages = _commit_table({s.key: points for s, points in drawn}, page, page_size)
    return ModelHistory(project.name, model.name, [s for s, _ in drawn], table, max(1, min(page, pages)), pages)


def thin(points: list[Point], max_points: int, keep: set[str] = frozenset()) -> list[Point]:
    """At most about `max_points` points (plus the kept ones): min–max per bucket, every fused-op change
    and every commit in `keep`."""
    if len(points) <= max_points:
        return points
    chosen: set[int] = {0, len(points) - 1}
    for i in range(1, len(points)):
        if points[i].fusions != points[i - 1].fusions:
            chosen.update((i - 1, i))  # both sides of a step, so the line drops at the right commit
    chosen.update(i for i, p in enumerate(points) if p.commit in keep)
    bucket = max(1, -(-2 * len(points) // max_points))  # two points per bucket
    for start in range(0, len(points), bucket):
        span = [i for i in range(start, min(start + bucket, len(points))) if points[i].median_ms is not None]
        if span:
            chosen.add(min(span, key=lambda i: points[i].median_ms))
            chosen.add(max(span, key=lambda i: points[i].median_ms))
    return [points[i] for i in sorted(chosen)]


def _alerts_by_series(session: Session, model: Model) -> dict[tuple[str, str], list[dict[str, Any]]]:
    rows = session.execute(
        select(Alert.id, Alert.kind, Alert.state, Alert.engine, Alert.level, Alert.message, Commit.sha, Commit.seq)
        .join(Commit, Commit.id == Alert.commit_id)
        .where(Alert.model_id == model.id)
        .order_by(Alert.id)
    ).all()
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        found.setdefault((row.engine, row.level), []).append(
            {"id": row.id, "kind": row.kind, "state": row.state, "commit": row.sha, "seq": row.seq,
             "message": row.message}
        )
    return found


def _commit_table(by_key: dict[str, dict[int, Point]], page: int, page_size: int) -> tuple[list[CommitRow], int]:
    """One page of commits, newest first, with every series' median at each."""
    seqs = sorted({seq for points in by_key.values() for seq in points}, reverse=True)
    pages = max(1, -(-len(seqs) // page_size))
    page = max(1, min(page, pages))
    rows = []
    for seq in seqs[(page - 1) * page_size: page * page_size]:
        here = {key: points[seq] for key, points in by_key.items() if seq in points}
        some = next(iter(here.values()))
        rows.append(
            CommitRow(
                commit=some.commit, message=some.message, timestamp=some.timestamp,
                medians={key: here[key].median_ms if key in here else None for key in by_key},
                fused_totals={key: sum(point.fusions.values()) for key, point in here.items()},
            )
        )
    return rows, pages
