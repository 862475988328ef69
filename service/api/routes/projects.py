"""Projects, their models (uploads), outbound hooks and history."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, BackgroundTasks, File, Form, Header, Query, Request, UploadFile
from fastapi.responses import Response

from service import queue
from service.api.deps import ReadSessionDep, ServicesDep, SessionDep
from service.api.uploads import read_uploads
from service.auth import may_create_projects, may_write_to
from service.errors import Invalid
from service.models.vocabulary import ENGINES, LEVEL_NAMES
from service.schemas.requests import HookCreate, ProjectCreate
from service.usecases import history as history_usecase
from service.usecases import projects
from service.usecases.change_point_windows import SeriesWindows, store_computed
from service.usecases.history_csv import history_csv, wants_csv
from service.usecases.models import get_model, ingest_upload, project_models
from service.usecases.submissions import CommitInfo, submit_commit

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
def create_project(request: Request, session: SessionDep, services: ServicesDep, body: ProjectCreate) -> dict[str, Any]:
    may_create_projects(request)
    with session.begin():
        project = projects.create_project(session, body.name, body.webhook_secret, body.settings, body.kind,
                                          body.repository, services.settings.allow_file_repositories)
    return project_dict(project)


@router.get("/projects")
def read_projects(
    session: SessionDep, skip: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> dict[str, Any]:
    rows, total = projects.list_projects(session, skip, limit)
    return {"items": [project_dict(p) for p in rows], "total": total}


@router.get("/projects/{project}")
def read_project(session: SessionDep, project: str) -> dict[str, Any]:
    found = projects.get_project(session, project)
    models = project_models(session, found)
    return project_dict(found) | {"models": [m.name for m in models]}


@router.post("/projects/{project}/hooks", status_code=201)
def create_hook(request: Request, session: SessionDep, project: str, body: HookCreate) -> dict[str, Any]:
    with session.begin():
        found = projects.get_project(session, project)
        may_write_to(request, found)
        hook = projects.add_hook(session, found, body.url, body.format)
    return {"id": hook.id, "url": hook.url, "format": hook.format}


# A plain `def`: reading and checking the upload is blocking work, so FastAPI runs it in its thread pool.
@router.post("/projects/{project}/models", status_code=201)
def upload_model(
    request: Request,
    session: SessionDep,
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
    with session.begin():
        found = projects.get_project(session, project)
        may_write_to(request, found)
        if commit is None:
            ingested = ingest_upload(session, services.store, services.upload_limits, found, files, name)
            submission = None
        else:
            submission = submit_commit(
                session, services.store, services.upload_limits, found,
                CommitInfo(commit, branch, parents or [], message), [(name, files)], "upload",
                services.settings.machine_class,
            )
            ingested = submission.ingested[0]
    reply: dict[str, Any] = {
        "project": found.name,
        "model": ingested.model.name,
        "sha256": ingested.file.sha256,
        "size_bytes": ingested.file.size_bytes,
        "opset": ingested.file.opset,
        "nodes": ingested.file.nodes,
        "file_is_new": ingested.file_is_new,
    }
    if submission is not None and submission.run is not None:
        queue.dispatch(submission.jobs, services.settings.broker_url)
        reply |= {"run_id": submission.run.id, "run_url": f"/api/v1/runs/{submission.run.id}", "jobs": len(submission.jobs)}
    return reply


@router.get("/projects/{project}/models")
def read_models(session: SessionDep, project: str) -> dict[str, Any]:
    found = projects.get_project(session, project)
    models = project_models(session, found)
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
    if engine is not None and engine not in ENGINES:
        raise Invalid(f"engine must be one of {list(ENGINES)}, got {engine[:50]!r}")
    if level is not None and level not in LEVEL_NAMES:
        raise Invalid(f"level must be one of {list(LEVEL_NAMES)}, got {level[:50]!r}")
    found = projects.get_project(session, project)
    series_model = get_model(session, found, model) if model else None
    computed: list[SeriesWindows] = []
    series = history_usecase.history(session, found, series_model, engine, level, limit, computed)
    # Change-point windows computed for this read are stored after the reply, in a writing transaction.
    if computed:
        background.add_task(store_computed, services.session_factory, computed)
    if wants_csv(format, accept):
        return Response(history_csv(series), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{found.name}-history.csv"', "Vary": "Accept"})
    # A poller that sends back the ETag it got is told 304 when nothing changed, instead of 3 MB again.
    # The tag is the reply's hash with each series' points standing for themselves by theirs.
    etag = '"' + hashlib.sha1(orjson.dumps({"project": found.name, "series": [
        entry | {"points": entry["points"].digest} for entry in series]}), usedforsecurity=False).hexdigest() + '"'
    if if_none_match.strip() == "*" or etag in (tag.strip().removeprefix("W/") for tag in if_none_match.split(",")):
        return Response(status_code=304, headers={"ETag": etag})
    # Plain JSON already, rendered here in the worker thread by orjson rather than validated and encoded
    # again by FastAPI (json.dumps alone took 100 ms of a 10,000-commit read); each series' points were
    # rendered once, when their results were stored (usecases/history_points.py), and are spliced in.
    body = orjson.dumps({"project": found.name, "series": [
        entry | {"points": orjson.Fragment(entry["points"].rendered)} for entry in series]})
    return Response(body, media_type="application/json", headers={"ETag": etag, "Vary": "Accept"})
