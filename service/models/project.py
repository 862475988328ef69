"""A project: the unit that owns models, commits, alerts and outbound hooks.

`settings` holds the measurement protocol and the values for symbolic input dimensions
(e.g. {"sequence_length": 128, "threads": 1, "runs": 30, "warmup": 3}); service/domain/protocol.py
merges it over the defaults.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class Project(Base):
    __tablename__ = "project"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # GitHub's HMAC secret for push deliveries; never returned by the API.
    webhook_secret: Mapped[str | None] = mapped_column(String(200))
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # "models": a push measures the commit's own model files, sent with it or fetched from `repository`
    # (service/adapters/model_repository.py); "engine": the models stay and the engine changes, so a push
    # measures the registered models with the engine of the worker it lands on.
    kind: Mapped[str] = mapped_column(String(20), default="models", server_default="models")
    # {"url", "models": [paths or globs], "credentials_env"}; None: pushes must bring their files.
    repository: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
