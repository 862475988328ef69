"""A worker asks for work: the oldest queued job of its machine class becomes its own, or nothing waits.

The embedded worker polls with it; Celery workers are handed a job id and claim that one in
execute_job.py. A claim is one UPDATE on a row still queued (service/adapters/queue.py), committed at
once, so two workers polling together never take the same job.
"""

from __future__ import annotations

from service.adapters import queue
from service.services import Services


def claim_next_job(services: Services, worker: str) -> int | None:
    """The id of the job `worker` now runs, or None when no job of `services.settings.machine_class` is queued."""
    with services.session_factory() as session:
        job = queue.claim_next(session, worker, services.settings.machine_class)
        return None if job is None else job.id
