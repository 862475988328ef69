"""The durable job queue: jobs are rows, and claiming one is a single UPDATE; new jobs are announced
to Celery workers when a broker is configured.

Both workers claim here: the embedded one (service/worker/embedded.py) polls the table; Celery workers
(service/worker/celery_app.py) are told a job id over Redis and claim it here, so the row, not the
broker, is the truth — a broker message delivered twice still makes one result. Finishing, failing
and requeueing a job are service/usecases/jobs.py's (a failure raises an alert).
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.adapters.celery_publish import publish_run_job
from service.models import Job
from service.models.base import utc_now


def claim_next(session: Session, worker: str, machine_class: str) -> Job | None:
    """Take the oldest queued job of this machine class, or None. Safe against concurrent workers:
    the UPDATE only succeeds on a row still queued."""
    while True:
        job_id = session.scalar(
            select(Job.id).where(Job.state == "queued", Job.machine_class == machine_class).order_by(Job.id).limit(1)
        )
        if job_id is None:
            return None
        if claim(session, job_id, worker, from_states=("queued",)):
            return session.get(Job, job_id)


def claim(session: Session, job_id: int, worker: str, from_states: tuple[str, ...] = ("queued",)) -> bool:
    taken = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state.in_(from_states))
        .values(state="running", worker=worker, attempts=Job.attempts + 1, started_at=utc_now(), error=None)
    ).rowcount
    session.commit()
    return taken == 1


def dispatch(jobs: list[Job], broker_url: str | None) -> None:
    """Tell Celery about new jobs when a broker is configured; the embedded worker finds them itself."""
    if not broker_url or not jobs:
        return
    for job in jobs:
        publish_run_job(broker_url, job.machine_class, job.id)
