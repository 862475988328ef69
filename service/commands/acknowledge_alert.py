"""An alert is acknowledged: someone has seen it, so it stops needing attention; who and their note are kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.models import Project
from service.services import Services
from service.usecases import alerts


def acknowledge_alert(
    services: Services, alert_id: int, authorize: Callable[[Project], None], note: str | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """The alert as the API shows it, acknowledged (once: acknowledging again changes nothing)."""
    with services.session_factory() as session, session.begin():
        authorize(alerts.alert_project(session, alert_id))
        return alerts.alert_dict(session, alerts.acknowledge(session, alert_id, note, by))
