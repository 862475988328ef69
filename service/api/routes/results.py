"""Results measured elsewhere (client mode: `fusionwatch run --server`), posted as one document."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Depends, Request
from sqlalchemy.exc import IntegrityError

from service.alerts.delivery import deliver
from service.api.deps import ServicesDep, SessionDep
from service.api.request_bodies import json_document
from service.auth import may_write_to
from service.errors import Invalid, NotFound
from service.models import Model
from service.schemas.requests import ResultsDocument
from service.usecases.alerts import alert_dict
from service.usecases.commits import record_commit
from service.usecases.history_windows import arrived, compute_windows
from service.usecases.models import get_model
from service.usecases.results import Measurement, get_or_create_machine, record_result
from service.usecases.runs import record_only_run

router = APIRouter(tags=["results"])


@router.post("/results", status_code=201)
def create_results(
    request: Request,
    session: SessionDep, services: ServicesDep, background: BackgroundTasks,
    document: Annotated[ResultsDocument, Depends(json_document(ResultsDocument, "results document"))],
) -> dict[str, Any]:
    with session.begin():
        project = services.known_projects.get(session, document.project)
        may_write_to(request, project)
        c = document.commit
        commit = record_commit(session, project, c.sha, c.branch, c.parents, c.message, c.author, c.timestamp)
        run = record_only_run(session, project, commit, "results")
        machine = get_or_create_machine(session, document.machine.model_dump() if document.machine else {})
        alerts, series = [], []
        for item in document.results:
            model = _model_named(session, project, item.model)
            measurement = Measurement(**item.model_dump(exclude={"model"}))
            result, raised = record_result(session, run, model, measurement, machine)
            alerts.extend(a for a in raised if a not in alerts)  # one alert may stand for several results
            series.append(arrived(result))
        reply = {"run_id": run.id, "run_url": f"/api/v1/runs/{run.id}", "alerts": [alert_dict(session, a) for a in alerts]}
    background.add_task(deliver, services.session_factory, [a.id for a in alerts])
    # After the reply, so a poster does not wait for it: the first history read then finds the
    # series' change-point windows stored (usecases/history_windows.py).
    background.add_task(compute_windows, services.read_session_factory, services.session_factory, series)
    return reply


def _model_named(session, project, name: str):
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
