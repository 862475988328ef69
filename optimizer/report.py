"""What `optimize()` tells its caller: counts, timings, a graph hash and near misses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import onnx_ir as ir

from optimizer.text import shorten

MAX_REASON_CHARS = 600


@dataclass
class NearMiss:
    """A place where a rule's pattern matched partly: the user-facing answer to "why didn't X fuse?"."""

    rule: str
    anchor: str  # the anchor node's name (or op when unnamed)
    step: str
    reason: str
    barrier: str | None = None  # a custom op that broke the pattern, when that is why

    def __post_init__(self) -> None:
        # Names come from the model (hostile: a name can be megabytes) and reasons quote them,
        # so every field is bounded before it reaches a reply or a stored row.
        self.anchor = shorten(self.anchor)
        self.step = shorten(self.step, 80)
        self.reason = shorten(self.reason, MAX_REASON_CHARS)
        if self.barrier is not None:
            self.barrier = shorten(self.barrier)

    @property
    def message(self) -> str:
        return f"{self.rule} at {self.anchor}: {self.reason}"


@dataclass
class RuleStats:
    fired: int = 0
    ms: float = 0.0


@dataclass
class OptimizeReport:
    level: str
    nodes_before: int
    nodes_after: int
    ops_after: dict[str, int]
    fusions: dict[str, int]  # fused op key -> nodes of it that rules created and that survived
    rules: dict[str, RuleStats]
    graph_hash: str
    near_misses: list[NearMiss] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    total_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["near_misses"] = [dict(asdict(m), message=m.message) for m in self.near_misses]
        return data

    def explain(self, rule: str) -> list[NearMiss]:
        return [m for m in self.near_misses if m.rule == rule]


@dataclass
class OptimizeResult:
    model: ir.Model
    report: OptimizeReport
