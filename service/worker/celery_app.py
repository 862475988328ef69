"""Celery, for users who outgrow one machine: `fusionwatch worker --queue cpu` on any machine that
reaches the database, the data directory and the broker (FUSIONWATCH_BROKER_URL=redis://...).

The job row stays the truth (service/queue.py). Tasks are acknowledged late and rejected when the
worker process is lost, so a job whose process is killed mid-run is delivered again; the redelivery
takes the job over while attempts remain, and a result is written once per job.
"""

from __future__ import annotations

import logging
import socket
from functools import cache

from celery import Celery
from celery.signals import worker_process_init

from service import queue
from service.core.config import settings
from service.db import make_engine, make_session_factory
from service.engines.custom_ops import load_custom_ops
from service.machine import describe_machine, limit_address_space
from service.storage import ModelStore

log = logging.getLogger("fusionwatch.worker")


@cache
def celery_app_for(broker_url: str) -> Celery:
    app = Celery("fusionwatch", broker=broker_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # one job at a time per process: timings stay clean
        task_default_queue="cpu",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.task(name="fusionwatch.run_job", bind=True)(_run_job)
    return app


@worker_process_init.connect
def _limit_pool_process(**_) -> None:
    # Each pool process runs hostile models: cap its memory as the embedded worker's is capped.
    limit_address_space(settings.job_memory_mb)


def _run_job(task, job_id: int) -> str:
    from service.core.limits import load_limits
    from service.models import Job
    from service.worker.execute import execute_job

    engine = make_engine(settings.database_url)
    session_factory = make_session_factory(engine)
    worker = f"celery-{socket.gethostname()}-{task.request.hostname}"
    try:
        with session_factory() as session:
            job = session.get(Job, job_id)
            if job is None or job.state in ("done", "failed"):
                return f"job {job_id}: nothing to do"
            if job.state == "running" and job.attempts >= settings.max_attempts:
                # Delivered again after its process was lost on the last allowed attempt.
                alert = queue.fail(session, job, f"the worker process was lost while running it ({job.attempts} attempts)")
                session.commit()
                return f"job {job_id}: failed ({alert.message})"
            if not queue.claim(session, job_id, worker, from_states=("queued", "running")):
                return f"job {job_id}: taken by another worker"
        execute_job(
            session_factory, job_id, ModelStore(settings.data_dir), load_limits(),
            describe_machine(settings.machine_class), load_custom_ops(settings.custom_ops), task.app.conf.broker_url,
        )
        return f"job {job_id}: done"
    finally:
        engine.dispose()


# For `celery -A service.worker.celery_app worker` and `fusionwatch worker`: the broker from the settings.
app = celery_app_for(settings.broker_url or "redis://127.0.0.1:6379/0")
