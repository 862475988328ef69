"""A GitHub push is received: its commits are recorded oldest first, each the parent of the next, and
its head commit is submitted (the project's models measured again); a delivery id seen before is
answered as a duplicate, and the run's jobs are announced once committed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.adapters import queue
from service.domain.commits import CommitInfo
from service.errors import Invalid
from service.models import Project, WebhookDelivery
from service.services import Services
from service.usecases.commits import record_commit
from service.usecases.push_models import Uploads, models_at_push
from service.usecases.submissions import Submission, submit_commit


def receive_push(
    services: Services, project: str, event: str, delivery: str, push: Any | None,
    authorize: Callable[[Project], None],
) -> dict[str, Any]:
    """`push`: the payload validated as a push (service/schemas/github.py), None for other events;
    `authorize` checks the sender against the project (its signature, or a write token) and raises to refuse."""
    uploads = None
    if push is not None and push.head_commit is not None:
        # Before the transaction: fetching the pushed commit's models may take a while.
        uploads = pushed_models(services, project, push.head_commit.id, authorize)
    with services.session_factory() as session:
        try:
            with session.begin():
                found = services.known_projects.get(session, project)
                authorize(found)
                if not delivery or len(delivery) > 100:
                    raise Invalid("X-GitHub-Delivery header is missing or longer than 100 characters")
                if session.scalar(select(WebhookDelivery.id).where(WebhookDelivery.delivery_id == delivery)):
                    return {"status": "duplicate", "delivery": delivery}
                if event == "ping":
                    return {"status": "pong"}
                if event != "push":
                    return {"status": "ignored", "event": event[:50]}
                submission = _record_push(session, services, found, push, uploads)
                if submission is None:
                    return {"status": "ignored", "reason": "push without a head commit (a branch deletion?)"}
                session.add(WebhookDelivery(delivery_id=delivery, project_id=found.id, event="push",
                                            run_id=submission.run.id if submission.run else None))
                session.flush()
        except IntegrityError:  # the same delivery, concurrently: its twin started the run
            return {"status": "duplicate", "delivery": delivery}
    queue.dispatch(submission.jobs, services.broker_url)
    run_id = submission.run.id if submission.run else None
    return {"status": "accepted", "run_id": run_id, "run_url": f"/api/v1/runs/{run_id}", "jobs": len(submission.jobs)}


def pushed_models(services: Services, project: str, sha: str, authorize: Callable[[Project], None]) -> Uploads | None:
    """The models of the project's repository at `sha` (service/usecases/push_models.py), fetched once the
    sender is one the project takes; None for an engine project (its registered models run again)."""
    with services.read_session_factory() as session:
        found = services.known_projects.get(session, project)
        authorize(found)
    settings = services.settings
    return models_at_push(found, sha, settings.data_dir, services.upload_limits.max_bytes,
                          settings.allow_file_repositories, settings.git_fetch_timeout_s)


def _record_push(session: Session, services: Services, project: Project, push: Any,
                 uploads: Uploads | None) -> Submission | None:
    """The pushed commits, oldest first, each the parent of the next; a run for the head commit."""
    head = push.head_commit
    if head is None:
        return None
    branch = push.ref.removeprefix("refs/heads/") or "main"
    previous, listed = push.listed_before_head()
    for entry in listed:
        record_commit(session, project, entry.id, branch, [previous] if _is_sha(previous) else [],
                      entry.message, entry.author_name()[:255], _timestamp(entry))
        previous = entry.id
    info = CommitInfo(head.id, branch, [previous] if _is_sha(previous) else [], head.message,
                      head.author_name()[:255], _timestamp(head))
    return submit_commit(session, services.store, services.upload_limits, project, info, uploads or [], "github",
                         services.settings.machine_class, all_models_when_none=uploads is None)


def _is_sha(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 64 and value.strip("0") != ""


def _timestamp(entry: Any) -> datetime | None:
    stamp = entry.timestamp
    return stamp if stamp is not None and stamp.tzinfo else None
