"""Alerts: list with filters, acknowledge."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from service.api.deps import SessionDep
from service.auth import may_write_to
from service.usecases import alerts
from service.usecases.projects import get_project

router = APIRouter(tags=["alerts"])


@router.get("/alerts")
def read_alerts(
    session: SessionDep,
    project: str | None = None,
    kind: str | None = None,
    state: str | None = None,
    run_id: int | None = None,
    skip: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    found = get_project(session, project) if project else None
    rows, total = alerts.list_alerts(session, found, kind, state, run_id, skip, limit)
    return {"items": [alerts.alert_dict(session, a) for a in rows], "total": total}


@router.post("/alerts/{alert_id}/ack")
def acknowledge_alert(request: Request, session: SessionDep, alert_id: int) -> dict[str, Any]:
    with session.begin():
        may_write_to(request, alerts.alert_project(session, alert_id))
        alert = alerts.acknowledge(session, alert_id)
        return alerts.alert_dict(session, alert)
