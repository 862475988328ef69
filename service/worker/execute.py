"""Run one claimed job: measure its model file, record the result once, and deliver its alerts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from optimizer import LoadLimits, ModelLoadError
from service import queue
from service.alerts.delivery import deliver
from service.alerts.remeasure import remeasure_job
from service.engines import EngineError
from service.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.feed_sets import FeedSetStore
from service.measure import measure
from service.models import Job, Model, ModelFile, Project, Result, Run
from service.protocol import protocol_for
from service.storage import ModelStore
from service.usecases.feed_sets import load_for_job, model_feed_sets
from service.usecases.history_windows import arrived, compute_windows
from service.usecases.results import get_or_create_machine, record_result

log = logging.getLogger("fusionwatch.worker")


def execute_job(
    session_factory: Callable[[], Session],
    job_id: int,
    store: ModelStore,
    limits: LoadLimits,
    machine: dict,
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    broker_url: str | None = None,
) -> None:
    """Measure a job the caller has claimed. A model that cannot be loaded or run fails the job at once
    (retrying would fail the same way); a crash or a kill of this process is the caller's to retry.
    A suspected timing alert queues its re-measurement (service/alerts/remeasure.py), sent to
    `broker_url` when jobs go through Celery."""
    with session_factory() as session:
        job = session.get(Job, job_id)
        if session.scalar(select(Result.id).where(Result.job_id == job_id)) is not None:
            queue.finish(session, job)  # an earlier attempt recorded it, then died before saying so
            session.commit()
            return
        file = session.get(ModelFile, job.model_file_id)
        run = session.get(Run, job.run_id)
        project = session.get(Project, run.project_id)
        protocol = protocol_for(project.settings)
        stored = (file.sha256, file.filename, list(file.data_files))
        engine, level = job.engine, job.level
        own_feed_sets = model_feed_sets(session, job.model_id)
    started = time.perf_counter()
    try:
        path = store.get(*stored).path
        feed_sets, unusable = load_for_job(FeedSetStore.beside(store), own_feed_sets, path, limits)
        measurement = measure(
            path, engine, level, protocol, limits, custom_ops=custom_ops, feed_sets=feed_sets, unusable_feed_sets=unusable
        )
    except (EngineError, ModelLoadError, FileNotFoundError) as error:
        _fail(session_factory, job_id, store.shown(str(error)))
        return
    except Exception as error:  # a bug of ours on this model: the job says so, the worker carries on
        log.exception("job crashed", extra={"job_id": job_id})
        _fail(session_factory, job_id, store.shown(f"internal error while measuring ({type(error).__name__}: {error})"))
        return
    with session_factory() as session:
        job = session.get(Job, job_id)
        machine_row = get_or_create_machine(session, machine)
        result, alerts = record_result(
            session, session.get(Run, job.run_id), session.get(Model, job.model_id), measurement, machine_row,
            job_id=job.id, model_file_id=job.model_file_id, store=store,
        )
        again = remeasure_job(session, result, alerts)  # first: the run then waits for it
        queue.finish(session, job)
        session.commit()
        alert_ids = [a.id for a in alerts]
        series = arrived(result)
    queue.dispatch([again] if again else [], broker_url)
    log.info("job done", extra={"job_id": job_id, "seconds": round(time.perf_counter() - started, 3), "alerts": len(alert_ids)})
    deliver(session_factory, alert_ids)
    # Once the result is committed: the first history read then finds the series' change-point
    # windows stored (usecases/history_windows.py).
    compute_windows(session_factory, session_factory, [series])


def _fail(session_factory: Callable[[], Session], job_id: int, reason: str) -> None:
    with session_factory() as session:
        alert = queue.fail(session, session.get(Job, job_id), reason)
        session.commit()
    deliver(session_factory, [alert.id])
