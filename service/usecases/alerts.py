"""List, describe and acknowledge alerts, and hand out a fusion-regression's reproduction models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.adapters.storage import ModelStore
from service.domain.vocabulary import ALERT_KINDS, ALERT_STATES
from service.errors import Invalid, NotFound
from service.models import Alert, Commit, Model, Project, Result
from service.models.base import utc_now


def alert_dict(session: Session, alert: Alert) -> dict[str, Any]:
    """The alert as the API, the CLI and the hooks show it: names and shas, not ids."""

    def sha(commit_id: int | None) -> str | None:
        return None if commit_id is None else session.get(Commit, commit_id).sha

    model = session.get(Model, alert.model_id) if alert.model_id else None
    cause = alert.cause or {}
    repro = (cause.get("structure") or {}).get("repro") or {}
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
        # Why (fusion-regression): "cause_text" is the stable one-paragraph answer other tools quote.
        "cause_text": cause.get("text"),
        "cause": cause or None,
        "engines": [{"engine": e.get("engine"), "level": e.get("level")} for e in alert.changes if "engine" in e],
        "repro_url": f"/api/v1/alerts/{alert.id}/repro" if "commit" in repro else None,
        "repro_error": repro.get("error") or (
            "the model files were measured elsewhere and not stored" if "structure" in cause and not cause["structure"]
            else None),
        "cost": cause.get("cost"),
        "created_at": alert.created_at.isoformat(),
        "confirmed_by": sha(session.get(Result, alert.confirmed_result_id).commit_id) if alert.confirmed_result_id else None,
        "resolved_by": sha(alert.resolved_by_commit_id),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "acknowledged_at": alert.acknowledged_at.isoformat() if alert.acknowledged_at else None,
        "acknowledged_by": alert.acknowledged_by,
        "acknowledged_note": alert.acknowledged_note,
    }


def get_alert(session: Session, alert_id: int) -> Alert:
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"no alert {alert_id}")
    return alert


REPRO_SIDES = ("commit", "baseline")


def repro_file(session: Session, store: ModelStore, alert_id: int, side: str) -> tuple[Path, str]:
    """(path, download name) of a fusion-regression's reproduction model on `side`."""
    if side not in REPRO_SIDES:
        raise Invalid(f"side must be one of {list(REPRO_SIDES)}, got {side[:50]!r}")
    alert = get_alert(session, alert_id)
    repro = ((alert.cause or {}).get("structure") or {}).get("repro") or {}
    if side not in repro:
        why = repro.get("error") or "no reproduction model was made for it"
        raise NotFound(f"alert {alert_id} has no {side} reproduction model: {why}")
    stored = store.get(repro[side]["sha256"], repro[side]["filename"])
    short_op = (alert.op or "fusion").rsplit(".", 1)[-1]
    return stored.path, f"repro-{alert_id}-{short_op}-{side}.onnx"


def list_alerts(
    session: Session,
    project: Project | None = None,
    kind: str | None = None,
    state: str | None = None,
    run_id: int | None = None,
    skip: int = 0,
    limit: int = 100,
    states: tuple[str, ...] | None = None,
    commit: Commit | None = None,
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
    if commit is not None:
        query = query.where(Alert.commit_id == commit.id)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Alert.id.desc()).offset(skip).limit(limit)).all()
    return list(rows), total


def alert_project(session: Session, alert_id: int) -> Project:
    """The project an alert belongs to (who may acknowledge it depends on it)."""
    project = session.scalar(select(Project).join(Alert, Alert.project_id == Project.id).where(Alert.id == alert_id))
    if project is None:
        raise NotFound(f"no alert {alert_id}")
    return project


MAX_NOTE_CHARS = 2000


def acknowledge(session: Session, alert_id: int, note: str | None = None, by: str | None = None) -> Alert:
    """Someone has seen it: who, when and what they noted. A resolved alert stays resolved."""
    if note is not None and len(note) > MAX_NOTE_CHARS:
        raise Invalid(f"an acknowledgement note is at most {MAX_NOTE_CHARS} characters, got {len(note)}")
    alert = get_alert(session, alert_id)
    if alert.state not in ("acknowledged", "resolved"):
        alert.state = "acknowledged"
    if alert.acknowledged_at is None or note:
        alert.acknowledged_at, alert.acknowledged_by = utc_now(), (by or "")[:100] or None
        alert.acknowledged_note = note or alert.acknowledged_note
    return alert


def _count_or_ms(kind: str, value: float | None) -> float | int | None:
    """Fused-op counts are whole numbers; the column is shared with milliseconds."""
    if value is not None and kind.startswith("fusion") and float(value).is_integer():
        return int(value)
    return value
