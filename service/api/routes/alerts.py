"""Alerts: list with filters, read one, acknowledge with a note, download a regression's repro."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import FileResponse

from service.api.deps import ServicesDep, SessionDep
from service.auth import may_write_to, principal_of
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


@router.get("/alerts/{alert_id}")
def read_alert(session: SessionDep, alert_id: int) -> dict[str, Any]:
    return alerts.alert_dict(session, alerts.get_alert(session, alert_id))


@router.get("/alerts/{alert_id}/repro")
def read_alert_repro(session: SessionDep, services: ServicesDep, alert_id: int, side: str = "commit") -> FileResponse:
    path, name = alerts.repro_file(session, services.store, alert_id, side)
    return FileResponse(path, media_type="application/octet-stream", filename=name)


@router.post("/alerts/{alert_id}/ack")
def acknowledge_alert(
    request: Request, session: SessionDep, alert_id: int,
    note: Annotated[str | None, Body(embed=True, max_length=2000)] = None,
) -> dict[str, Any]:
    with session.begin():
        may_write_to(request, alerts.alert_project(session, alert_id))
        principal = principal_of(request)
        alert = alerts.acknowledge(session, alert_id, note, principal.name if principal else None)
        return alerts.alert_dict(session, alert)
