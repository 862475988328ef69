"""A durable unit of work: one model file through one engine at one level on one machine class.

Jobs are claimed by flipping `queued` to `running` in one UPDATE (service/adapters/queue.py), so two workers
never take the same job; a job whose worker died is put back while attempts remain, then failed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.domain.vocabulary import ENGINES, JOB_STATES, LEVEL_NAMES, one_of
from service.models.base import Base, UtcDateTime, utc_now


class Job(Base):
    __tablename__ = "job"
    __table_args__ = (
        CheckConstraint(one_of("state", JOB_STATES), name="state_known"),
        CheckConstraint(one_of("engine", ENGINES), name="engine_known"),
        CheckConstraint(one_of("level", LEVEL_NAMES), name="level_known"),
        CheckConstraint("attempts >= 0", name="attempts_not_negative"),
        UniqueConstraint("run_id", "model_id", "engine", "level"),
        Index(None, "state", "machine_class", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"))
    model_file_id: Mapped[int] = mapped_column(ForeignKey("model_file.id"))
    engine: Mapped[str] = mapped_column(String(32))
    level: Mapped[str] = mapped_column(String(16))
    machine_class: Mapped[str] = mapped_column(String(32), default="cpu")
    state: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # The fused-op counts of the optimized graph, taken before any job of the run is timed, so the run's
    # fusion verdict comes in seconds (service/commands/count_run_fusions.py): {"fingerprint",
    # "engine_version", "fusions", "ops_after"}, or {"error"} when the file could not be optimized.
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
