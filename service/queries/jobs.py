"""Reads about jobs while they run."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from service.models import Job
from service.models.base import utc_now
from service.services import Services


def running_longer_than(services: Services, worker: str, seconds: float) -> bool:
    """Whether `worker` holds a job it started more than `seconds` ago (the embedded worker's timeout)."""
    with services.session_factory() as session:
        return session.scalar(
            select(Job.id).where(
                Job.state == "running", Job.worker == worker, Job.started_at < utc_now() - timedelta(seconds=seconds),
            )
        ) is not None
