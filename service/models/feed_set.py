"""A project's own inputs for one of its models: a named .npz (service/adapters/feed_sets.py) every job of the model
checks numerically beside the synthesized feeds."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, CheckConstraint, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class FeedSet(Base):
    __tablename__ = "feed_set"
    __table_args__ = (
        UniqueConstraint("model_id", "name"),
        CheckConstraint("length(sha256) = 64", name="feed_set_sha256_is_hex_digest"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    sha256: Mapped[str] = mapped_column(String(64))  # of the .npz, its name in the store
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    inputs: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)  # input -> "int64[2, 16]"
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
