"""One trigger for one commit (an upload, a CI webhook, a GitHub push, a posted result set): its jobs
and results hang off it, and its verdict is read from them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from service.domain.vocabulary import RUN_STATES, one_of
from service.models.base import Base, UtcDateTime, utc_now


class Run(Base):
    __tablename__ = "run"
    __table_args__ = (CheckConstraint(one_of("state", RUN_STATES), name="state_known"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"), index=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commit.id", ondelete="CASCADE"), index=True)
    trigger: Mapped[str] = mapped_column(String(32))  # upload, ci, github, results, remeasure
    state: Mapped[str] = mapped_column(String(16), default="running")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
