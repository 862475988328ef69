"""One stored model file, identified by its content: the .onnx's sha256 together with any external-data
files that came with it. The bytes live under the data directory (service/adapters/storage.py), one directory
per file, so a model's external data can only ever be read from its own directory."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, CheckConstraint, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class ModelFile(Base):
    __tablename__ = "model_file"
    __table_args__ = (
        CheckConstraint("size_bytes > 0", name="size_bytes_positive"),
        CheckConstraint("length(sha256) = 64", name="sha256_is_hex_digest"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    filename: Mapped[str] = mapped_column(String(255))  # the .onnx inside the file's directory
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # the .onnx and its external data together
    data_files: Mapped[list[str]] = mapped_column(JSON, default=list)  # external-data files beside it
    opset: Mapped[int | None] = mapped_column(Integer)  # ai.onnx opset; None for custom domains only
    nodes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
