"""Prometheus text exposition: jobs by state, job seconds, alerts by kind."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select

from service.api.deps import SessionDep
from service.models import Alert, Job
from service.models.vocabulary import ALERT_KINDS, JOB_STATES

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=PlainTextResponse)
def read_metrics(session: SessionDep) -> str:
    jobs = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    alerts = dict(session.execute(select(Alert.kind, func.count()).group_by(Alert.kind)).all())
    finished = session.execute(
        select(Job.started_at, Job.finished_at).where(Job.state == "done", Job.finished_at.is_not(None))
    ).all()
    seconds = [(f - s).total_seconds() for s, f in finished if s is not None]
    lines = [
        "# HELP fusionwatch_jobs Jobs by state.",
        "# TYPE fusionwatch_jobs gauge",
        *(f'fusionwatch_jobs{{state="{state}"}} {jobs.get(state, 0)}' for state in JOB_STATES),
        "# HELP fusionwatch_job_seconds Wall time of finished jobs.",
        "# TYPE fusionwatch_job_seconds summary",
        f"fusionwatch_job_seconds_count {len(seconds)}",
        f"fusionwatch_job_seconds_sum {sum(seconds):.3f}",
        "# HELP fusionwatch_alerts Alerts raised, by kind.",
        "# TYPE fusionwatch_alerts counter",
        *(f'fusionwatch_alerts_total{{kind="{kind}"}} {alerts.get(kind, 0)}' for kind in ALERT_KINDS),
    ]
    return "\n".join(lines) + "\n"
