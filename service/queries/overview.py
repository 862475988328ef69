"""What the dashboard's overview and project pages read: projects at a glance, the latest runs with
their verdicts, and a project's models × engines × levels with each cell's latest result.

Each read is a bounded number of queries whatever the history's length: the per-series trend is cut
to the last `trend_points` results by a window function, not by loading the series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.domain.vocabulary import LEVEL_NAMES, NEEDS_ATTENTION
from service.models import Alert, Commit, Model, Project, Result, Run
from service.queries.timing_words import timing_word
from service.usecases.baselines import find_baseline
from service.usecases.runs import run_status


@dataclass
class ProjectSummary:
    name: str
    models: int
    commits: int
    open_alerts: int
    latest_commit: str | None
    latest_at: datetime | None


@dataclass
class RunSummary:
    run_id: int
    project: str
    commit: str
    branch: str
    message: str
    created_at: datetime  # the commit's timestamp where CI gave one, else the run's start
    verdict: str  # running, ok, regression, failed
    jobs_done: int
    jobs_total: int


@dataclass
class Cell:
    """One model × engine × level × machine class: its latest result against that result's baseline."""

    model: str
    engine: str
    level: str
    machine_class: str
    commit: str
    median_ms: float | None
    baseline_commit: str | None
    baseline_median_ms: float | None
    change_pct: float | None
    fusions: dict[str, int]
    medians: list[float] = field(default_factory=list)  # the trend, oldest first
    fused_totals: list[int] = field(default_factory=list)
    timing: dict[str, Any] | None = None  # the timing decision in words (service/queries/timing_words.py)


def project_summaries(session: Session) -> list[ProjectSummary]:
    models = _count_by(session, Model.project_id)
    commits = _count_by(session, Commit.project_id)
    open_alerts = _count_by(session, Alert.project_id, Alert.state.in_(NEEDS_ATTENTION))
    newest = (
        select(Commit.project_id, func.max(Commit.seq).label("seq")).group_by(Commit.project_id).subquery()
    )
    latest = {
        row.project_id: row
        for row in session.execute(
            select(Commit.project_id, Commit.sha, Commit.timestamp, Commit.created_at).join(
                newest, (newest.c.project_id == Commit.project_id) & (newest.c.seq == Commit.seq)
            )
        )
    }
    summaries = []
    for project in session.scalars(select(Project).order_by(Project.name)):
        head = latest.get(project.id)
        summaries.append(
            ProjectSummary(
                name=project.name,
                models=models.get(project.id, 0),
                commits=commits.get(project.id, 0),
                open_alerts=open_alerts.get(project.id, 0),
                latest_commit=head.sha if head else None,
                latest_at=(head.timestamp or head.created_at) if head else None,
            )
        )
    return summaries


def _count_by(session: Session, column, *where) -> dict[int, int]:
    return {key: count for key, count in session.execute(select(column, func.count()).where(*where).group_by(column))}


def latest_runs(session: Session, project: Project | None = None, limit: int = 20) -> list[RunSummary]:
    """The newest runs, newest first, each with its verdict as GET /runs/{id} gives it."""
    query = select(Run.id).order_by(Run.id.desc()).limit(limit)
    if project is not None:
        query = query.where(Run.project_id == project.id)
    summaries = []
    for run_id in session.scalars(query).all():
        status = run_status(session, run_id)
        summaries.append(
            RunSummary(
                run_id=run_id,
                project=status.project.name,
                commit=status.commit.sha,
                branch=status.commit.branch,
                message=first_line(status.commit.message),
                created_at=status.commit.timestamp or status.run.created_at,
                verdict=status.verdict,
                jobs_done=status.jobs_done,
                jobs_total=status.jobs_total,
            )
        )
    return summaries


def project_cells(session: Session, project: Project, trend_points: int = 30) -> list[Cell]:
    """The latest result of every series in the project, with the last `trend_points` medians and
    fused-op totals; ordered by model, engine, level."""
    rank = (
        func.row_number()
        .over(partition_by=Result.fingerprint, order_by=(Commit.seq.desc(), Result.id.desc()))
        .label("rank")
    )
    recent = (
        select(Result.id, Result.fingerprint, Result.median_ms, Result.fusions, Commit.seq, rank)
        .join(Commit, Commit.id == Result.commit_id)
        .where(Result.project_id == project.id)
        .subquery()
    )
    rows = session.execute(
        select(recent).where(recent.c.rank <= trend_points).order_by(recent.c.fingerprint, recent.c.rank.desc())
    ).all()
    trends: dict[str, list[Any]] = {}
    for row in rows:
        trends.setdefault(row.fingerprint, []).append(row)
    latest_ids = [points[-1].id for points in trends.values()]
    if not latest_ids:
        return []
    results = session.execute(
        select(Result, Model.name, Commit.sha)
        .join(Model, Model.id == Result.model_id)
        .join(Commit, Commit.id == Result.commit_id)
        .where(Result.id.in_(latest_ids))
    ).all()
    cells = []
    baselines = [find_baseline(session, result) for result, _, _ in results]
    for (result, model_name, sha), baseline in zip(results, baselines, strict=True):
        before = baseline.median_ms if baseline else None
        points = trends[result.fingerprint]
        cells.append(
            Cell(
                model=model_name,
                engine=result.engine,
                level=result.level,
                machine_class=result.machine_class,
                commit=sha,
                median_ms=result.median_ms,
                baseline_commit=session.get(Commit, baseline.commit_id).sha if baseline else None,
                baseline_median_ms=before,
                change_pct=percent_change(before, result.median_ms),
                fusions=dict(sorted(result.fusions.items())),
                medians=[p.median_ms for p in points if p.median_ms is not None],
                fused_totals=[sum(p.fusions.values()) for p in points],
                timing=timing_word(session, result),
            )
        )
    return sorted(cells, key=lambda c: (c.model, c.engine, level_order(c.level), c.machine_class))


def level_order(level: str) -> int:
    """Levels in the order the optimizer applies them, so tables read disabled → all."""
    return LEVEL_NAMES.index(level) if level in LEVEL_NAMES else len(LEVEL_NAMES)


def percent_change(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (after - before) / before * 100


def first_line(message: str | None, limit: int = 200) -> str:
    return message.splitlines()[0][:limit] if message else ""
