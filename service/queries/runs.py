"""A run's progress and verdict, with its alerts as the API shows them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.usecases.alerts import alert_dict
from service.usecases.runs import RunStatus, run_status


def run_report(session: Session, run_id: int) -> tuple[RunStatus, list[dict[str, Any]]]:
    status = run_status(session, run_id)
    return status, [alert_dict(session, a) for a in status.alerts]
