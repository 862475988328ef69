"""Register and look up projects and their outbound alert hooks."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.adapters.model_repository import checked_repository
from service.domain.protocol import protocol_for
from service.domain.vocabulary import HOOK_FORMATS
from service.errors import Conflict, Invalid, NotFound
from service.models import Hook, Project

PROJECT_KINDS = ("models", "engine")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def create_project(
    session: Session, name: str, webhook_secret: str | None = None, settings: dict[str, Any] | None = None,
    kind: str = "models", repository: dict[str, Any] | None = None, allow_file_repositories: bool = False,
) -> Project:
    name = name.strip()
    if not _NAME.fullmatch(name):
        raise Invalid(
            f"project name {name[:60]!r} must be 1 to 200 letters, digits, '.', '_' or '-' (it appears in URLs)"
        )
    try:
        protocol = protocol_for(settings)
    except ValidationError as error:
        raise Invalid(f"project settings: {_first_error(error)}") from error
    if kind not in PROJECT_KINDS:
        raise Invalid(f"kind must be one of {list(PROJECT_KINDS)}, got {str(kind)[:40]!r}")
    if kind == "engine" and repository is not None:
        raise Invalid("an engine project measures its registered models on each push; it takes no repository")
    checked = checked_repository(repository, allow_file_repositories).to_json() if repository is not None else None
    if session.scalar(select(Project.id).where(Project.name == name)) is not None:
        raise Conflict(f"project {name!r} already exists")
    project = Project(name=name, webhook_secret=webhook_secret or None, settings=protocol.model_dump(mode="json"),
                      kind=kind, repository=checked)
    session.add(project)
    try:
        session.flush()
    except IntegrityError as error:  # a concurrent create of the same name
        raise Conflict(f"project {name!r} already exists") from error
    return project


# Built once: every request names its project, and building a statement costs more than running it.
_PROJECT_NAMED = select(Project).where(Project.name == bindparam("name"))


def get_project(session: Session, name: str) -> Project:
    project = session.scalar(_PROJECT_NAMED, {"name": name})
    if project is None:
        raise NotFound(f"no project named {name[:200]!r}")
    return project


def list_projects(session: Session, skip: int = 0, limit: int = 100) -> tuple[list[Project], int]:
    total = session.scalar(select(func.count()).select_from(Project)) or 0
    rows = session.scalars(select(Project).order_by(Project.id).offset(skip).limit(limit)).all()
    return list(rows), total


def add_hook(session: Session, project: Project, url: str, format: str = "json") -> Hook:
    if not url.startswith(("http://", "https://")):
        raise Invalid(f"hook url must start with http:// or https://, got {url[:100]!r}")
    if format not in HOOK_FORMATS:
        raise Invalid(f"hook format must be one of {list(HOOK_FORMATS)}, got {format!r}")
    hook = Hook(project_id=project.id, url=url, format=format)
    session.add(hook)
    session.flush()
    return hook


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
