"""The dashboard's pages and forms. Thin, as the API's routes are: each reads through a use case and
renders a template; a ServiceError becomes an HTML page with its status and message."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service import queue
from service.api.deps import ServicesDep, SessionDep
from service.api.uploads import read_uploads
from service.auth import PAGE_ACCESS, may_create_projects, may_write_to, principal_of
from service.errors import Invalid, NotFound, ServiceError
from service.models.vocabulary import ALERT_KINDS, ALERT_STATES, ENGINES, LEVEL_NAMES, NEEDS_ATTENTION
from service.protocol import protocol_for
from service.usecases import alerts as alert_usecases
from service.usecases.commit_report import commit_report
from service.usecases.models import get_model, ingest_upload, project_models
from service.usecases.overview import latest_runs, project_cells, project_summaries
from service.usecases.projects import create_project, get_project, list_projects
from service.usecases.series import model_history
from service.usecases.submissions import CommitInfo, submit_commit
from service.web.charts import commit_url, fusion_figure, timing_figure
from service.web.sign_in import local_path
from service.web.templating import script_json, templates

router = APIRouter(include_in_schema=False, dependencies=PAGE_ACCESS)

ALERTS_PER_PAGE = 50
REDIRECT = "redirect"  # a form handler's "template" when it succeeded


def page(handler):
    """Render the handler's (template, context); a ServiceError renders error.html with its status."""

    @functools.wraps(handler)
    def render(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            template, context = handler(request, *args, **kwargs)
            if template == REDIRECT:
                return RedirectResponse(context["url"], status_code=303)
            status = context.pop("status_code", 200)
        except ServiceError as error:
            template, context, status = "error.html", {"message": error.message}, error.status
        return templates.TemplateResponse(request, template, context, status_code=status)

    return render


@router.get("/", response_class=HTMLResponse)
@page
def read_overview(request: Request, session: SessionDep):
    open_alerts, open_total = alert_usecases.list_alerts(session, limit=10, states=NEEDS_ATTENTION)
    return "overview.html", {
        "projects": project_summaries(session),
        "runs": latest_runs(session, limit=20),
        "alerts": [alert_usecases.alert_dict(session, a) for a in open_alerts],
        "open_total": open_total,
    }


@router.get("/projects/{project}", response_class=HTMLResponse)
@page
def read_project_page(request: Request, session: SessionDep, project: str):
    found = get_project(session, project)
    return "project.html", {
        "project": found,
        "protocol": protocol_for(found.settings),
        "cells": project_cells(session, found),
        "models": project_models(session, found),
        "runs": latest_runs(session, found, limit=15),
    }


@router.get("/projects/{project}/models/{model}", response_class=HTMLResponse)
@page
def read_model_page(
    request: Request,
    session: SessionDep,
    project: str,
    model: str,
    engine: str | None = None,
    level: str | None = None,
    page: Annotated[int, Query(ge=1)] = 1,
):
    found = get_project(session, project)
    history = model_history(session, found, get_model(session, found, model), page=page)
    chosen = _fusion_series(history, engine, level)
    return "model.html", {
        "project": found,
        "history": history,
        "chosen": chosen,
        "timing": script_json(timing_figure(history)),
        "fused": script_json(fusion_figure(history, chosen)),
    }


def _fusion_series(history, engine: str | None, level: str | None):
    """The series whose fused ops are drawn: the one asked for, else the one whose counts changed most
    often (that is what a reader came for), then the one with the most fused ops."""
    if engine or level:
        for series in history.series:
            if (engine in (None, series.engine)) and (level in (None, series.level)):
                return series
        raise NotFound(f"model {history.model!r} has no series for engine {engine!r}, level {level!r}")
    def changes(series) -> int:
        return sum(a.fusions != b.fusions for a, b in zip(series.points, series.points[1:], strict=False))

    return max(history.series, key=lambda s: (changes(s), len(s.fused_ops())), default=None)


@router.get("/projects/{project}/commits/{sha}", response_class=HTMLResponse)
@page
def read_commit_page(request: Request, session: SessionDep, project: str, sha: str):
    found = get_project(session, project)
    report = commit_report(session, found, sha)
    return "commit.html", {
        "project": found,
        "report": report,
        "alerts": [alert_usecases.alert_dict(session, a) for a in report.alerts],
        "running": any(status.verdict == "running" for status in report.runs),
    }


@router.get("/alerts", response_class=HTMLResponse)
@page
def read_alerts_page(
    request: Request,
    session: SessionDep,
    project: str | None = None,
    kind: str | None = None,
    state: str | None = None,
    page: Annotated[int, Query(ge=1)] = 1,
):
    project, kind, state = project or None, kind or None, state or None  # an empty <select> sends ""
    found = get_project(session, project) if project else None
    rows, total = alert_usecases.list_alerts(
        session, found, kind, state, skip=(page - 1) * ALERTS_PER_PAGE, limit=ALERTS_PER_PAGE
    )
    projects, _ = list_projects(session, limit=500)
    return "alerts.html", {
        "alerts": [alert_usecases.alert_dict(session, a) for a in rows],
        "total": total,
        "page": page,
        "pages": max(1, -(-total // ALERTS_PER_PAGE)),
        "filters": {"project": project, "kind": kind, "state": state},
        "projects": [p.name for p in projects],
        "kinds": ALERT_KINDS,
        "states": ALERT_STATES,
    }


@router.post("/alerts/{alert_id}/ack")
def acknowledge_alert_form(
    request: Request, session: SessionDep, alert_id: int, next: Annotated[str, Form()] = "/alerts",
    note: Annotated[str, Form(max_length=2000)] = "",
) -> Response:
    with session.begin():
        may_write_to(request, alert_usecases.alert_project(session, alert_id))
        principal = principal_of(request)
        alert_usecases.acknowledge(session, alert_id, note or None, principal.name if principal else None)
    return RedirectResponse(local_path(next, "/alerts"), status_code=303)


@router.get("/upload", response_class=HTMLResponse)
@page
def read_upload_page(request: Request, session: SessionDep, project: str | None = None):
    return "upload.html", _upload_context(session, selected=project)


def _upload_context(session, **extra) -> dict[str, Any]:
    projects, _ = list_projects(session, limit=500)
    return {"projects": [p.name for p in projects], "engines": ENGINES, "levels": LEVEL_NAMES,
            "defaults": protocol_for(None), "form": {}, "error": None, "selected": None} | extra


@router.post("/upload/project", response_class=HTMLResponse)
@page
def create_project_form(
    request: Request,
    session: SessionDep,
    name: Annotated[str, Form()],
    engines: Annotated[list[str] | None, Form()] = None,
    levels: Annotated[list[str] | None, Form()] = None,
    runs: Annotated[int | None, Form()] = None,
    warmup: Annotated[int | None, Form()] = None,
    sequence_length: Annotated[int | None, Form()] = None,
):
    settings = {key: value for key, value in
                {"engines": engines, "levels": levels, "runs": runs, "warmup": warmup,
                 "sequence_length": sequence_length}.items() if value not in (None, [])}
    try:
        may_create_projects(request)
        with session.begin():
            project = create_project(session, name, None, settings)
    except ServiceError as error:
        form = {"name": name, "engines": engines or [], "levels": levels or []}
        return "upload.html", _upload_context(session, error=error.message, form=form, status_code=error.status)
    return _redirect(f"/upload?project={project.name}")


@router.post("/upload/model", response_class=HTMLResponse)
@page
def upload_model_form(
    request: Request,
    session: SessionDep,
    services: ServicesDep,
    project: Annotated[str, Form()],
    file: Annotated[UploadFile, File()],
    name: Annotated[str, Form()] = "",
    commit: Annotated[str, Form()] = "",
    branch: Annotated[str, Form()] = "main",
    message: Annotated[str, Form()] = "",
):
    try:
        if not file.filename:
            raise Invalid("choose an .onnx file (or a .zip of one .onnx and its external data) to upload")
        files = read_uploads([file], services.upload_limits.max_bytes)
        with session.begin():
            found = get_project(session, project)
            may_write_to(request, found)
            if not commit.strip():
                ingest_upload(session, services.store, services.upload_limits, found, files, name or None)
                submission = None
            else:
                submission = submit_commit(
                    session, services.store, services.upload_limits, found,
                    CommitInfo(commit.strip(), branch or "main", [], message), [(name or None, files)], "upload",
                    services.settings.machine_class,
                )
    except ServiceError as error:
        form = {"name": name, "commit": commit, "branch": branch, "message": message}
        return "upload.html", _upload_context(session, error=error.message, form=form, selected=project,
                                              status_code=error.status)
    if submission is None:
        return _redirect(f"/projects/{found.name}")
    queue.dispatch(submission.jobs, services.settings.broker_url)
    return _redirect(commit_url(found.name, submission.commit.sha))


def _redirect(url: str) -> tuple[str, dict[str, Any]]:
    """What a form handler returns on success: `page` answers it with a 303 to `url` (post/redirect/get)."""
    return REDIRECT, {"url": url}
