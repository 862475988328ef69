"""Jobs a worker left running are released: those a dead or overdue worker held go back to the queue
while attempts remain, the rest fail with a job-failure alert, delivered once committed."""

from __future__ import annotations

from service.services import Services
from service.usecases.delivery import deliver
from service.usecases.jobs import release_abandoned


def release_jobs(services: Services, max_attempts: int, worker: str | None = None, why: str = "") -> list[int]:
    """`worker`: only that worker's jobs (None: every running job). Returns the alerts raised."""
    with services.session_factory() as session:
        alerts = release_abandoned(session, max_attempts, worker=worker, why=why)
        session.commit()
    deliver(services.session_factory, alerts)
    return alerts
