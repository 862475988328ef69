"""Mark-all comparison on our engine: the unfused graph and the one our optimizer made, in our executor.

Both sessions are built from one loaded model (a session clones an `ir.Model` with its weights
shared), so the comparison holds the weights once plus what the fusions made. The optimized
session's graph keeps the optimizer's marks on the nodes a rule created (optimizer/rule.py), which
is how a row names its rule. Intermediates come from `InferenceSession.run_watching`, which hands
each watched value over as its node produces it and keeps nothing past its last reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx_ir as ir

import runtime
from optimizer import load_model
from optimizer.match import op_key
from optimizer.rule import FUSED_META_KEY, RULE_META_KEY
from service.adapters.engines.base import failing_as
from service.adapters.engines.compare import (
    BUDGET_BYTES,
    Comparison,
    Fetch,
    attribute,
    compare_tensors,
    sizes_of,
    surviving_tensors,
)
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.precision import TensorTolerances
from service.domain.tolerances import Tolerances

ENGINE = "fusionwatch"


def compare_native(
    model_path: str | Path,
    level: str,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    tolerances: Tolerances,
    *,
    disabled: Sequence[str] = (),
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    threads: int = 0,
    budget_bytes: int = BUDGET_BYTES,
) -> list[Comparison]:
    """One Comparison per feed set, in order. Raises EngineError when either session fails."""
    with failing_as(ENGINE, level, model_path, "could not load the model to compare"):
        model = load_model(Path(model_path))
    with failing_as(ENGINE, level, model_path, "could not create the sessions to compare"):
        reference = _session(model, "disabled", (), custom_ops, threads)
        optimized = _session(model, level, disabled, custom_ops, threads)
    surviving = surviving_tensors(
        _producers(reference.model.graph),
        _producers(optimized.model.graph),
        [value.name for value in reference.model.graph.outputs],
    )
    names = [s.tensor for s in surviving]
    judged = TensorTolerances.of_graph(tolerances, reference.model.graph)
    comparisons = []
    for feed_set, feeds in feed_sets.items():
        with failing_as(ENGINE, level, model_path, f"failed while comparing on feed set '{feed_set}'"):
            sizes = sizes_of(lambda sink, feeds=feeds: reference.run_watching(names, feeds, sink))
            comparisons.append(
                compare_tensors(
                    feed_set, surviving, _fetch(reference, feeds), _fetch(optimized, feeds), sizes, judged,
                    budget_bytes,
                )  # fmt: skip
            )
    return comparisons


def _session(
    model: ir.Model, level: str, disabled: Sequence[str], custom_ops: CustomOps, threads: int
) -> runtime.InferenceSession:
    options = runtime.SessionOptions(
        graph_optimization_level=level, disabled_optimizers=list(disabled), intra_op_num_threads=threads
    )
    return runtime.InferenceSession(model, options, extra_kernels=custom_ops.kernels)


def _producers(graph: ir.Graph):
    return attribute(
        (
            node.name or "",
            op_key(node),
            [value.name if value is not None else "" for value in node.inputs],
            [value.name for value in node.outputs],
            node.meta.get(RULE_META_KEY),
            bool(node.meta.get(FUSED_META_KEY)),
        )
        for node in graph
    )


def _fetch(session: runtime.InferenceSession, feeds: Mapping[str, np.ndarray]) -> Fetch:
    def fetch(names: Sequence[str]) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = {}
        session.run_watching(names, feeds, values.__setitem__)
        return values

    return fetch


def unfused_sizes(
    model_path: str | Path,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    threads: int = 0,
) -> dict[str, dict[str, int]]:
    """Bytes of every node output of the unfused graph per feed set, from one run of our executor
    each: how another engine's comparison (compare_onnxruntime.py) sizes its chunks."""
    with failing_as(ENGINE, "disabled", model_path, "could not size the tensors to compare"):
        session = _session(load_model(Path(model_path)), "disabled", (), custom_ops, threads)
        names = [value.name for node in session.model.graph for value in node.outputs]
        return {
            feed_set: sizes_of(lambda sink, feeds=feeds: session.run_watching(names, feeds, sink))
            for feed_set, feeds in feed_sets.items()
        }
