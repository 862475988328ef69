"""What /metrics reports: jobs by state, finished jobs' wall time, alerts by kind."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Alert, Job


@dataclass
class Counts:
    jobs: dict[str, int]  # by state
    alerts: dict[str, int]  # by kind
    finished_jobs: int
    finished_seconds: float  # their wall time, summed


def service_counts(session: Session) -> Counts:
    jobs = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    alerts = dict(session.execute(select(Alert.kind, func.count()).group_by(Alert.kind)).all())
    finished = session.execute(
        select(Job.started_at, Job.finished_at).where(Job.state == "done", Job.finished_at.is_not(None))
    ).all()
    seconds = [(f - s).total_seconds() for s, f in finished if s is not None]
    return Counts(jobs, alerts, len(seconds), sum(seconds))
