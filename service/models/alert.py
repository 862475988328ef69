"""An alert: something changed at a commit against its baseline, said in words (`message`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, Float, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.domain.vocabulary import ALERT_KINDS, ALERT_STATES, one_of
from service.models.base import Base, UtcDateTime, utc_now


class Alert(Base):
    __tablename__ = "alert"
    __table_args__ = (
        CheckConstraint(one_of("kind", ALERT_KINDS), name="kind_known"),
        CheckConstraint(one_of("state", ALERT_STATES), name="state_known"),
        Index(None, "project_id", "kind", "state", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), default="open")
    model_id: Mapped[int | None] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"))
    engine: Mapped[str | None] = mapped_column(String(32))
    level: Mapped[str | None] = mapped_column(String(16))
    commit_id: Mapped[int | None] = mapped_column(ForeignKey("commit.id", ondelete="CASCADE"))
    baseline_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commit.id", ondelete="SET NULL"))
    result_id: Mapped[int | None] = mapped_column(ForeignKey("result.id", ondelete="SET NULL"))
    baseline_result_id: Mapped[int | None] = mapped_column(ForeignKey("result.id", ondelete="SET NULL"))
    op: Mapped[str | None] = mapped_column(String(300))
    rule: Mapped[str | None] = mapped_column(String(100))
    before: Mapped[float | None] = mapped_column(Float)
    after: Mapped[float | None] = mapped_column(Float)
    change_pct: Mapped[float | None] = mapped_column(Float)
    # fusion-regression: one alert per (project, commit, model, lost op), and here every engine and
    # level that lost it: [{"engine", "level", "engine_version", "before", "after", "baseline_commit", ...}];
    # fusion-change: every op whose count rose, [{"op", "rule", "before", "after", "change_pct"}].
    # op/rule/before/after above repeat the first.
    changes: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    message: Mapped[str] = mapped_column(Text)
    near_misses: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # Why a fusion-regression happened (service/usecases/cause.py): {"text", "rule", "depends_on",
    # "near_misses", "structure", "looked_at"}; "text" is the stable one-paragraph answer.
    cause: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    acknowledged_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    acknowledged_by: Mapped[str | None] = mapped_column(String(100))  # the token's name
    acknowledged_note: Mapped[str | None] = mapped_column(Text)
    # A fusion-regression's count came back at this later commit, for every engine and level that lost it.
    resolved_by_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commit.id", ondelete="SET NULL"))
    resolved_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Timing alerts: the measurement that confirmed a suspected one (a re-measurement or the next commit).
    confirmed_result_id: Mapped[int | None] = mapped_column(ForeignKey("result.id", ondelete="SET NULL"))
    confirmed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
