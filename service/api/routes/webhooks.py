"""Inbound webhooks: GitHub push events (de-duplicated by delivery id) and a generic CI hook.

Both authenticate the sender the same way: a project with a webhook secret takes only deliveries
signed with it (`X-Hub-Signature-256: sha256=<HMAC-SHA256 of the body>`, GitHub's header); a project
without one takes a write token for it (service/auth.py), which GitHub cannot send.
"""

from __future__ import annotations

import hashlib
import hmac
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from optimizer.text import shorten
from service.api.deps import ServicesDep
from service.api.request_bodies import SpooledBody, parse_json
from service.api.uploads import read_uploads
from service.auth import may_write_to, resolve_principal
from service.commands.receive_ci_hook import MAX_DELIVERY_ID, check_sender, receive_ci_hook
from service.commands.receive_push import receive_push
from service.domain.commits import CommitInfo
from service.errors import Invalid, Unauthorized
from service.schemas.github import Delivery, GitHubPush
from service.schemas.requests import CiWebhook

router = APIRouter(tags=["webhooks"])

@router.post("/webhooks/github", status_code=202)
async def receive_github(
    request: Request,
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
    authorize = partial(_authenticate_sender, request, body=body, header=x_hub_signature_256)
    return await run_in_threadpool(receive_push, services, str(name), x_github_event, x_github_delivery, push,
                                   authorize)


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


@router.post("/webhooks/ci", status_code=202)
async def receive_ci(
    request: Request,
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
    read = None
    if files:  # the sender is checked before its uploads are read (and again as the run is written)
        await run_in_threadpool(check_sender, services, body.project, sender)
        read = await run_in_threadpool(read_uploads, files, services.upload_limits.max_bytes)
    info = CommitInfo(body.sha, body.branch, body.parents, body.message, body.author, body.timestamp)
    return await run_in_threadpool(receive_ci_hook, services, body.project, info, read, x_fusionwatch_delivery, sender)
