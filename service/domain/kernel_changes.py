"""Per-kernel (op type) times of two measurements side by side: which kernels moved most.

The commit page shows them for every result against its baseline job; a paired regression carries its
own, profiled on both files alternately in the same job (service/adapters/paired_measure.py), which is
what its alert quotes as the why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelChange:
    op: str
    before: float | None  # ms a run; None: not among that side's slowest kernels (unknown, not zero)
    after: float | None

    @property
    def delta(self) -> float:
        return (self.after or 0) - (self.before or 0)

    def describe(self) -> str:
        def ms(value: float | None) -> str:
            return "–" if value is None else f"{value:.3f}"

        return f"{self.op} {ms(self.before)} → {ms(self.after)} ms"


def kernel_changes(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], limit: int) -> list[KernelChange]:
    """Per-op times ({"op", "ms"} lists, summed per op on each side), the largest changes first: an op
    on only one side's list ranks by its whole time (it appeared, or left the slowest kernels)."""

    def by_op(kernels: Sequence[dict[str, Any]]) -> dict[str, float]:
        times: dict[str, float] = {}
        for kernel in kernels:
            if isinstance(kernel.get("ms"), int | float):
                times[str(kernel.get("op"))] = times.get(str(kernel.get("op")), 0.0) + float(kernel["ms"])
        return times

    old, new = by_op(before), by_op(after)
    changes = [KernelChange(op, old.get(op), new.get(op)) for op in set(old) | set(new)]
    changes.sort(key=lambda c: (-abs(c.delta), c.op))
    return changes[:limit]
