"""List, describe and acknowledge alerts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.errors import Invalid, NotFound
from service.models import Alert, Commit, Model, Project, Result
from service.models.base import utc_now
from service.models.vocabulary import ALERT_KINDS, ALERT_STATES


def alert_dict(session: Session, alert: Alert) -> dict[str, Any]:
    """The alert as the API, the CLI and the hooks show it: names and shas, not ids."""

    def sha(commit_id: int | None) -> str | None:
        return None if commit_id is None else session.get(Commit, commit_id).sha

    model = session.get(Model, alert.model_id) if alert.model_id else None
    return {
        "id": alert.id,
        "kind": alert.kind,
        "state": alert.state,
        "project": session.get(Project, alert.project_id).name,
        "run_id": alert.run_id,
        "model": model.name if model else None,
        "engine": alert.engine,
        "level": alert.level,
        "commit": sha(alert.commit_id),
        "baseline_commit": sha(alert.baseline_commit_id),
        "op": alert.op,
        "rule": alert.rule,
        "before": _count_or_ms(alert.kind, alert.before),
        "after": _count_or_ms(alert.kind, alert.after),
        "change_pct": alert.change_pct,
        "changes": alert.changes,
        "message": alert.message,
        "near_misses": alert.near_misses,
        "created_at": alert.created_at.isoformat(),
        "confirmed_by": sha(session.get(Result, alert.confirmed_result_id).commit_id) if alert.confirmed_result_id else None,
    }


def list_alerts(
    session: Session,
    project: Project | None = None,
    kind: str | None = None,
    state: str | None = None,
    run_id: int | None = None,
    skip: int = 0,
    limit: int = 100,
    states: tuple[str, ...] | None = None,
) -> tuple[list[Alert], int]:
    """Newest first, with the total; `states` keeps any of several states (NEEDS_ATTENTION, say)."""
    if kind is not None and kind not in ALERT_KINDS:
        raise Invalid(f"kind must be one of {list(ALERT_KINDS)}, got {kind[:50]!r}")
    if state is not None and state not in ALERT_STATES:
        raise Invalid(f"state must be one of {list(ALERT_STATES)}, got {state[:50]!r}")
    query = select(Alert)
    if project is not None:
        query = query.where(Alert.project_id == project.id)
    if kind is not None:
        query = query.where(Alert.kind == kind)
    if state is not None:
        query = query.where(Alert.state == state)
    if states is not None:
        query = query.where(Alert.state.in_(states))
    if run_id is not None:
        query = query.where(Alert.run_id == run_id)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Alert.id.desc()).offset(skip).limit(limit)).all()
    return list(rows), total


def alert_project(session: Session, alert_id: int) -> Project:
    """The project an alert belongs to (who may acknowledge it depends on it)."""
    project = session.scalar(select(Project).join(Alert, Alert.project_id == Project.id).where(Alert.id == alert_id))
    if project is None:
        raise NotFound(f"no alert {alert_id}")
    return project


def acknowledge(session: Session, alert_id: int) -> Alert:
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"no alert {alert_id}")
    if alert.state != "acknowledged":
        alert.state, alert.acknowledged_at = "acknowledged", utc_now()
    return alert


def _count_or_ms(kind: str, value: float | None) -> float | int | None:
    """Fused-op counts are whole numbers; the column is shared with milliseconds."""
    if value is not None and kind.startswith("fusion") and float(value).is_integer():
        return int(value)
    return value
