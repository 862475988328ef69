"""One window's change points (service/domain/change_points.py), kept so that a restarted or second
API process reads a series' history without running the windows' permutation tests again.

A window's splits depend on its values, its place in the series and the test's parameters alone,
and `digest` is the SHA-256 of all of them: a row whose digest matches is the answer, whatever
series or position it is filed under. The series and position are for finding a series' rows in
one query and for dropping the ones a completed window made stale (usecases/change_point_windows.py).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UtcDateTime, utc_now


class ChangePointWindow(Base):
    __tablename__ = "change_point_window"
    __table_args__ = (
        Index("ix_change_point_window_series", "model_id", "engine", "level", "machine_class", "position", "digest",
              unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    # The series, as result's columns name it (result.project_id follows from the model).
    model_id: Mapped[int] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"))
    engine: Mapped[str] = mapped_column(String(32))
    level: Mapped[str] = mapped_column(String(16))
    machine_class: Mapped[str] = mapped_column(String(32))
    position: Mapped[int] = mapped_column(Integer)  # the window's start in the series (its place, not its values')
    digest: Mapped[str] = mapped_column(String(64))  # hex SHA-256 of the values, the seed and the test's parameters
    splits: Mapped[list[list[float]]] = mapped_column(JSON)  # [offset in the window, p-value], in the order found
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
