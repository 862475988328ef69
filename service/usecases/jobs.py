"""A claimed job's end: finished, failed for good with a job-failure alert, or back to the queue."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain.vocabulary import AlertKind
from service.models import Alert, Job, Model, Run
from service.models.base import utc_now
from service.usecases.runs import finish_if_complete

log = logging.getLogger("fusionwatch.queue")


def finish_job(session: Session, job: Job) -> None:
    job.state, job.finished_at = "done", utc_now()
    session.flush()
    finish_if_complete(session, job.run_id)


def fail_job(session: Session, job: Job, reason: str) -> Alert:
    """Mark the job failed for good, with its reason and a job-failure alert; returns the alert."""
    job.state, job.error, job.finished_at = "failed", reason[:4000], utc_now()
    model = session.get(Model, job.model_id)
    run = session.get(Run, job.run_id)
    alert = Alert(
        project_id=run.project_id,
        run_id=run.id,
        kind=AlertKind.JOB_FAILURE,
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
            alerts.append(fail_job(session, job, reason).id)
    session.flush()
    return alerts
