"""Alerts as the API, the dashboard and the hooks show them, newest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service.errors import Invalid
from service.services import Services
from service.usecases.alerts import alert_dict, get_alert, list_alerts, repro_file
from service.usecases.commits import get_commit
from service.usecases.projects import get_project


def alerts_shown(
    session: Session, project: str | None = None, kind: str | None = None, state: str | None = None,
    run_id: int | None = None, skip: int = 0, limit: int = 100, states: tuple[str, ...] | None = None,
    commit: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """A page of alerts with the total; `states` keeps any of several states (NEEDS_ATTENTION, say);
    `commit` those raised at one commit of `project` (a sha, or a prefix of at least 7 of its digits)."""
    found = get_project(session, project) if project else None
    if commit is not None and found is None:
        raise Invalid("commit: give the project as well (a sha names a commit within a project)")
    at = get_commit(session, found, commit) if commit is not None else None
    rows, total = list_alerts(session, found, kind, state, run_id, skip, limit, states, at)
    return [alert_dict(session, a) for a in rows], total


def alert_shown(session: Session, alert_id: int) -> dict[str, Any]:
    return alert_dict(session, get_alert(session, alert_id))


def alert_repro(session: Session, services: Services, alert_id: int, side: str) -> tuple[Path, str]:
    """The regression's repro model file for `side` (commit or baseline), and the name to download it as."""
    return repro_file(session, services.store, alert_id, side)
