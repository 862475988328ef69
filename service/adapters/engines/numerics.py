"""The numeric check of one job: its engine's fused graph against the same engine's unfused one, per feed set.

Every feed set (the synthesized ones from feeds.py, and a project's own) gets a mark-all comparison
(compare.py) on the job's engine: ours in compare_native.py, onnxruntime's in compare_onnxruntime.py.
The job is numerically fine when on every feed set the graph outputs stay within tolerance and no
tensor holds NaN or inf the unfused graph does not. Which feed set each check used is kept with the
result (`summaries`), and the worst comparison in full (`worst`), whose first diverging tensor an
alert names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np

from service.adapters.engines.base import EngineError
from service.adapters.engines.compare import Comparison
from service.adapters.engines.compare_native import compare_native, unfused_sizes
from service.adapters.engines.compare_onnxruntime import compare_onnxruntime
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import describe_feeds
from service.domain.tolerances import Tolerances


@dataclass
class NumericCheck:
    comparisons: list[Comparison]
    inputs: dict[str, dict[str, str]]  # feed set -> its feeds' dtypes and shapes

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def max_abs(self) -> float:
        return max((c.outputs_max_abs for c in self.comparisons), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((c.outputs_max_rel for c in self.comparisons), default=0.0)

    @property
    def worst(self) -> Comparison | None:
        """The comparison an alert quotes: a failing one first (new NaN/inf before mere error), then
        the one with the most diverging tensors, then the largest output error."""
        return max(
            self.comparisons,
            key=lambda c: (not c.ok, c.new_nonfinite, c.first is not None, c.diverging, c.outputs_max_abs),
            default=None,
        )

    def summaries(self) -> list[dict[str, Any]]:
        """Per feed set: what it fed, and what the check found there (no tensor values)."""
        summaries = []
        for c in self.comparisons:
            data = c.to_dict()
            first = c.first
            summaries.append({
                "feed_set": c.feed_set, "inputs": self.inputs.get(c.feed_set, {}), "status": c.status,
                "ok": c.ok, "tensors": c.tensors, "diverging": c.diverging,
                "max_abs": data["outputs_max_abs"], "max_rel": data["outputs_max_rel"],
                "first": first.tensor if first else None, "failed_outputs": list(c.failed_outputs),
            })  # fmt: skip
        return summaries


class CompareOptions(TypedDict, total=False):
    """The keywords check_numerics passes on to the engine's comparison; compare_native's signature
    holds their defaults, so they are written once."""

    disabled: Sequence[str]  # rules kept out of the fused graph, as in the measurement
    custom_ops: CustomOps
    threads: int  # our executor's; onnxruntime's comparison takes none, only the sizing run uses them
    budget_bytes: int  # how many bytes of marked tensors one chunk of a comparison may hold


def check_numerics(
    engine: str,
    model_path: str | Path,
    level: str,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    tolerances: Tolerances,
    **options: Unpack[CompareOptions],
) -> NumericCheck:
    """Raises EngineError when the engine cannot run either graph on a feed set."""
    if engine == "fusionwatch":
        comparisons = compare_native(model_path, level, feed_sets, tolerances, **options)
    elif engine == "onnxruntime":
        threads = options.pop("threads", 0)
        try:
            sizes = unfused_sizes(model_path, feed_sets, options.get("custom_ops", NO_CUSTOM_OPS), threads)
        except EngineError:
            sizes = None  # our executor cannot run it: onnxruntime's chunks go by count instead of bytes
        comparisons = compare_onnxruntime(model_path, level, feed_sets, tolerances, sizes=sizes, **options)
    else:
        raise ValueError(f"unknown engine {engine!r}")
    return NumericCheck(comparisons, {name: describe_feeds(feeds) for name, feeds in feed_sets.items()})
