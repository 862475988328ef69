"""A project's outbound webhook: where its alerts are posted (Slack-compatible or generic JSON)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from service.domain.vocabulary import HOOK_FORMATS, one_of
from service.models.base import Base, UtcDateTime, utc_now


class Hook(Base):
    __tablename__ = "hook"
    __table_args__ = (CheckConstraint(one_of("format", HOOK_FORMATS), name="format_known"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    format: Mapped[str] = mapped_column(String(16), default="json")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
