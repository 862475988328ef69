"""What one engine run of one model at one level produced: fused-op counts and timings.

Both engines fill the same fields the same way, so a service can store them in one table and
put them side by side: op counts keyed as the optimizer's report keys them ("Op" for ONNX ops,
"domain.Op" otherwise), timings read from each engine's profile trace by
runtime/profile_table.py with the warm-up runs left out.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from runtime.profile_table import load_trace, profile_table


@dataclass(frozen=True)
class TimingStats:
    """Milliseconds over the timed runs."""

    median: float
    min: float
    max: float

    @classmethod
    def from_us(cls, durations_us: list[float]) -> TimingStats:
        if not durations_us:
            raise ValueError("no timed events to summarize")
        ms = [us / 1000 for us in durations_us]
        return cls(statistics.median(ms), min(ms), max(ms))


@dataclass(frozen=True)
class RunTimings:
    runs: int
    model_run_ms: TimingStats
    execute_ms: TimingStats  # SequentialExecutor::Execute: the run less feeding and fetching
    model_run_samples_ms: list[float] = field(default_factory=list)  # every timed run, in order
    execute_samples_ms: list[float] = field(default_factory=list)
    top_kernels: list[dict[str, float | str]] = field(default_factory=list)  # {"op", "ms"} slowest first


TOP_KERNELS = 10


def read_timings(trace: str | Path, warmup: int) -> RunTimings:
    """model_run and SequentialExecutor::Execute from a profile trace (ours or onnxruntime's)."""
    table = profile_table(load_trace(trace), skip_runs=warmup)
    if len(table.execute_us) != table.runs:
        raise ValueError(
            f"{trace}: {table.runs} timed model_run event(s) but {len(table.execute_us)} "
            "SequentialExecutor::Execute event(s); was the session run sequentially?"
        )
    return RunTimings(
        table.runs,
        TimingStats.from_us(table.model_run_us),
        TimingStats.from_us(table.execute_us),
        model_run_samples_ms=[us / 1000 for us in table.model_run_us],
        execute_samples_ms=[us / 1000 for us in table.execute_us],
        top_kernels=[{"op": op.op, "ms": op.us_per_run / 1000} for op in table.ops[:TOP_KERNELS]],
    )


@dataclass(frozen=True)
class EngineResult:
    engine: str  # "fusionwatch" or "onnxruntime"
    engine_version: str
    level: str  # our level name: disabled, basic, extended, layout, all
    engine_level: str  # the level as the engine was given it, e.g. "ORT_ENABLE_LAYOUT"
    threads: int  # intra-op threads asked for; 0 leaves the engine's default
    runs: int  # timed runs (warm-up runs excluded)
    ops_after: dict[str, int]  # op key -> nodes of that op in the optimized graph
    fusions: dict[str, int]  # fused op key -> nodes of it the optimizer created
    nodes_after: int | None  # None only together with graph_error
    model_run_ms: TimingStats
    execute_ms: TimingStats
    session_ms: float  # creating the session: loading, optimizing, planning
    inputs: dict[str, str] = field(default_factory=dict)  # feed name -> "int64[1, 128]"
    feeds_digest: str = ""  # sha256 of the feeds: equal digests, equal inputs
    # Why ops_after, fusions and nodes_after are empty when the engine ran but its optimized
    # graph could not be read back (onnxruntime failing to save it); None otherwise.
    graph_error: str | None = None
    model_run_samples_ms: list[float] = field(default_factory=list)  # every timed run, warm-up excluded
    execute_samples_ms: list[float] = field(default_factory=list)
    top_kernels: list[dict[str, float | str]] = field(default_factory=list)
    peak_bytes: int | None = None  # peak live intermediates (our executor only)
    # The kernel library per family our session ran on ({"gemm": "onednn", "conv": "onednn",
    # "wait": "spin"}: runtime/kernel_choice.py measures the choice per machine); {} for onnxruntime.
    kernel_libraries: dict[str, str] = field(default_factory=dict)
    # The last run's outputs, for the numeric check against level `disabled`; never serialized
    # (replies and logs quote no tensor).
    outputs: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Our optimizer's report for this session (our engine only; None for onnxruntime): what
    # `optimizer.optimize` says of the model at this level, so a measurement need not optimize it again.
    optimizer_report: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, outputs={}, optimizer_report=None))
        del data["outputs"], data["optimizer_report"]
        return data
