"""Run a test app's queued jobs in this process, through the worker's own code (claim, execute)."""

from __future__ import annotations

from dataclasses import replace

from fastapi.testclient import TestClient

from service.adapters.engines.custom_ops import load_custom_ops
from service.commands.claim_next_job import claim_next_job
from service.commands.execute_job import execute_job


def drain(client: TestClient, custom_ops: str = "", limit: int | None = None) -> int:
    """Execute every queued job (at most `limit`); returns how many ran. Re-measurements stay in the
    table for the next call, as with the embedded worker, even where the app announces jobs to a broker."""
    services = client.app.state.services
    worker = replace(services, custom_ops=load_custom_ops(custom_ops or services.settings.custom_ops), broker_url=None)
    ran = 0
    while limit is None or ran < limit:
        job_id = claim_next_job(services, "test-worker")
        if job_id is None:
            return ran
        execute_job(worker, job_id)
        ran += 1
    return ran
