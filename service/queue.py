"""The durable job queue: jobs are rows; claiming, finishing, failing and retrying are single UPDATEs.

Both workers use these: the embedded one (service/worker/embedded.py) polls the table; Celery workers
(service/worker/celery_app.py) are told a job id over Redis and claim it here, so the row, not the
broker, is the truth — a broker message delivered twice still makes one result.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.celery_publish import publish_run_job
from service.models import Alert, Job, Model, Run
from service.models.base import utc_now
from service.usecases.runs import finish_if_complete

log = logging.getLogger("fusionwatch.queue")


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


def finish(session: Session, job: Job) -> None:
    job.state, job.finished_at = "done", utc_now()
    session.flush()
    finish_if_complete(session, job.run_id)


def fail(session: Session, job: Job, reason: str) -> Alert:
    """Mark the job failed for good, with its reason and a job-failure alert; returns the alert."""
    job.state, job.error, job.finished_at = "failed", reason[:4000], utc_now()
    model = session.get(Model, job.model_id)
    run = session.get(Run, job.run_id)
    alert = Alert(
        project_id=run.project_id,
        run_id=run.id,
        kind="job-failure",
        model_id=job.model_id,
        engine=job.engine,
        level=job.level,
        commit_id=run.commit_id,
        message=f"job {job.id} ({model.name}, {job.engine}, level {job.level}) failed after "
        f"{job.attempts} attempt(s): {reason[:1000]}",
    )
    session.add(alert)
    session.flush()
    finish_if_complete(session, job.run_id)
    log.warning("job failed", extra={"job_id": job.id, "reason": reason[:300]})
    return alert


def release_abandoned(
    session: Session, max_attempts: int, worker: str | None = None, older_than_s: float | None = None, why: str = ""
) -> list[int]:
    """Jobs left `running` by a worker that died (or ran past the timeout): back to the queue while
    attempts remain, else failed with the reason. Returns the ids of job-failure alerts raised."""
    query = select(Job).where(Job.state == "running")
    if worker is not None:
        query = query.where(Job.worker == worker)
    if older_than_s is not None:
        query = query.where(Job.started_at < utc_now() - timedelta(seconds=older_than_s))
    alerts = []
    for job in session.scalars(query).all():
        reason = why or f"worker {job.worker} stopped while running it"
        if job.attempts < max_attempts:
            job.state, job.error = "queued", f"attempt {job.attempts}: {reason}"
            log.warning("job requeued", extra={"job_id": job.id, "attempts": job.attempts, "reason": reason})
        else:
            alerts.append(fail(session, job, reason).id)
    session.commit()
    return alerts


def dispatch(jobs: list[Job], broker_url: str | None) -> None:
    """Tell Celery about new jobs when a broker is configured; the embedded worker finds them itself."""
    if not broker_url or not jobs:
        return
    for job in jobs:
        publish_run_job(broker_url, job.machine_class, job.id)
