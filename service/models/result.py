"""One measurement: a model file through one engine at one level, written exactly once per job.

The comparability key is first-class (model, engine, level, machine class, threads, input sizes) and
folded into `fingerprint`, as conbench's history_fingerprint: results with the same fingerprint
form one history series, and a baseline is always looked up inside it. Fused-op counts are also in
result_fusion, so "when did BiasGelu drop for this model" is one indexed query.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, CheckConstraint, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.domain.vocabulary import ENGINES, LEVEL_NAMES, one_of
from service.models.base import Base, UtcDateTime, utc_now


class Result(Base):
    __tablename__ = "result"
    __table_args__ = (
        CheckConstraint(one_of("engine", ENGINES), name="engine_known"),
        CheckConstraint(one_of("level", LEVEL_NAMES), name="level_known"),
        CheckConstraint("median_ms IS NULL OR median_ms >= 0", name="median_not_negative"),
        CheckConstraint("p10_ms IS NULL OR p90_ms IS NULL OR p10_ms <= p90_ms", name="percentiles_ordered"),
        Index(None, "fingerprint", "commit_id"),
        # A series' history (queries/history.py, queries/series.py): the latest result per commit.
        Index("ix_result_series", "project_id", "model_id", "engine", "level", "machine_class", "commit_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("job.id", ondelete="SET NULL"), unique=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    commit_id: Mapped[int] = mapped_column(ForeignKey("commit.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("model.id", ondelete="CASCADE"))
    model_file_id: Mapped[int | None] = mapped_column(ForeignKey("model_file.id"))
    machine_id: Mapped[int | None] = mapped_column(ForeignKey("machine.id"))
    engine: Mapped[str] = mapped_column(String(32))
    engine_version: Mapped[str] = mapped_column(String(64))
    level: Mapped[str] = mapped_column(String(16))
    machine_class: Mapped[str] = mapped_column(String(32))
    threads: Mapped[int] = mapped_column(Integer, default=0)
    inputs: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)  # feed name -> "int64[1, 128]"
    fingerprint: Mapped[str] = mapped_column(String(64))

    nodes_before: Mapped[int | None] = mapped_column(Integer)
    nodes_after: Mapped[int | None] = mapped_column(Integer)
    ops_after: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    fusions: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    rules: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    near_misses: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    graph_hash: Mapped[str | None] = mapped_column(String(64))

    execute_ms: Mapped[list[float]] = mapped_column(JSON, default=list)  # every timed sample
    model_run_ms: Mapped[list[float]] = mapped_column(JSON, default=list)
    median_ms: Mapped[float | None] = mapped_column(Float)  # of execute_ms
    p10_ms: Mapped[float | None] = mapped_column(Float)
    p90_ms: Mapped[float | None] = mapped_column(Float)
    mad_ms: Mapped[float | None] = mapped_column(Float)
    top_kernels: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    canary_ms: Mapped[float | None] = mapped_column(Float)  # the job's fixed matrix product (service/adapters/canary.py)
    # Our engine's kernel library per family, as its session chose them (runtime/kernel_choice.py).
    kernel_libraries: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    max_abs_error: Mapped[float | None] = mapped_column(Float)  # against level `disabled`
    max_rel_error: Mapped[float | None] = mapped_column(Float)
    numeric_ok: Mapped[bool | None] = mapped_column()
    # Per feed set the check used: its inputs, status, errors, first diverging tensor
    # (service/adapters/engines/numerics.py); and the worst comparison in full, rows included.
    numeric_checks: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=list)
    divergence: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # The baseline and this result timed in one job, alternately, and the decision on them
    # (service/domain/paired.py; PairedTiming.to_dict or the posted "baseline"); None: not paired.
    paired: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What the timing decision said of this result, in the words the CLI and the pages show
    # (service/domain/verdict_words.py); None: no timing decision (no samples, no baseline).
    timing_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    session_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
