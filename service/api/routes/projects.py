"""Projects, their models (uploads), outbound hooks and history."""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, BackgroundTasks, File, Form, Header, Query, Request, UploadFile
from fastapi.responses import Response

from service.api.deps import ReadSessionDep, ServicesDep, SessionDep
from service.api.history_csv import history_csv, wants_csv
from service.api.uploads import read_uploads
from service.auth import may_create_projects, may_write_to
from service.commands.add_hook import add_hook
from service.commands.create_project import create_project as create_project_command
from service.commands.upload_model import upload_model as upload_model_command
from service.domain.commits import CommitInfo
from service.queries.projects import project_and_models, project_history, projects_page
from service.schemas.requests import HookCreate, ProjectCreate

router = APIRouter(tags=["projects"])


def project_dict(project) -> dict[str, Any]:
    # Never the webhook secret: only whether there is one.
    return {
        "name": project.name,
        "has_webhook_secret": project.webhook_secret is not None,
        "settings": project.settings,
        "kind": project.kind,
        "repository": project.repository,
        "created_at": project.created_at.isoformat(),
    }


@router.post("/projects", status_code=201)
def create_project(request: Request, services: ServicesDep, body: ProjectCreate) -> dict[str, Any]:
    may_create_projects(request)
    return project_dict(create_project_command(services, body.name, body.webhook_secret, body.settings, body.kind,
                                               body.repository))


@router.get("/projects")
def read_projects(
    session: SessionDep, skip: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> dict[str, Any]:
    rows, total = projects_page(session, skip, limit)
    return {"items": [project_dict(p) for p in rows], "total": total}


@router.get("/projects/{project}")
def read_project(session: SessionDep, project: str) -> dict[str, Any]:
    found, models = project_and_models(session, project)
    return project_dict(found) | {"models": [m.name for m in models]}


@router.post("/projects/{project}/hooks", status_code=201)
def create_hook(request: Request, services: ServicesDep, project: str, body: HookCreate) -> dict[str, Any]:
    hook = add_hook(services, project, body.url, body.format, partial(may_write_to, request))
    return {"id": hook.id, "url": hook.url, "format": hook.format}


# A plain `def`: reading and checking the upload is blocking work, so FastAPI runs it in its thread pool.
@router.post("/projects/{project}/models", status_code=201)
def upload_model(
    request: Request,
    services: ServicesDep,
    project: str,
    file: Annotated[UploadFile, File(description="an .onnx file, or a .zip of one .onnx and its external data")],
    data: Annotated[list[UploadFile] | None, File(description="external-data files the .onnx names")] = None,
    name: Annotated[str | None, Form(description="the model's name in the project; default: the file name")] = None,
    commit: Annotated[str | None, Form(description="measure it at this commit")] = None,
    branch: Annotated[str, Form()] = "main",
    parents: Annotated[list[str] | None, Form()] = None,
    message: Annotated[str, Form()] = "",
) -> dict[str, Any]:
    files = read_uploads([file, *(data or [])], services.upload_limits.max_bytes)
    at = None if commit is None else CommitInfo(commit, branch, parents or [], message)
    uploaded = upload_model_command(services, project, files, name, at, partial(may_write_to, request))
    ingested, submission = uploaded.ingested, uploaded.submission
    reply: dict[str, Any] = {
        "project": uploaded.project.name,
        "model": ingested.model.name,
        "sha256": ingested.file.sha256,
        "size_bytes": ingested.file.size_bytes,
        "opset": ingested.file.opset,
        "nodes": ingested.file.nodes,
        "file_is_new": ingested.file_is_new,
    }
    if submission is not None and submission.run is not None:
        reply |= {"run_id": submission.run.id, "run_url": f"/api/v1/runs/{submission.run.id}", "jobs": len(submission.jobs)}
    return reply


@router.get("/projects/{project}/models")
def read_models(session: SessionDep, project: str) -> dict[str, Any]:
    _, models = project_and_models(session, project)
    return {"items": [{"name": m.name, "latest_file_id": m.latest_file_id} for m in models], "total": len(models)}


@router.get("/projects/{project}/history")
def read_history(
    session: ReadSessionDep,
    services: ServicesDep,
    background: BackgroundTasks,
    project: str,
    if_none_match: Annotated[str, Header()] = "",
    accept: Annotated[str, Header()] = "",
    format: Annotated[str | None, Query(pattern="^(json|csv)$")] = None,
    model: str | None = None,
    engine: str | None = None,
    level: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    read = project_history(session, services, project, model, engine, level, limit, background.add_task)
    if wants_csv(format, accept):
        return Response(history_csv(read.series), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{read.project.name}-history.csv"', "Vary": "Accept"})
    # A poller that sends back the ETag it got is told 304 when nothing changed, instead of 3 MB again.
    # The tag is the reply's hash with each series' points standing for themselves by theirs.
    etag = '"' + hashlib.sha1(orjson.dumps({"project": read.project.name, "series": [
        entry | {"points": entry["points"].digest} for entry in read.series]}), usedforsecurity=False).hexdigest() + '"'
    if if_none_match.strip() == "*" or etag in (tag.strip().removeprefix("W/") for tag in if_none_match.split(",")):
        return Response(status_code=304, headers={"ETag": etag})
    # Plain JSON already, rendered here in the worker thread by orjson rather than validated and encoded
    # again by FastAPI (json.dumps alone took 100 ms of a 10,000-commit read); each series' points were
    # rendered once, when their results were stored (usecases/history_points.py), and are spliced in.
    body = orjson.dumps({"project": read.project.name, "series": [
        entry | {"points": orjson.Fragment(entry["points"].rendered)} for entry in read.series]})
    return Response(body, media_type="application/json", headers={"ETag": etag, "Vary": "Accept"})
