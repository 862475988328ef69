"""A history read's points as the API process that read them last kept them (usecases/history_points.py),
so that a restarted or second process brings them up to date from the results that arrived since
instead of reading 10,000 commits again (200-260 ms of a first read after a restart, in session 6).

`key` is the SHA-256 of the read's project, filters and limit; `results_count`, `results_max_id`,
`last_commit_id` and `commits_filled` are what the points were read at, the same checks a kept read
in memory answers to; `points` holds each series' key and its points' JSON as a reply carries it
(usecases/history_points.py: _packed).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class KeptHistory(Base):
    __tablename__ = "kept_history"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"), index=True)
    results_count: Mapped[int] = mapped_column(BigInteger)
    results_max_id: Mapped[int] = mapped_column(BigInteger)
    last_commit_id: Mapped[int] = mapped_column(BigInteger)
    commits_filled: Mapped[int] = mapped_column(BigInteger)
    points: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now, onupdate=utc_now)
