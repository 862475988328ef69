"""A result's fused-op counts, one row per (result, op): the table behind "when did BiasGelu drop"."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base


class ResultFusion(Base):
    __tablename__ = "result_fusion"
    __table_args__ = (
        CheckConstraint("count >= 0", name="count_not_negative"),
        Index(None, "op", "result_id"),
    )

    result_id: Mapped[int] = mapped_column(ForeignKey("result.id", ondelete="CASCADE"), primary_key=True)
    op: Mapped[str] = mapped_column(String(300), primary_key=True)  # "com.microsoft.BiasGelu"
    count: Mapped[int] = mapped_column(Integer)
