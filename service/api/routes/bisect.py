"""Bisect: the next commit to measure between a good and a bad one (an alert's, or the client's)."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from service.api.deps import SessionDep
from service.auth import may_write_to
from service.queries import bisect

router = APIRouter(tags=["bisect"])


class BisectRequest(BaseModel):
    good: str = Field(min_length=1, max_length=64)
    bad: str = Field(min_length=1, max_length=64)
    model: str | None = Field(None, max_length=255)
    engine: str | None = Field(None, max_length=32)
    level: str | None = Field(None, max_length=16)
    kind: str | None = Field(None, pattern="^(fusion|timing)$")
    commits: list[str] | None = Field(None, max_length=bisect.MAX_PATH)  # between good and bad, oldest first


@router.get("/alerts/{alert_id}/bisect")
def read_alert_bisect(session: SessionDep, alert_id: int) -> dict[str, Any]:
    return bisect.bisect_alert(session, alert_id)


@router.post("/projects/{project}/bisect")
def create_bisect_step(request: Request, session: SessionDep, project: str, body: BisectRequest) -> dict[str, Any]:
    return bisect.bisect_range(session, project, partial(may_write_to, request), body.good, body.bad, body.model, body.engine, body.level,
                               body.kind, body.commits)
