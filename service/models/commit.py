"""A commit of a project, as CI or GitHub described it. Parents are shas (they may arrive later or
never); `seq` is the arrival order, which orders parentless commits on a branch when they carry no
timestamp."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class Commit(Base):
    __tablename__ = "commit"
    __table_args__ = (
        UniqueConstraint("project_id", "sha"),
        Index(None, "project_id", "branch", "seq"),
        # A result whose parents are not known is compared with the branch's earlier commits by
        # time (usecases/baselines.py), read a page at a time from this index.
        Index(None, "project_id", "branch", "timestamp", "seq"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    sha: Mapped[str] = mapped_column(String(64))
    branch: Mapped[str] = mapped_column(String(255))
    parents: Mapped[list[str]] = mapped_column(JSON, default=list)
    message: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(255), default="")
    timestamp: Mapped[datetime | None] = mapped_column(UtcDateTime)
    seq: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
