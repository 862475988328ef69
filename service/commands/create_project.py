"""A project is created, with its measuring protocol (its settings) and its model repository checked first."""

from __future__ import annotations

from typing import Any

from service.models import Project
from service.services import Services
from service.usecases import projects


def create_project(
    services: Services, name: str, webhook_secret: str | None, settings: dict[str, Any] | None,
    kind: str = "models", repository: dict[str, Any] | None = None,
) -> Project:
    with services.session_factory() as session, session.begin():
        return projects.create_project(session, name, webhook_secret, settings, kind, repository,
                                       services.settings.allow_file_repositories)
