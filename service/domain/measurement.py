"""One engine's report for one model at one level, and the key that decides which results are one series."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Measurement:
    """What one engine reported for one model at one level; POST /results documents take this shape."""

    engine: str
    engine_version: str
    level: str
    fusions: dict[str, int]
    execute_ms: list[float] = field(default_factory=list)
    model_run_ms: list[float] = field(default_factory=list)
    ops_after: dict[str, int] = field(default_factory=dict)
    nodes_before: int | None = None
    nodes_after: int | None = None
    graph_hash: str | None = None
    near_misses: list[dict[str, Any]] = field(default_factory=list)
    rules: dict[str, Any] = field(default_factory=dict)
    top_kernels: list[dict[str, Any]] = field(default_factory=list)
    threads: int = 0
    inputs: dict[str, str] = field(default_factory=dict)
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    numeric_ok: bool | None = None
    peak_bytes: int | None = None
    session_ms: float | None = None
    canary_ms: float | None = None  # the job's fixed matrix product, timed next to the model (service/adapters/canary.py)
    kernel_libraries: dict[str, str] = field(default_factory=dict)  # our engine's, per kernel family
    # The mark-all numeric check (service/adapters/engines/numerics.py): what each feed set fed and found, and
    # the worst comparison with its first diverging tensor and per-node rows.
    numeric_checks: list[dict[str, Any]] = field(default_factory=list)
    divergence: dict[str, Any] | None = None
    # The baseline timed beside this in the same job (service/adapters/paired_measure.py), or posted
    # with the result: the samples, the paired decision and why measuring stopped.
    paired: dict[str, Any] | None = None


def fingerprint(project_id: int, model_id: int, m: Measurement, machine_class: str) -> str:
    """The comparability key: what must be equal for two timings to be one series (not the engine version:
    an engine's change is what the series is for)."""
    key = [project_id, model_id, m.engine, m.level, machine_class, m.threads, sorted(m.inputs.items())]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
