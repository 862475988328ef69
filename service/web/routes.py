"""The dashboard's pages and forms. Thin, as the API's routes are: each reads through one query
(service/queries/dashboard.py) or runs one command and renders a template; a ServiceError becomes
an HTML page with its status and message."""

from __future__ import annotations

import functools
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.deps import ServicesDep, SessionDep
from service.api.uploads import read_uploads
from service.auth import PAGE_ACCESS, may_create_projects, may_write_to, principal_of
from service.commands.acknowledge_alert import acknowledge_alert
from service.commands.create_project import create_project as create_project_command
from service.commands.upload_model import upload_model
from service.domain.commits import CommitInfo
from service.domain.protocol import protocol_for
from service.domain.vocabulary import ALERT_KINDS, ALERT_STATES, ENGINES, LEVEL_NAMES
from service.errors import Invalid, NotFound, ServiceError
from service.queries import dashboard
from service.queries.alerts import alerts_shown
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
    return "overview.html", dashboard.overview(session)


@router.get("/projects/{project}", response_class=HTMLResponse)
@page
def read_project_page(request: Request, session: SessionDep, project: str):
    return "project.html", dashboard.project_page(session, project)


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
    found, history = dashboard.model_page(session, project, model, page)
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
    found, report, alerts = dashboard.commit_page(session, project, sha)
    return "commit.html", {
        "project": found,
        "report": report,
        "alerts": alerts,
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
    alerts, total = alerts_shown(session, project, kind, state, skip=(page - 1) * ALERTS_PER_PAGE,
                                 limit=ALERTS_PER_PAGE)
    return "alerts.html", {
        "alerts": alerts,
        "total": total,
        "page": page,
        "pages": max(1, -(-total // ALERTS_PER_PAGE)),
        "filters": {"project": project, "kind": kind, "state": state},
        "projects": dashboard.project_names(session),
        "kinds": ALERT_KINDS,
        "states": ALERT_STATES,
    }


@router.post("/alerts/{alert_id}/ack")
def acknowledge_alert_form(
    request: Request, services: ServicesDep, alert_id: int, next: Annotated[str, Form()] = "/alerts",
    note: Annotated[str, Form(max_length=2000)] = "",
) -> Response:
    principal = principal_of(request)
    acknowledge_alert(services, alert_id, partial(may_write_to, request), note or None,
                      principal.name if principal else None)
    return RedirectResponse(local_path(next, "/alerts"), status_code=303)


@router.get("/upload", response_class=HTMLResponse)
@page
def read_upload_page(request: Request, session: SessionDep, project: str | None = None):
    return "upload.html", _upload_context(session, selected=project)


def _upload_context(session, **extra) -> dict[str, Any]:
    return {"projects": dashboard.project_names(session), "engines": ENGINES, "levels": LEVEL_NAMES,
            "defaults": protocol_for(None), "form": {}, "error": None, "selected": None} | extra


@router.post("/upload/project", response_class=HTMLResponse)
@page
def create_project_form(
    request: Request,
    session: SessionDep,
    services: ServicesDep,
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
        project = create_project_command(services, name, None, settings)
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
        at = CommitInfo(commit.strip(), branch or "main", [], message) if commit.strip() else None
        uploaded = upload_model(services, project, files, name or None, at, partial(may_write_to, request))
    except ServiceError as error:
        form = {"name": name, "commit": commit, "branch": branch, "message": message}
        return "upload.html", _upload_context(session, error=error.message, form=form, selected=project,
                                              status_code=error.status)
    if uploaded.submission is None:
        return _redirect(f"/projects/{uploaded.project.name}")
    return _redirect(commit_url(uploaded.project.name, uploaded.submission.commit.sha))


def _redirect(url: str) -> tuple[str, dict[str, Any]]:
    """What a form handler returns on success: `page` answers it with a 303 to `url` (post/redirect/get)."""
    return REDIRECT, {"url": url}
