"""Results measured elsewhere are posted (client mode: `fusionwatch run --server`): the commit, a
run of its own and each result are recorded in one transaction; the alerts they raise are delivered
and the series' change-point windows placed once it commits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.domain.commits import CommitInfo
from service.domain.measurement import Measurement
from service.errors import Invalid, NotFound
from service.models import Model, Project
from service.services import Services
from service.usecases.alerts import alert_dict
from service.usecases.commits import record_commit
from service.usecases.delivery import deliver
from service.usecases.history_windows import arrived, compute_windows
from service.usecases.models import get_model
from service.usecases.results import get_or_create_machine, record_result
from service.usecases.runs import record_only_run


def run_now(effect: Callable[..., Any], *args: Any) -> None:
    effect(*args)


def post_results(
    services: Services, project: str, commit: CommitInfo, machine: dict[str, Any],
    results: list[tuple[str, Measurement]], authorize: Callable[[Project], None],
    after_commit: Callable[..., Any] = run_now,
) -> dict[str, Any]:
    """`results`: (model name, measurement) each. `after_commit(effect, *args)` runs the delivery and the
    windows; the API hands in its background tasks, so a poster does not wait for them."""
    with services.session_factory() as session, session.begin():
        found = services.known_projects.get(session, project)
        authorize(found)
        c = commit
        recorded = record_commit(session, found, c.sha, c.branch, c.parents, c.message, c.author, c.timestamp)
        run = record_only_run(session, found, recorded, "results")
        machine_row = get_or_create_machine(session, machine)
        alerts, series = [], []
        for name, measurement in results:
            result, raised = record_result(session, run, _model_named(session, found, name), measurement, machine_row)
            alerts.extend(a for a in raised if a not in alerts)  # one alert may stand for several results
            series.append(arrived(result))
        reply = {"run_id": run.id, "run_url": f"/api/v1/runs/{run.id}", "alerts": [alert_dict(session, a) for a in alerts]}
    after_commit(deliver, services.session_factory, [a.id for a in alerts])
    # The first history read then finds the series' change-point windows stored (usecases/history_windows.py).
    after_commit(compute_windows, services.read_session_factory, services.session_factory, series)
    return reply


def _model_named(session: Session, project: Project, name: str) -> Model:
    """A posted result may name a model nobody uploaded (it was measured elsewhere): it is registered
    on first sight, without a stored file."""
    try:
        return get_model(session, project, name)
    except NotFound:
        if "/" in name or "\\" in name:
            raise Invalid(f"model name {name[:80]!r} must not contain a path") from None
        try:
            with session.begin_nested():
                model = Model(project_id=project.id, name=name, latest_file_id=None)
                session.add(model)
        except IntegrityError:  # registered by a concurrent post meanwhile (PostgreSQL): that row is this one
            model = get_model(session, project, name)
        return model
