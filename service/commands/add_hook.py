"""An outbound hook is added to a project: where its alerts are posted, as JSON or as a Slack message."""

from __future__ import annotations

from collections.abc import Callable

from service.models import Hook, Project
from service.services import Services
from service.usecases import projects


def add_hook(services: Services, project: str, url: str, format: str, authorize: Callable[[Project], None]) -> Hook:
    with services.session_factory() as session, session.begin():
        found = projects.get_project(session, project)
        authorize(found)
        return projects.add_hook(session, found, url, format)
