"""The timing table a profile trace boils down to, for onnxruntime's traces and ours alike.

Per op: calls and total/mean kernel microseconds per run; per run: SequentialExecutor::Execute
and model_run. Both engines write the same event names (runtime/profiler.py), so the same
numbers come out of either file, and the service can put them side by side.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_SUFFIX = "_kernel_time"


@dataclass
class OpTiming:
    op: str
    calls_per_run: float
    us_per_run: float


@dataclass
class ProfileTable:
    runs: int
    model_run_us: list[float]
    execute_us: list[float]
    ops: list[OpTiming] = field(default_factory=list)  # slowest first

    @property
    def median_model_run_ms(self) -> float:
        return statistics.median(self.model_run_us) / 1000 if self.model_run_us else 0.0

    @property
    def median_execute_ms(self) -> float:
        return statistics.median(self.execute_us) / 1000 if self.execute_us else 0.0


def load_trace(path: str | Path) -> list[dict]:
    events = json.loads(Path(path).read_text())
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a profile trace (expected a JSON array of events)")
    return events


def profile_table(events: list[dict], skip_runs: int = 0) -> ProfileTable:
    """Summarize a trace; the first `skip_runs` runs (warm-up) are left out of every number."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if not runs:
        raise ValueError("the trace has no model_run event: was the session run while profiling?")
    kept = runs[skip_runs:]
    if not kept:
        raise ValueError(f"the trace has {len(runs)} run(s); cannot skip {skip_runs}")
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in kept]

    def in_kept_run(event: dict) -> bool:
        return any(start <= event["ts"] <= end for start, end in windows)

    # One per run, the run's own: onnxruntime writes another SequentialExecutor::Execute for every
    # subgraph an If or a Loop runs (an Optimum merged decoder's), each inside the run's, so shorter.
    execute_events = [e for e in events if e.get("name") == "SequentialExecutor::Execute"]
    executes = []
    for start, end in windows:
        inside = [e["dur"] for e in execute_events if start <= e["ts"] <= end]
        if inside:
            executes.append(max(inside))
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    kernels = [e for e in events
               if e.get("cat") == "Node" and e.get("name", "").endswith(KERNEL_SUFFIX) and in_kept_run(e)]
    for event, exclusive in zip(kernels, exclusive_durations(kernels), strict=True):
        op = event.get("args", {}).get("op_name", "?")
        totals[op] += exclusive
        calls[op] += 1
    count = len(kept)
    ops = [OpTiming(op, calls[op] / count, totals[op] / count) for op in totals]
    ops.sort(key=lambda t: -t.us_per_run)
    return ProfileTable(count, [e["dur"] for e in kept], executes, ops)


def exclusive_durations(kernels: list[dict]) -> list[float]:
    """Each kernel event's duration less the kernels nested in it: an If, Loop or Scan's kernel time
    spans the nodes of the subgraph it ran, which both engines also record as kernels of their own, so
    counting both would put the branch's work in the table twice (an Optimum merged decoder's If read
    as its slowest op). Nesting is by time on one thread: a kernel inside another's span ran inside it."""
    exclusive = [float(e["dur"]) for e in kernels]
    order = sorted(range(len(kernels)), key=lambda i: (kernels[i].get("tid", 0), kernels[i]["ts"], -kernels[i]["dur"]))
    open_spans: list[int] = []  # indices of the kernels enclosing the current one, outermost first
    for i in order:
        event = kernels[i]
        while open_spans and not _encloses(kernels[open_spans[-1]], event):
            open_spans.pop()
        if open_spans:
            exclusive[open_spans[-1]] -= event["dur"]  # only the direct parent: its own parent subtracts it
        open_spans.append(i)
    return [max(d, 0.0) for d in exclusive]


def _encloses(outer: dict, inner: dict) -> bool:
    return (outer.get("tid", 0) == inner.get("tid", 0) and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])
