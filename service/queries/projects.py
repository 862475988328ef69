"""Reads of projects for the API: a page of them, one with its models, and its history as series of points."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from service.domain.vocabulary import ENGINES, LEVEL_NAMES
from service.errors import Invalid
from service.models import Model, Project
from service.queries.history import history
from service.services import Services
from service.usecases.change_point_windows import SeriesWindows, store_computed
from service.usecases.models import get_model, project_models
from service.usecases.projects import get_project, list_projects


def projects_page(session: Session, skip: int, limit: int) -> tuple[list[Project], int]:
    return list_projects(session, skip, limit)


def project_and_models(session: Session, project: str) -> tuple[Project, list[Model]]:
    found = get_project(session, project)
    return found, project_models(session, found)


@dataclass
class ProjectHistory:
    project: Project
    series: list[dict[str, Any]]
    computed: list[SeriesWindows] = field(default_factory=list)  # change-point windows this read placed


def project_history(
    session: Session, services: Services, project: str, model: str | None, engine: str | None, level: str | None,
    limit: int, after_reply: Callable[..., Any],
) -> ProjectHistory:
    """`after_reply(effect, *args)` stores the change-point windows this read computed, in a writing
    transaction of its own once the reply is out."""
    if engine is not None and engine not in ENGINES:
        raise Invalid(f"engine must be one of {list(ENGINES)}, got {engine[:50]!r}")
    if level is not None and level not in LEVEL_NAMES:
        raise Invalid(f"level must be one of {list(LEVEL_NAMES)}, got {level[:50]!r}")
    found = get_project(session, project)
    series_model = get_model(session, found, model) if model else None
    read = ProjectHistory(found, [])
    read.series = history(session, found, series_model, engine, level, limit, read.computed)
    if read.computed:
        after_reply(store_computed, services.session_factory, read.computed)
    return read
