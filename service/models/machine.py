"""A machine results were measured on. Timings compare only within a machine class ("cpu", "cuda",
or a name a user gives); the row keeps what made the machine what it was."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class Machine(Base):
    __tablename__ = "machine"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the fields below
    machine_class: Mapped[str] = mapped_column(String(32))
    hostname: Mapped[str] = mapped_column(String(255), default="")
    cpu: Mapped[str] = mapped_column(String(255), default="")
    cores: Mapped[int] = mapped_column(Integer, default=0)
    isa: Mapped[list[str]] = mapped_column(JSON, default=list)  # vector extensions: avx2, avx512f, ...
    gpu: Mapped[str] = mapped_column(String(255), default="")
    engine_versions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
