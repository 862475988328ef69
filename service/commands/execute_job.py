"""A job is executed: first the fused-op counts of its run and of the runs waiting (the fusion verdicts,
service/commands/count_run_fusions.py), then measure its model file, record the result once, deliver its
alerts, queue any re-measurement and place the series' change-point windows."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from optimizer import ModelLoadError
from service.adapters import queue
from service.adapters.engines import EngineError
from service.adapters.feed_sets import FeedSetStore
from service.adapters.machine import describe_machine
from service.adapters.measure import measure
from service.adapters.paired_measure import CannotPair, measure_paired
from service.commands.count_run_fusions import count_run_fusions, count_waiting_runs
from service.domain.measurement import Measurement
from service.domain.protocol import Protocol, protocol_for
from service.models import Job, Model, ModelFile, Project, Result, Run
from service.services import Services
from service.usecases.delivery import deliver
from service.usecases.feed_sets import load_for_job, model_feed_sets
from service.usecases.history_windows import arrived, compute_windows
from service.usecases.jobs import fail_job, finish_job
from service.usecases.paired_baseline import baseline_file
from service.usecases.remeasure import remeasure_job
from service.usecases.results import get_or_create_machine, record_result

log = logging.getLogger("fusionwatch.worker")


def execute_job(services: Services, job_id: int) -> None:
    """Measure a job the caller has claimed. A model that cannot be loaded or run fails the job at once
    (retrying would fail the same way); a crash or a kill of this process is the caller's to retry.
    A suspected timing alert queues its re-measurement (service/usecases/remeasure.py), announced to
    the services' broker when jobs go through Celery."""
    session_factory = services.session_factory
    with session_factory() as session:
        run_id = session.get(Job, job_id).run_id
    count_run_fusions(services, run_id)  # fusion verdicts first: seconds, where timing takes minutes
    count_waiting_runs(services)
    with session_factory() as session:
        job = session.get(Job, job_id)
        if session.scalar(select(Result.id).where(Result.job_id == job_id)) is not None:
            finish_job(session, job)  # an earlier attempt recorded it, then died before saying so
            session.commit()
            return
        file = session.get(ModelFile, job.model_file_id)
        run = session.get(Run, job.run_id)
        project = session.get(Project, run.project_id)
        protocol = protocol_for(project.settings)
        stored = (file.sha256, file.filename, list(file.data_files))
        engine, level = job.engine, job.level
        own_feed_sets = model_feed_sets(session, job.model_id)
    store, limits = services.store, services.upload_limits.load
    started = time.perf_counter()
    try:
        path = store.get(*stored).path
        feed_sets, unusable = load_for_job(FeedSetStore.beside(store), own_feed_sets, path, limits)
        measurement = measure(path, engine, level, protocol, limits, custom_ops=services.custom_ops,
                              feed_sets=feed_sets, unusable_feed_sets=unusable)
        measurement.paired = _pair_with_baseline(services, job_id, measurement, path, protocol)
    except (EngineError, ModelLoadError, FileNotFoundError) as error:
        _fail(services, job_id, store.shown(str(error)))
        return
    except Exception as error:  # a bug of ours on this model: the job says so, the worker carries on
        log.exception("job crashed", extra={"job_id": job_id})
        _fail(services, job_id, store.shown(f"internal error while measuring ({type(error).__name__}: {error})"))
        return
    with session_factory() as session:
        job = session.get(Job, job_id)
        machine_row = get_or_create_machine(session, describe_machine(services.settings.machine_class))
        result, alerts = record_result(
            session, session.get(Run, job.run_id), session.get(Model, job.model_id), measurement, machine_row,
            job_id=job.id, model_file_id=job.model_file_id, store=store,
        )
        again = remeasure_job(session, result, alerts)  # first: the run then waits for it
        finish_job(session, job)
        session.commit()
        alert_ids = [a.id for a in alerts]
        series = arrived(result)
    queue.dispatch([again] if again else [], services.broker_url)
    log.info("job done", extra={"job_id": job_id, "seconds": round(time.perf_counter() - started, 3), "alerts": len(alert_ids)})
    deliver(session_factory, alert_ids)
    # Once the result is committed: the first history read then finds the series' change-point
    # windows stored (service/usecases/history_windows.py).
    compute_windows(session_factory, session_factory, [series])


def execute_delivered_job(services: Services, job_id: int, worker: str) -> str:
    """A job id a broker delivered (service/worker/celery_app.py): claim it, unless it is settled or
    another worker holds it, and execute it. Returns what happened, for the worker's log."""
    with services.session_factory() as session:
        job = session.get(Job, job_id)
        if job is None or job.state in ("done", "failed"):
            return f"job {job_id}: nothing to do"
        if job.state == "running" and job.attempts >= services.settings.max_attempts:
            # Delivered again after its process was lost on the last allowed attempt.
            alert = fail_job(session, job, f"the worker process was lost while running it ({job.attempts} attempts)")
            session.commit()
            return f"job {job_id}: failed ({alert.message})"
        if not queue.claim(session, job_id, worker, from_states=("queued", "running")):
            return f"job {job_id}: taken by another worker"
    execute_job(services, job_id)
    return f"job {job_id}: done"


def _pair_with_baseline(
    services: Services, job_id: int, measurement: Measurement, path: Path, protocol: Protocol
) -> dict[str, Any] | None:
    """The job's baseline file timed beside its own, alternately (service/adapters/paired_measure.py),
    when one is stored; what stopped it from pairing otherwise, since the timing verdict then falls
    back on the unpaired window."""
    if protocol.paired_max_seconds <= 0:
        return None
    with services.session_factory() as session:
        job = session.get(Job, job_id)
        machine_class = describe_machine(services.settings.machine_class)["machine_class"]
        baseline = baseline_file(session, job, measurement, machine_class)
    if baseline is None:
        return None
    try:
        other = services.store.get(*baseline.stored).path
        timing = measure_paired(other, path, measurement.engine, measurement.level, protocol,
                                services.upload_limits.load, services.custom_ops)
    except (CannotPair, EngineError, ModelLoadError, FileNotFoundError) as error:
        log.warning("not paired", extra={"job_id": job_id, "reason": str(error)[:300]})
        return {"baseline_commit": baseline.commit_sha, "unavailable": services.store.shown(str(error))[:500]}
    return timing.to_dict(baseline.commit_sha)


def _fail(services: Services, job_id: int, reason: str) -> None:
    with services.session_factory() as session:
        alert = fail_job(session, session.get(Job, job_id), reason)
        session.commit()
    deliver(services.session_factory, [alert.id])
