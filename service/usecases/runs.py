"""Start a run for a commit (one job per model × engine × level of the project's protocol) and read
its progress and verdict."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from service.adapters.db import adopt_inserted
from service.domain.protocol import protocol_for
from service.domain.vocabulary import NOT_FINDINGS, REGRESSION_KINDS
from service.errors import NotFound
from service.models import Alert, Commit, Job, Model, Project, Run
from service.models.base import utc_now
from service.usecases.fusion_verdict import FusionVerdict, fusion_verdict

# A run holding one re-measurement of a commit whose timing alert is suspected (service/usecases/remeasure.py).
REMEASURE_TRIGGER = "remeasure"

# Every webhook's path: statements built once, Core INSERTs (service/adapters/db.py: adopt_inserted).
_INSERT_RUN = insert(Run.__table__).returning(Run.__table__.c.id)
_INSERT_JOBS = insert(Job.__table__).returning(Job.__table__.c.id, sort_by_parameter_order=True)


def start_run(
    session: Session,
    project: Project,
    commit: Commit,
    trigger: str,
    models: list[Model],
    machine_class: str = "cpu",
) -> tuple[Run, list[Job]]:
    """A run with its jobs queued. Dispatch them (service/adapters/queue.py) after the transaction commits."""
    protocol = protocol_for(project.settings)
    created = utc_now()
    run = {"project_id": project.id, "commit_id": commit.id, "trigger": trigger, "state": "running" if models else "done",
           "created_at": created, "finished_at": None if models else created}
    run["id"] = session.connection().execute(_INSERT_RUN, run).scalar_one()
    rows = [
        {"run_id": run["id"], "model_id": model.id, "model_file_id": model.latest_file_id, "engine": engine,
         "level": level, "machine_class": machine_class, "state": "queued", "attempts": 0, "worker": None,
         "error": None, "created_at": created, "started_at": None, "finished_at": None, "counts": None}
        for model in models
        for engine in protocol.engines
        for level in protocol.levels
    ]
    ids = session.connection().execute(_INSERT_JOBS, rows).scalars().all() if rows else []
    jobs = [adopt_inserted(session, Job(id=job_id, **row)) for job_id, row in zip(ids, rows, strict=True)]
    return adopt_inserted(session, Run(**run)), jobs


def record_only_run(session: Session, project: Project, commit: Commit, trigger: str) -> Run:
    """A run for results measured elsewhere: no jobs, done when its results are in."""
    run = Run(project_id=project.id, commit_id=commit.id, trigger=trigger, state="done", finished_at=utc_now())
    session.add(run)
    session.flush()
    return run


def finish_if_complete(session: Session, run_id: int) -> None:
    """Done (or failed) once none of its jobs is queued or running, nor a re-measurement of its commit
    (service/usecases/remeasure.py): a suspected timing alert's confirmation is part of the verdict a CI
    step waits for. A re-measurement that ends lets the commit's other runs end too."""
    run = session.get(Run, run_id)
    if run is None or run.state != "running":
        return
    pending = select(func.count()).select_from(Job).where(Job.state.in_(("queued", "running")))
    if session.scalar(pending.where(Job.run_id == run_id)):
        return
    remeasuring = pending.join(Run, Run.id == Job.run_id).where(
        Run.commit_id == run.commit_id, Run.trigger == REMEASURE_TRIGGER, Run.id != run_id
    )
    if run.trigger != REMEASURE_TRIGGER and session.scalar(remeasuring):
        return
    failed = session.scalar(select(func.count()).select_from(Job).where(Job.run_id == run_id, Job.state == "failed"))
    run.state = "failed" if failed else "done"
    run.finished_at = utc_now()
    if run.trigger == REMEASURE_TRIGGER:
        session.flush()
        waiting = session.scalars(
            select(Run.id).where(Run.commit_id == run.commit_id, Run.state == "running", Run.id != run_id)
        ).all()
        for other in waiting:
            finish_if_complete(session, other)


@dataclass
class RunStatus:
    run: Run
    commit: Commit
    project: Project
    jobs_total: int
    jobs_done: int
    jobs_failed: int
    verdict: str  # running, ok, regression, failed
    alerts: list[Alert]
    jobs: list[tuple[Job, str]]  # with the model's name
    fusions: FusionVerdict  # known before the timings are (service/usecases/fusion_verdict.py)


def run_status(session: Session, run_id: int) -> RunStatus:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id}")
    jobs = session.execute(
        select(Job, Model.name).join(Model, Model.id == Job.model_id).where(Job.run_id == run_id).order_by(Job.id)
    ).all()
    alerts = list(session.scalars(select(Alert).where(Alert.run_id == run_id).order_by(Alert.id)))
    done = sum(1 for job, _ in jobs if job.state == "done")
    failed = sum(1 for job, _ in jobs if job.state == "failed")
    if any(a.kind in REGRESSION_KINDS and a.state not in NOT_FINDINGS for a in alerts):
        verdict = "regression"
    elif any(job.state in ("queued", "running") for job, _ in jobs):
        verdict = "running"
    elif failed:
        verdict = "failed"
    else:
        verdict = "ok"
    return RunStatus(
        run=run,
        commit=session.get(Commit, run.commit_id),
        project=session.get(Project, run.project_id),
        jobs_total=len(jobs),
        jobs_done=done,
        jobs_failed=failed,
        verdict=verdict,
        alerts=alerts,
        jobs=[(job, name) for job, name in jobs],
        fusions=fusion_verdict(session, run, list(jobs), alerts),
    )
