"""What each dashboard page shows, read in one call per page (service/web/routes.py renders it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.domain.protocol import protocol_for
from service.domain.vocabulary import NEEDS_ATTENTION
from service.models import Project
from service.queries.alerts import alerts_shown
from service.queries.commit_report import CommitReport, commit_report
from service.queries.overview import latest_runs, project_cells, project_summaries
from service.queries.series import ModelHistory, model_history
from service.usecases.alerts import alert_dict
from service.usecases.models import get_model, project_models
from service.usecases.projects import get_project, list_projects

PROJECTS_LISTED = 500  # in the pages' project choices


def overview(session: Session) -> dict[str, Any]:
    open_alerts, open_total = alerts_shown(session, limit=10, states=NEEDS_ATTENTION)
    return {"projects": project_summaries(session), "runs": latest_runs(session, limit=20), "alerts": open_alerts,
            "open_total": open_total}


def project_page(session: Session, project: str) -> dict[str, Any]:
    found = get_project(session, project)
    return {
        "project": found,
        "protocol": protocol_for(found.settings),
        "cells": project_cells(session, found),
        "models": project_models(session, found),
        "runs": latest_runs(session, found, limit=15),
    }


def model_page(session: Session, project: str, model: str, page: int) -> tuple[Project, ModelHistory]:
    found = get_project(session, project)
    return found, model_history(session, found, get_model(session, found, model), page=page)


def commit_page(session: Session, project: str, sha: str) -> tuple[Project, CommitReport, list[dict[str, Any]]]:
    found = get_project(session, project)
    report = commit_report(session, found, sha)
    return found, report, [alert_dict(session, a) for a in report.alerts]


def project_names(session: Session) -> list[str]:
    projects, _ = list_projects(session, limit=PROJECTS_LISTED)
    return [p.name for p in projects]
