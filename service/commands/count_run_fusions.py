"""Before a worker times a job, it takes the fused-op counts of every queued job of its machine class
not counted yet, oldest run first (seconds a model, where timing takes minutes), so each run's fusion
verdict (service/usecases/fusion_verdict.py) is known long before its timings, and a commit pushed while
another is being timed waits for one job, not for that commit's whole run: `submit --wait-for fusions`
returns on it.

A second worker doing the same meanwhile writes the same counts, and a job counted already is not
counted again. A file that cannot be counted records why; its job then fails as it would have (its
measurement raises the same error).
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import select, update

from optimizer import ModelLoadError
from service.adapters.count_fusions import count_fusions
from service.adapters.engines import EngineError
from service.adapters.machine import describe_machine
from service.domain.measurement import fingerprint
from service.domain.protocol import protocol_for
from service.models import Job, ModelFile, Project, Run
from service.services import Services
from service.usecases.runs import REMEASURE_TRIGGER

log = logging.getLogger("fusionwatch.worker")

# Runs counted before each job is timed: a backlog of pushes delays one job by this many runs' counts at most.
MOST_RUNS_PER_JOB = 20


def count_waiting_runs(services: Services) -> int:
    """Count the queued jobs of this worker's machine class, run by run, oldest first; returns how many."""
    with services.session_factory() as session:
        run_ids = session.scalars(
            select(Job.run_id).where(Job.state == "queued", Job.counts.is_(None),
                                     Job.machine_class == services.settings.machine_class)
            .group_by(Job.run_id).order_by(Job.run_id).limit(MOST_RUNS_PER_JOB)
        ).all()
    return sum(count_run_fusions(services, run_id) for run_id in run_ids)


def count_run_fusions(services: Services, run_id: int) -> int:
    """Count the fused ops of the run's jobs that are neither counted nor finished; returns how many were
    counted. A run of one job, or a re-measurement (its counts are the first run's), is left alone:
    its verdict comes with its results."""
    with services.session_factory() as session:
        run = session.get(Run, run_id)
        if run is None or run.trigger == REMEASURE_TRIGGER:
            return 0
        rows = session.execute(
            select(Job.id, Job.model_id, Job.engine, Job.level, ModelFile.sha256, ModelFile.filename,
                   ModelFile.data_files)
            .join(ModelFile, ModelFile.id == Job.model_file_id)
            .where(Job.run_id == run_id, Job.counts.is_(None), Job.state.in_(("queued", "running")),
                   Job.machine_class == services.settings.machine_class)
            .order_by(Job.id)
        ).all()
        if len(rows) < 2:
            return 0
        project = session.get(Project, run.project_id)
        protocol, project_id = protocol_for(project.settings), project.id
    machine_class = describe_machine(services.settings.machine_class)["machine_class"]
    started = time.perf_counter()
    for row in rows:
        if row.level == "disabled":  # no rule runs there: nothing to lose, nothing to count first
            counts: dict = {"skipped": "level disabled"}
            _record(services, row.id, counts)
            continue
        try:
            path = services.store.get(row.sha256, row.filename, list(row.data_files)).path
            counted = count_fusions(path, row.engine, row.level, protocol, services.upload_limits.load,
                                    services.custom_ops)
            counts = {"fingerprint": fingerprint(project_id, row.model_id, counted, machine_class),
                      "engine_version": counted.engine_version, "fusions": counted.fusions,
                      "ops_after": counted.ops_after}
        except (EngineError, ModelLoadError, FileNotFoundError) as error:
            counts = {"error": services.store.shown(str(error))[:500]}
        _record(services, row.id, counts)
    log.info("run counted", extra={"run_id": run_id, "jobs": len(rows),
                                   "seconds": round(time.perf_counter() - started, 3)})
    return len(rows)


def _record(services: Services, job_id: int, counts: dict) -> None:
    with services.session_factory() as session:
        session.execute(update(Job).where(Job.id == job_id, Job.counts.is_(None)).values(counts=counts))
        session.commit()
