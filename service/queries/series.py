"""A model's history as the dashboard draws it: one series per engine × level × machine class, each
point a commit with its median, p10 and p90, its fused-op counts and its alerts.

Only the columns a chart needs are read (never the timing samples), and a long series is thinned to
at most `max_points` by min–max decimation: each bucket of consecutive commits keeps its fastest and
slowest point, and every commit where a fused-op count changed or an alert was raised is kept
whatever its bucket, so a step in either survives exactly at its commit. The points the chart drops
are still in the paged commit table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from service.models import Alert, Commit, Model, Project, Result
from service.queries.overview import first_line, level_order

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


class Sample(NamedTuple):
    """One result as the series is built from it: no commit text yet (that is read for drawn points only)."""

    seq: int
    commit_id: int
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    fusions: dict[str, int]


def model_history(
    session: Session, project: Project, model: Model, max_points: int = MAX_POINTS, page: int = 1, page_size: int = 50
) -> ModelHistory:
    rows = session.execute(
        select(
            Result.engine, Result.level, Result.machine_class, Result.commit_id, Result.median_ms,
            Result.p10_ms, Result.p90_ms, cast(Result.fusions, Text).label("fusions"), Commit.seq,
        )
        .join(Commit, Commit.id == Result.commit_id)
        .where(Result.project_id == project.id, Result.model_id == model.id)
        .order_by(Commit.seq, Result.id)
    ).all()
    # Fused-op counts read as text and parsed once per distinct value: a series repeats the same few.
    parsed: dict[str, dict[str, int]] = {}
    # A series is what history points are stored under (usecases/history_points.py): engine, level and
    # machine class. Results whose input shapes or threads differ (a fingerprint each) are one series,
    # the latest result at a commit its point, as the history API shows it.
    full: dict[tuple[str, str, str], tuple[Any, dict[int, Sample]]] = {}
    for row in rows:
        fusions = parsed.get(row.fusions)
        if fusions is None:
            fusions = parsed[row.fusions] = json.loads(row.fusions) if row.fusions else {}
        _, samples = full.setdefault((row.engine, row.level, row.machine_class), (row, {}))
        # A re-measurement of a commit replaces the earlier one (ids ascend within a commit).
        samples[row.seq] = Sample(row.seq, row.commit_id, row.median_ms, row.p10_ms, row.p90_ms, fusions)
    alerts = _alerts_by_series(session, model)
    built: list[tuple[Any, list[Sample], list[dict[str, Any]], dict[int, Sample]]] = []
    for first, samples in full.values():
        marked = [dict(a) for a in alerts.get((first.engine, first.level), [])]
        for alert in marked:
            at = samples.get(alert["seq"])
            alert["median_ms"] = at.median_ms if at else None
        ordered = list(samples.values())
        built.append((first, thin(ordered, max_points, {a["seq"] for a in marked}), marked, samples))
    built.sort(key=lambda b: (b[0].engine, level_order(b[0].level), b[0].machine_class))
    seqs = sorted({seq for *_, samples in built for seq in samples}, reverse=True)
    pages = max(1, -(-len(seqs) // page_size))
    page = max(1, min(page, pages))
    shown = seqs[(page - 1) * page_size: page * page_size]
    wanted = {s.commit_id for _, drawn, _, _ in built for s in drawn}
    wanted |= {samples[seq].commit_id for *_, samples in built for seq in shown if seq in samples}
    commits = _commits(session, wanted)
    series = [
        Series(engine=first.engine, level=first.level, machine_class=first.machine_class,
               points=[_point(s, commits[s.commit_id]) for s in drawn], total_points=len(samples), alerts=marked)
        for first, drawn, marked, samples in built
    ]
    table = _commit_table({s.key: b[3] for s, b in zip(series, built, strict=True)}, shown, commits)
    return ModelHistory(project.name, model.name, series, table, page, pages)


def _commits(session: Session, ids: set[int]) -> dict[int, Any]:
    found = {}
    ordered = sorted(ids)
    for start in range(0, len(ordered), 5000):  # bounded IN lists, for any database's parameter limit
        chunk = ordered[start:start + 5000]
        query = select(Commit.id, Commit.sha, Commit.message, Commit.timestamp, Commit.created_at)
        found.update({row.id: row for row in session.execute(query.where(Commit.id.in_(chunk)))})
    return found


def _point(sample: Sample, commit: Any) -> Point:
    return Point(
        seq=sample.seq, commit=commit.sha, message=first_line(commit.message, 120),
        timestamp=commit.timestamp or commit.created_at, median_ms=sample.median_ms, p10_ms=sample.p10_ms,
        p90_ms=sample.p90_ms, fusions=sample.fusions,
    )


def thin(samples: list[Sample], max_points: int, keep: set[int] = frozenset()) -> list[Sample]:
    """At most about `max_points` samples (plus the kept ones): min–max per bucket, both sides of every
    fused-op change and every commit (seq) in `keep`."""
    if len(samples) <= max_points:
        return samples
    chosen: set[int] = {0, len(samples) - 1}
    for i in range(1, len(samples)):
        if samples[i].fusions != samples[i - 1].fusions:
            chosen.update((i - 1, i))  # both sides of a step, so the line drops at the right commit
    chosen.update(i for i, s in enumerate(samples) if s.seq in keep)
    bucket = max(1, -(-2 * len(samples) // max_points))  # two samples per bucket
    for start in range(0, len(samples), bucket):
        span = [i for i in range(start, min(start + bucket, len(samples))) if samples[i].median_ms is not None]
        if span:
            chosen.add(min(span, key=lambda i: samples[i].median_ms))
            chosen.add(max(span, key=lambda i: samples[i].median_ms))
    return [samples[i] for i in sorted(chosen)]


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


def _commit_table(by_key: dict[str, dict[int, Sample]], seqs: list[int], commits: dict[int, Any]) -> list[CommitRow]:
    """The table's rows at `seqs` (one page, newest first), with every series' median at each."""
    rows = []
    for seq in seqs:
        here = {key: samples[seq] for key, samples in by_key.items() if seq in samples}
        commit = commits[next(iter(here.values())).commit_id]
        rows.append(
            CommitRow(
                commit=commit.sha, message=first_line(commit.message, 120), timestamp=commit.timestamp or commit.created_at,
                medians={key: here[key].median_ms if key in here else None for key in by_key},
                fused_totals={key: sum(sample.fusions.values()) for key, sample in here.items()},
            )
        )
    return rows
