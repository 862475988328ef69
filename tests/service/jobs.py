"""Run a test app's queued jobs in this process, through the worker's own code (claim, execute)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service import queue
from service.core.limits import load_limits
from service.engines.custom_ops import load_custom_ops
from service.machine import describe_machine
from service.worker.execute import execute_job


def drain(client: TestClient, custom_ops: str = "", limit: int | None = None) -> int:
    """Execute every queued job (at most `limit`); returns how many ran."""
    services = client.app.state.services
    ran = 0
    kernels = load_custom_ops(custom_ops or services.settings.custom_ops)
    while limit is None or ran < limit:
        with services.session_factory() as session:
            job = queue.claim_next(session, "test-worker", services.settings.machine_class)
            job_id = None if job is None else job.id
        if job_id is None:
            return ran
        execute_job(
            services.session_factory, job_id, services.store, load_limits(services.settings),
            describe_machine(services.settings.machine_class), kernels,
        )
        ran += 1
    return ran
