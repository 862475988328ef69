"""Celery, for users who outgrow one machine: `fusionwatch worker --queue cpu` on any machine that
reaches the database, the data directory and the broker (FUSIONWATCH_BROKER_URL=redis://...).

The job row stays the truth (service/adapters/queue.py). Tasks are acknowledged late and rejected when the
worker process is lost, so a job whose process is killed mid-run is delivered again; the redelivery
takes the job over while attempts remain, and a result is written once per job.
"""

from __future__ import annotations

import logging
import socket
from functools import cache

from celery import Celery
from celery.signals import worker_process_init

from service.adapters.celery_publish import RUN_JOB, celery_app
from service.adapters.db import make_engine
from service.adapters.engines.custom_ops import load_custom_ops
from service.adapters.machine import limit_address_space
from service.core.config import settings
from service.services import worker_services

log = logging.getLogger("fusionwatch.worker")


@cache
def celery_app_for(broker_url: str) -> Celery:
    """The broker's Celery app with the job task registered: what a worker process runs."""
    app = celery_app(broker_url)
    app.task(name=RUN_JOB, bind=True)(_run_job)
    return app


@worker_process_init.connect
def _limit_pool_process(**_) -> None:
    # Each pool process runs hostile models: cap its memory as the embedded worker's is capped.
    limit_address_space(settings.job_memory_mb)


def _run_job(task, job_id: int) -> str:
    # Imported in the pool process, after Celery forked it: what measuring loads (the engines' native
    # libraries and their OpenMP runtimes) must not be initialised in the parent a fork copies.
    from service.commands.execute_job import execute_delivered_job

    engine = make_engine(settings.database_url)
    services = worker_services(engine, settings, custom_ops=load_custom_ops(settings.custom_ops),
                               broker_url=task.app.conf.broker_url)
    try:
        return execute_delivered_job(services, job_id, f"celery-{socket.gethostname()}-{task.request.hostname}")
    finally:
        engine.dispose()


# For `celery -A service.worker.celery_app worker` and `fusionwatch worker`: the broker from the settings.
app = celery_app_for(settings.broker_url or "redis://127.0.0.1:6379/0")
