"""Mark-all comparison on onnxruntime: its unfused graph and the one it optimized, with the tensors marked.

onnxruntime keeps no intermediate it was not asked for, so, as Polygraphy does, each chunk of
surviving tensors is added to the graph outputs of a copy of the model and run in a fresh session
with graph optimizations off, one graph at a time; each session runs every feed set, since creating
it costs more than running it (the chunk's budget is split among the feed sets). The optimized graph is the one onnxruntime writes
(`optimized_model_filepath`) at the level; the unfused one is written the same way at
ORT_DISABLE_ALL, so both lie in one temporary folder with their weights in a file beside them,
and each marked copy is only its graph.

onnxruntime does not say which transformer made a node; as for the counts (onnxruntime.py), a node
is a fusion when its op is one our rules at this level emit and the original has no node of that
name and op, and the rule named is ours that emits that op.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from optimizer.levels import LEVELS
from optimizer.match import op_key
from service.adapters.engines.base import EngineError, failing_as
from service.adapters.engines.compare import (
    BUDGET_BYTES,
    Comparison,
    Fetch,
    Producer,
    Surviving,
    Tally,
    attribute,
    compare_tensors,
    plan_chunks,
    surviving_tensors,
)
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.onnxruntime import (
    HELPER_NAME_PREFIXES,
    OPTIMIZED_MODEL,
    OnnxruntimeEngine,
    graph_optimization_level,
    session_options,
)
from service.adapters.engines.precision import TensorTolerances
from service.domain.tolerances import Tolerances

ENGINE = OnnxruntimeEngine.name


def write_graphs(
    model_path: Path, level: str, folder: Path, disabled: Sequence[str] = (), custom_ops: CustomOps = NO_CUSTOM_OPS
) -> tuple[Path, Path]:
    """(unfused, optimized) model files onnxruntime wrote into `folder`, weights beside each.
    Raises EngineError naming the level onnxruntime could not write (its NCHWc layout graphs)."""
    engine = OnnxruntimeEngine()
    paths = []
    for label, at in (("unfused", "disabled"), ("optimized", level)):
        member, value = graph_optimization_level(at)
        into = folder / label  # each beside its own weights file, which has a fixed name
        into.mkdir()
        graph, error = engine._optimized_graph(
            model_path, member, value, into, tuple(disabled) if at == level else (), custom_ops
        )  # fmt: skip
        if graph is None:
            raise EngineError(ENGINE, level, model_path, f"cannot compare its tensors: {error}")
        paths.append(into / OPTIMIZED_MODEL)
    return paths[0], paths[1]


def compare_onnxruntime_files(
    unfused_path: Path,
    optimized_path: Path,
    level: str,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    tolerances: Tolerances,
    *,
    sizes: Mapping[str, dict[str, int] | None] | None = None,
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    budget_bytes: int = BUDGET_BYTES,
) -> list[Comparison]:
    """Compare two graphs onnxruntime wrote (their weights beside them); `sizes` per feed set, from
    a sizing run of the unfused graph where one was possible."""
    unfused = onnx.load(str(unfused_path), load_external_data=False)
    optimized = onnx.load(str(optimized_path), load_external_data=False)
    existing = {(node.name, op_key(node)) for node in unfused.graph.node}
    surviving = surviving_tensors(
        attribute(_described(unfused.graph, level, existing=None)),
        attribute(_described(optimized.graph, level, existing)),
        [value.name for value in unfused.graph.output],
    )
    judged = TensorTolerances.of_graph(tolerances, ir.serde.deserialize_graph(unfused.graph))
    sizes = sizes or {}
    names = [s.tensor for s in surviving]
    # One session per chunk and graph runs every feed set, so each side's chunk holds every feed set's
    # values: the budget is split among them, each chunk sized by its largest feed set.
    merged = None
    if all(sizes.get(feed_set) is not None for feed_set in feed_sets):
        merged = {name: max(sizes[feed_set].get(name, 0) for feed_set in feed_sets) for name in names}
    chunks = plan_chunks(names, merged, budget_bytes // max(1, len(feed_sets)))
    if isinstance(chunks, str):  # too many runs together: one feed set at a time, each its own budget
        return [
            compare_tensors(
                feed_set, surviving,
                _fetch(unfused, unfused_path, feeds, custom_ops), _fetch(optimized, optimized_path, feeds, custom_ops),
                sizes.get(feed_set), judged, budget_bytes,
            )  # fmt: skip
            for feed_set, feeds in feed_sets.items()
        ]
    tallies = {feed_set: Tally(feed_set, surviving, judged) for feed_set in feed_sets}
    for chunk in chunks:
        with failing_as(ENGINE, level, optimized_path, "failed while comparing"):
            got = _run_all(optimized, optimized_path, chunk, feed_sets, custom_ops)
            want = _run_all(unfused, unfused_path, chunk, feed_sets, custom_ops)
        for feed_set, tally in tallies.items():
            tally.add(chunk, want.pop(feed_set), got.pop(feed_set))
    return [tally.comparison() for tally in tallies.values()]


def _run_all(
    model: onnx.ModelProto, path: Path, names: Sequence[str], feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    custom_ops: CustomOps,
) -> dict[str, dict[str, np.ndarray]]:
    """The chunk's values on every feed set, from one session of the marked model."""
    session = _marked_session(model, path, names, custom_ops)
    wanted = list(names)
    return {
        feed_set: dict(zip(wanted, session.run(wanted, dict(feeds)), strict=True)) for feed_set, feeds in feed_sets.items()
    }


def compare_onnxruntime(
    model_path: str | Path,
    level: str,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    tolerances: Tolerances,
    *,
    sizes: Mapping[str, dict[str, int] | None] | None = None,
    disabled: Sequence[str] = (),
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    budget_bytes: int = BUDGET_BYTES,
) -> list[Comparison]:
    """One Comparison per feed set, onnxruntime's fusions at `level` against its unfused graph."""
    with tempfile.TemporaryDirectory(prefix="fusionwatch-compare-") as name:
        try:
            unfused_path, optimized_path = write_graphs(Path(model_path), level, Path(name), disabled, custom_ops)
        except EngineError as error:
            return compare_outputs_only(Path(model_path), level, feed_sets, tolerances, disabled, custom_ops, error.problem)
        return compare_onnxruntime_files(
            unfused_path, optimized_path, level, feed_sets, tolerances, sizes=sizes, custom_ops=custom_ops,
            budget_bytes=budget_bytes,
        )  # fmt: skip


def compare_outputs_only(
    model_path: Path,
    level: str,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]],
    tolerances: Tolerances,
    disabled: Sequence[str],
    custom_ops: CustomOps,
    reason: str,
) -> list[Comparison]:
    """When onnxruntime cannot write its optimized graph (its NCHWc layout graphs), no tensor inside
    can be marked: the graph outputs are compared, at the level against ORT_DISABLE_ALL, and the
    comparison says why it went no deeper."""
    model = onnx.load(str(model_path), load_external_data=False)
    outputs = [value.name for value in model.graph.output]
    judged = TensorTolerances.of_graph(tolerances, ir.serde.deserialize_graph(model.graph))
    surviving = [
        Surviving(name, Producer("", "graph output"), Producer("", "graph output"), graph_output=True) for name in outputs
    ]
    sessions = {}
    for at in ("disabled", level):
        options = session_options(graph_optimization_level(at)[1], custom_ops)
        with failing_as(ENGINE, level, model_path, f"could not create the session at {at} to compare"):
            sessions[at] = ort.InferenceSession(
                str(model_path), options, providers=["CPUExecutionProvider"],
                disabled_optimizers=list(disabled) if at == level else [],
            )  # fmt: skip
    comparisons = []
    for feed_set, feeds in feed_sets.items():
        def fetch(at: str, feeds=feeds) -> Fetch:
            return lambda names: dict(zip(names, sessions[at].run(list(names), dict(feeds)), strict=True))

        with failing_as(ENGINE, level, model_path, f"failed while comparing on feed set '{feed_set}'"):
            comparison = compare_tensors(feed_set, surviving, fetch("disabled"), fetch(level), None, judged)
        comparison.status, comparison.reason = "unavailable", reason
        comparisons.append(comparison)
    return comparisons


def _rules_by_op(level: str) -> dict[str, str]:
    rules: dict[str, str] = {}
    for rule in LEVELS[level]:
        for op in rule.emits:
            rules.setdefault(op, rule.name)
    return rules


def _described(graph: onnx.GraphProto, level: str, existing: set[tuple[str, str]] | None):
    """(name, op, inputs, outputs, rule, fused) per node; `existing` None for the unfused graph."""
    rules = _rules_by_op(level) if existing is not None else {}
    for node in graph.node:
        key = op_key(node)
        new = existing is not None and (node.name, key) not in existing
        fused = new and key in rules and not node.name.startswith(HELPER_NAME_PREFIXES)
        yield node.name, key, list(node.input), list(node.output), rules.get(key) if fused else None, fused


def _marked_session(
    model: onnx.ModelProto, path: Path, names: Sequence[str], custom_ops: CustomOps
) -> ort.InferenceSession:
    """A session of `model` with `names` added to its graph outputs, optimizations off."""
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    present = {value.name for value in marked.graph.output}
    typed = {value.name: value for value in marked.graph.value_info}
    for name in names:
        if name not in present:
            # onnxruntime infers an output's type when the graph does not record it.
            marked.graph.output.append(typed.get(name) or onnx.helper.make_empty_tensor_value_info(name))
    # Beside the original, so the weights file it names is found.
    marked_path = path.with_name(f"{path.stem}.marked.onnx")
    onnx.save(marked, str(marked_path))
    options = session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, custom_ops)
    return ort.InferenceSession(str(marked_path), options, providers=["CPUExecutionProvider"])


def _fetch(model: onnx.ModelProto, path: Path, feeds: Mapping[str, np.ndarray], custom_ops: CustomOps) -> Fetch:
    def fetch(names: Sequence[str]) -> dict[str, np.ndarray]:
        session = _marked_session(model, path, names, custom_ops)
        wanted = list(names)
        return dict(zip(wanted, session.run(wanted, dict(feeds)), strict=True))

    return fetch
