"""A CI hook is received: the commit it names is submitted with the model exports it carries (or the
project's models measured again), and the run's jobs are announced once committed. A delivery id seen
before is answered with the first delivery's run instead of starting another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.adapters import queue
from service.commands.receive_push import pushed_models
from service.domain.commits import CommitInfo
from service.errors import Conflict
from service.models import Job, Model, Project, WebhookDelivery
from service.services import Services
from service.usecases.submissions import submit_commit

MAX_DELIVERY_ID = 90  # webhook_delivery.delivery_id holds 100, with a "ci:" prefix


def check_sender(services: Services, project: str, authorize: Callable[[Project], None]) -> None:
    """Refuse an unauthorized sender before its uploads are read (the run checks it again as it is written)."""
    with services.read_session_factory() as session:
        authorize(services.known_projects.get(session, project))


def receive_ci_hook(
    services: Services, project: str, info: CommitInfo, files: list | None, delivery: str,
    authorize: Callable[[Project], None],
) -> dict[str, Any]:
    """`files`: the model exports the hook carried, one model each; None: the commit's models are fetched
    from the project's repository (or, for an engine project, its registered models run again).
    `delivery`: the sender's id for this delivery, or ""."""
    uploads = [(None, [item]) for item in files] if files is not None else pushed_models(services, project, info.sha,
                                                                                          authorize)
    key = f"ci:{delivery}" if delivery else None
    with services.session_factory() as session:
        try:
            with session.begin():
                found = services.known_projects.get(session, project)
                authorize(found)
                if key is not None and (earlier := _earlier_delivery(session, found, key)) is not None:
                    return earlier
                submission = submit_commit(session, services.store, services.upload_limits, found, info,
                                           uploads or [], "ci", services.settings.machine_class,
                                           all_models_when_none=uploads is None)
                if key is not None:
                    session.add(WebhookDelivery(delivery_id=key, project_id=found.id, event="ci",
                                                run_id=submission.run.id if submission.run else None))
                    session.flush()
        except IntegrityError:  # the same delivery, concurrently: its twin started the run
            if key is None:
                raise
            with session.begin():
                earlier = _earlier_delivery(session, services.known_projects.get(session, project), key)
            if earlier is None:
                raise
            return earlier
    queue.dispatch(submission.jobs, services.broker_url)
    run_id = submission.run.id if submission.run else None
    return {"run_id": run_id, "run_url": f"/api/v1/runs/{run_id}", "jobs": len(submission.jobs),
            "models": [i.model.name for i in submission.ingested]}


def _earlier_delivery(session: Session, project: Project, key: str) -> dict[str, Any] | None:
    earlier = session.scalar(select(WebhookDelivery).where(WebhookDelivery.delivery_id == key))
    if earlier is None:
        return None
    if earlier.project_id != project.id:
        raise Conflict(f"delivery id {key.removeprefix('ci:')[:MAX_DELIVERY_ID]!r} was already used for another project")
    models = session.scalars(
        select(Model.name).join(Job, Job.model_id == Model.id).where(Job.run_id == earlier.run_id).distinct()
    ).all()
    jobs = session.scalar(select(func.count()).select_from(Job).where(Job.run_id == earlier.run_id)) or 0
    return {"status": "duplicate", "run_id": earlier.run_id, "run_url": f"/api/v1/runs/{earlier.run_id}",
            "jobs": jobs, "models": sorted(models)}
