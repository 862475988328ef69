"""One optimizer report: what our optimizer did to one model at one level, at one moment.

Runs are measurements, like conbench's results, so they are appended, never de-duplicated: no
unique (model_id, level, graph_hash). `total_ms` differs on every run, the optimizer itself changes
between commits, and a later run with the *same* graph_hash is exactly the "nothing regressed"
evidence the regression check will read; a unique key would throw that history away. "The"
report for a level is the latest run (highest id; created_at can tie inside one transaction).

The report's dictionaries are JSON, not JSONB: `rules` is ordered as the rules ran and JSONB
would re-sort its keys.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, CheckConstraint, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from optimizer import LEVEL_NAMES
from service.models.base import Base, UtcDateTime, utc_now

if TYPE_CHECKING:
    from service.models.model import OnnxModel


def _level_check() -> str:
    # Built from the optimizer's list so the model and the migration that froze it can be compared.
    return "level IN (" + ", ".join(f"'{name}'" for name in LEVEL_NAMES) + ")"


class OptimizerRun(Base):
    __tablename__ = "optimizer_run"
    __table_args__ = (
        CheckConstraint(_level_check(), name="level_known"),
        CheckConstraint("total_ms >= 0", name="total_ms_not_negative"),
        CheckConstraint("nodes_before >= 0 AND nodes_after >= 0", name="node_counts_not_negative"),
        # "Latest run per level of a model" is the service's main read.
        Index(None, "model_id", "level", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("onnx_model.id", ondelete="CASCADE"))
    level: Mapped[str] = mapped_column(String(16))
    graph_hash: Mapped[str] = mapped_column(String(64))
    nodes_before: Mapped[int] = mapped_column(Integer)
    nodes_after: Mapped[int] = mapped_column(Integer)
    total_ms: Mapped[float] = mapped_column(Float)
    ops_after: Mapped[dict[str, int]] = mapped_column(JSON)
    fusions: Mapped[dict[str, int]] = mapped_column(JSON)
    rules: Mapped[dict[str, dict[str, Any]]] = mapped_column(JSON)
    near_misses: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)

    model: Mapped[OnnxModel] = relationship(back_populates="runs")
