"""A named series of model files inside a project ("bert.onnx"): what history and baselines follow.

Each upload under the name may bring a new file; `latest_file_id` is what a GitHub push (an engine
change, not a model change) runs again.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class Model(Base):
    __tablename__ = "model"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    # None for a model only ever measured elsewhere (POST /results): nothing stored to re-run.
    latest_file_id: Mapped[int | None] = mapped_column(ForeignKey("model_file.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
