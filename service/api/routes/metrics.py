"""Prometheus text exposition: jobs by state, job seconds, alerts by kind."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from service.api.deps import SessionDep
from service.domain.vocabulary import ALERT_KINDS, JOB_STATES
from service.queries.metrics import service_counts

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=PlainTextResponse)
def read_metrics(session: SessionDep) -> str:
    counts = service_counts(session)
    lines = [
        "# HELP fusionwatch_jobs Jobs by state.",
        "# TYPE fusionwatch_jobs gauge",
        *(f'fusionwatch_jobs{{state="{state}"}} {counts.jobs.get(state, 0)}' for state in JOB_STATES),
        "# HELP fusionwatch_job_seconds Wall time of finished jobs.",
        "# TYPE fusionwatch_job_seconds summary",
        f"fusionwatch_job_seconds_count {counts.finished_jobs}",
        f"fusionwatch_job_seconds_sum {counts.finished_seconds:.3f}",
        "# HELP fusionwatch_alerts Alerts raised, by kind.",
        "# TYPE fusionwatch_alerts counter",
        *(f'fusionwatch_alerts_total{{kind="{kind}"}} {counts.alerts.get(kind, 0)}' for kind in ALERT_KINDS),
    ]
    return "\n".join(lines) + "\n"
