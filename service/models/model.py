"""An uploaded ONNX model, identified by its bytes.

The class is `OnnxModel` rather than `Model` so it never reads as "a data model"; the table is
`onnx_model`. Two uploads of the same bytes are the same model (sha256 is unique), whatever their
file names: the first upload's name is kept.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, CheckConstraint, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.models.base import Base, UtcDateTime, utc_now

if TYPE_CHECKING:
    from service.models.optimizer_run import OptimizerRun


class OnnxModel(Base):
    __tablename__ = "onnx_model"
    __table_args__ = (
        CheckConstraint("size_bytes > 0", name="size_bytes_positive"),
        CheckConstraint("length(sha256) = 64", name="sha256_is_hex_digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    # The default-domain (ai.onnx) opset; None for a model that imports only custom domains.
    opset: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)

    runs: Mapped[list[OptimizerRun]] = relationship(
        back_populates="model", cascade="all, delete-orphan", passive_deletes=True
    )
