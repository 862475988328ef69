"""Inbound webhooks: GitHub push events (de-duplicated by delivery id) and a generic CI hook.

Both authenticate the sender the same way: a project with a webhook secret takes only deliveries
signed with it (`X-Hub-Signature-256: sha256=<HMAC-SHA256 of the body>`, GitHub's header); a project
without one takes a write token for it (service/auth.py), which GitHub cannot send.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from optimizer.text import shorten
from service import queue
from service.api.deps import ServicesDep, SessionDep
from service.api.request_bodies import SpooledBody, parse_json
from service.api.uploads import read_uploads
from service.auth import may_write_to, resolve_principal
from service.errors import Conflict, Invalid, Unauthorized
from service.models import Job, Model, WebhookDelivery
from service.schemas.github import Delivery, GitHubPush, PushCommit
from service.schemas.requests import CiWebhook
from service.usecases.commits import record_commit
from service.usecases.push_models import models_at_push
from service.usecases.submissions import CommitInfo, submit_commit

router = APIRouter(tags=["webhooks"])

MAX_DELIVERY_ID = 90  # webhook_delivery.delivery_id holds 100, with a "ci:" prefix


@router.post("/webhooks/github", status_code=202)
async def receive_github(
    request: Request,
    session: SessionDep,
    services: ServicesDep,
    x_github_event: Annotated[str, Header()] = "",
    x_github_delivery: Annotated[str, Header()] = "",
    x_hub_signature_256: Annotated[str, Header()] = "",
    project: str | None = None,
) -> dict[str, Any]:
    # Who the token says (if any) is looked up before this handler's transaction holds the database.
    await resolve_principal(request)
    body = await request.body()  # at most MAX_GITHUB_BODY (service/api/request_bodies.py)
    payload = parse_json(body, "webhook body")
    if not isinstance(payload, dict):
        raise Invalid("webhook body must be a JSON object")
    delivery = _validated(Delivery, payload)
    # The hook's URL names the project (?project=), else the repository's name does.
    name = project or (delivery.repository.name if delivery.repository else None)
    if not name:
        raise Invalid("no project: add ?project=NAME to the hook's URL, or send a payload with repository.name")
    push = _validated(GitHubPush, payload) if x_github_event == "push" else None
    uploads = None
    if push is not None and push.head_commit is not None:
        # Before the transaction: fetching the pushed commit's models may take a while.
        uploads = await run_in_threadpool(
            _models_at_push, services, str(name), push.head_commit.id,
            partial(_authenticate_sender, request, body=body, header=x_hub_signature_256))
    try:
        with session.begin():
            found = services.known_projects.get(session, str(name))
            _authenticate_sender(request, found, body, x_hub_signature_256)
            if not x_github_delivery or len(x_github_delivery) > 100:
                raise Invalid("X-GitHub-Delivery header is missing or longer than 100 characters")
            if session.scalar(select(WebhookDelivery.id).where(WebhookDelivery.delivery_id == x_github_delivery)):
                return {"status": "duplicate", "delivery": x_github_delivery}
            if x_github_event == "ping":
                return {"status": "pong"}
            if x_github_event != "push":
                return {"status": "ignored", "event": x_github_event[:50]}
            submission = _record_push(session, services, found, push, uploads)
            if submission is None:
                return {"status": "ignored", "reason": "push without a head commit (a branch deletion?)"}
            session.add(WebhookDelivery(delivery_id=x_github_delivery, project_id=found.id, event="push",
                                        run_id=submission.run.id if submission.run else None))
            session.flush()
    except IntegrityError:  # the same delivery, concurrently: its twin started the run
        return {"status": "duplicate", "delivery": x_github_delivery}
    queue.dispatch(submission.jobs, services.settings.broker_url)
    run_id = submission.run.id if submission.run else None
    return {"status": "accepted", "run_id": run_id, "run_url": f"/api/v1/runs/{run_id}", "jobs": len(submission.jobs)}


def _record_push(session, services, project, push: GitHubPush, uploads):
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


def _models_at_push(services, name: str, sha: str, authenticate):
    """The pushed commit's models (service/usecases/push_models.py), once the sender is who the project takes."""
    with services.read_session_factory() as session:
        project = services.known_projects.get(session, name)
        authenticate(project)
    settings = services.settings
    return models_at_push(project, sha, settings.data_dir, services.upload_limits.max_bytes,
                          settings.allow_file_repositories, settings.git_fetch_timeout_s)


def _validated(schema, payload: dict):
    try:
        return schema.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(shorten(str(p), 60) for p in first["loc"]) or "body"
        raise Invalid(f"GitHub delivery: {where}: {first['msg']}") from error


def _authenticate_sender(request: Request, project, body: bytes | SpooledBody | None, header: str) -> None:
    if project.webhook_secret is None:
        may_write_to(request, project)
        return
    if not header.startswith("sha256=") or body is None:
        raise Unauthorized("X-Hub-Signature-256 is missing; this project requires signed deliveries")
    secret = project.webhook_secret.encode()
    if isinstance(body, SpooledBody):
        expected = body.signature(secret)
    else:
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    # As bytes: a header is latin-1, and comparing str with non-ASCII characters raises TypeError.
    if not hmac.compare_digest(expected, header.removeprefix("sha256=").encode("latin-1", "replace")):
        raise Unauthorized("X-Hub-Signature-256 does not match the body signed with the project's secret")


def _earlier_delivery(session, project, key: str) -> dict[str, Any] | None:
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


def _is_sha(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 64 and value.strip("0") != ""


def _timestamp(entry: PushCommit) -> datetime | None:
    stamp = entry.timestamp
    return stamp if stamp is not None and stamp.tzinfo else None


@router.post("/webhooks/ci", status_code=202)
async def receive_ci(
    request: Request,
    session: SessionDep,
    services: ServicesDep,
    x_hub_signature_256: Annotated[str, Header()] = "",
    x_fusionwatch_delivery: Annotated[str, Header()] = "",
) -> dict[str, Any]:
    """JSON `{project, sha, branch, parents?, message?, timestamp?}`; or multipart/form-data with that
    JSON in the field `payload` and the commit's model exports as `files` (each .onnx or .zip one model).
    A signed delivery's signature covers the whole body, multipart included. `X-Fusionwatch-Delivery`
    (the CLI sends a fresh one per `submit`) makes a retried delivery answer with the first one's run
    instead of starting another; without it, each post is a new measurement of the commit."""
    if len(x_fusionwatch_delivery) > MAX_DELIVERY_ID:
        raise Invalid(f"X-Fusionwatch-Delivery is longer than {MAX_DELIVERY_ID} characters")
    await resolve_principal(request)
    # A signed body is spooled to check its signature; unsigned uploads stream to disk as they arrive.
    raw = await SpooledBody.read(request) if x_hub_signature_256 else None
    files: list = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await (raw.replayed(request) if raw else request).form(max_files=64, max_fields=16)
        payload = form.get("payload")
        if not isinstance(payload, str):
            raise Invalid("multipart CI webhook needs the JSON document in the text field 'payload'")
        files = [f for f in form.getlist("files") if not isinstance(f, str)]
        # A file under another name would be dropped without a word, and the run would measure the
        # project's older models as if they were this commit's.
        stray = sorted({key for key, value in form.multi_items() if key != "files" and not isinstance(value, str)})
        if stray:
            raise Invalid(f"multipart CI webhook: file field(s) {', '.join(repr(k) for k in stray[:3])} are not "
                          "read; send the commit's model exports in the field 'files'")
    else:
        payload = raw.whole() if raw is not None else await request.body()
    try:
        body = CiWebhook.model_validate(parse_json(payload, "CI webhook"))
    except ValidationError as error:
        first = error.errors()[0]
        raise Invalid(f"CI webhook: {'.'.join(str(p) for p in first['loc']) or 'body'}: {first['msg']}") from error
    sender = partial(_authenticate_sender, request, body=raw, header=x_hub_signature_256)
    if files:  # the sender is checked before its uploads are read (and again as the run is written)
        await run_in_threadpool(_check_ci_sender, services, body.project, sender)
        read = await run_in_threadpool(read_uploads, files, services.upload_limits.max_bytes)
        uploads = [(None, [item]) for item in read]
    else:
        uploads = await run_in_threadpool(_models_at_push, services, body.project, body.sha, sender)
    return await run_in_threadpool(_start_ci_run, session, services, body, uploads, x_fusionwatch_delivery, sender)


def _check_ci_sender(services, project: str, sender) -> None:
    with services.read_session_factory() as session:
        sender(services.known_projects.get(session, project))


def _start_ci_run(session, services, body: CiWebhook, uploads, delivery: str, sender) -> dict[str, Any]:
    key = f"ci:{delivery}" if delivery else None
    try:
        with session.begin():
            found = services.known_projects.get(session, body.project)
            sender(found)
            if key is not None and (earlier := _earlier_delivery(session, found, key)) is not None:
                return earlier
            info = CommitInfo(body.sha, body.branch, body.parents, body.message, body.author, body.timestamp)
            submission = submit_commit(session, services.store, services.upload_limits, found, info, uploads or [], "ci",
                                       services.settings.machine_class, all_models_when_none=uploads is None)
            if key is not None:
                session.add(WebhookDelivery(delivery_id=key, project_id=found.id, event="ci",
                                            run_id=submission.run.id if submission.run else None))
                session.flush()
    except IntegrityError:  # the same delivery, concurrently: its twin started the run
        if key is None:
            raise
        with session.begin():
            earlier = _earlier_delivery(session, services.known_projects.get(session, body.project), key)
        if earlier is None:
            raise
        return earlier
    queue.dispatch(submission.jobs, services.settings.broker_url)
    run_id = submission.run.id if submission.run else None
    return {"run_id": run_id, "run_url": f"/api/v1/runs/{run_id}", "jobs": len(submission.jobs),
            "models": [i.model.name for i in submission.ingested]}
