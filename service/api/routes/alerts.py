"""Alerts: list with filters, read one, acknowledge with a note, download a regression's repro."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import FileResponse

from service.api.deps import ServicesDep, SessionDep
from service.auth import may_write_to, principal_of
from service.commands.acknowledge_alert import acknowledge_alert as acknowledge_alert_command
from service.queries.alerts import alert_repro, alert_shown, alerts_shown

router = APIRouter(tags=["alerts"])


@router.get("/alerts")
def read_alerts(
    session: SessionDep,
    project: str | None = None,
    kind: str | None = None,
    state: str | None = None,
    run_id: int | None = None,
    commit: Annotated[str | None, Query(max_length=64)] = None,
    skip: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    items, total = alerts_shown(session, project, kind, state, run_id, skip, limit, commit=commit)
    return {"items": items, "total": total}


@router.get("/alerts/{alert_id}")
def read_alert(session: SessionDep, alert_id: int) -> dict[str, Any]:
    return alert_shown(session, alert_id)


@router.get("/alerts/{alert_id}/repro")
def read_alert_repro(session: SessionDep, services: ServicesDep, alert_id: int, side: str = "commit") -> FileResponse:
    path, name = alert_repro(session, services, alert_id, side)
    return FileResponse(path, media_type="application/octet-stream", filename=name)


@router.post("/alerts/{alert_id}/ack")
def acknowledge_alert(
    request: Request, services: ServicesDep, alert_id: int,
    note: Annotated[str | None, Body(embed=True, max_length=2000)] = None,
) -> dict[str, Any]:
    principal = principal_of(request)
    return acknowledge_alert_command(services, alert_id, partial(may_write_to, request), note,
                                     principal.name if principal else None)
