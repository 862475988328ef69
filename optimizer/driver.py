"""The optimizer's driver: run a level's ordered rules over a graph until nothing fires.

Like ONNX Runtime's graph transformer manager, the level's list is applied in order and
repeated while any rule still fires (a fusion can expose another). Near misses are
collected in the last, quiet round, so they describe the graph the user gets back.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from optimizer.graph_hash import graph_hash
from optimizer.levels import LEVEL_NAMES, rules_for_level
from optimizer.match import consumers, describe, is_custom, op_key
from optimizer.model_io import load_model, save_model
from optimizer.report import NearMiss, OptimizeReport, OptimizeResult, RuleStats
from optimizer.rule import FUSED_META_KEY, RULE_META_KEY, Fail, Match, Rule, mark_created
from optimizer.shape_inference import infer_shapes

log = logging.getLogger("fusionwatch.optimizer")

MAX_ROUNDS = 10


def optimize(
    model: str | os.PathLike | onnx.ModelProto | ir.Model,
    level: str = "all",
    disabled: tuple[str, ...] | list[str] = (),
    enable_gelu_approximation: bool = False,
    output: str | os.PathLike | None = None,
) -> OptimizeResult:
    """Optimize `model` at `level` ("disabled", "basic", "extended", "layout", "all").

    `disabled` takes ONNX Runtime rule names ("BiasGeluFusion"). An `ir.Model` argument is
    optimized in place; paths and protos are loaded into a new one. With `output`, the
    optimized model is also written there (weights external when above 2 GiB).
    """
    rules = rules_for_level(level, disabled=disabled, enable_gelu_approximation=enable_gelu_approximation)
    model = load_model(model)
    graph = model.graph
    nodes_before = graph.num_nodes()
    started = time.perf_counter()
    if rules:
        infer_shapes(model)
    stats = {rule.name: RuleStats() for rule in rules}
    # Folding can only turn a symbolic dimension into a number when the inputs it derives from
    # are numbers; with a symbolic batch or sequence a second inference learns nothing, and it
    # costs as much as the first (~150 ms on BERT-base).
    static_inputs = all(
        v.shape is not None and all(isinstance(d, int) for d in v.shape) for v in graph.inputs
    )
    near_misses: list[NearMiss] = []
    for _ in range(MAX_ROUNDS):
        near_misses = []
        fired = 0
        for rule in rules:
            count = _apply(rule, graph, stats[rule.name], near_misses)
            if count and rule.refines_shapes and static_inputs:
                infer_shapes(model, refine=True)
            fired += count
        if not fired:
            break
    else:
        log.warning("optimizer did not settle after %d rounds", MAX_ROUNDS)
    if rules:
        # Fusions leave weights they absorbed and shape arithmetic nobody reads any more.
        RemoveUnusedNodesPass()(model)
    graph.sort()
    total_ms = (time.perf_counter() - started) * 1000

    report = OptimizeReport(
        level=level,
        nodes_before=nodes_before,
        nodes_after=graph.num_nodes(),
        ops_after=dict(sorted(Counter(op_key(n) for n in graph).items())),
        fusions=dict(sorted(Counter(op_key(n) for n in graph if FUSED_META_KEY in n.meta).items())),
        rules=stats,
        graph_hash=graph_hash(graph),
        near_misses=_dedupe(near_misses),
        disabled=sorted(disabled),
        total_ms=total_ms,
    )
    if output is not None:
        save_model(model, output)
    return OptimizeResult(model=model, report=report)


def _apply(rule: Rule, graph: ir.Graph, stats: RuleStats, near_misses: list[NearMiss]) -> int:
    """One rule over the whole graph; returns how many times it fired."""
    started = time.perf_counter()
    if not rule.anchors:
        fired = rule.run_on_graph(graph)
    else:
        fired = 0
        anchors = set(rule.anchors)
        for node in [n for n in graph if op_key(n) in anchors]:
            if node.graph is not graph:  # removed by an earlier rewrite in this sweep
                continue
            result = rule.match(graph, node)
            if isinstance(result, Match):
                result = _check_boundaries(result)
            if isinstance(result, Fail):
                near_misses.append(_near_miss(rule, node, result))
            elif isinstance(result, Match):
                _rewrite(rule, graph, result)
                fired += 1
    stats.fired += fired
    stats.ms += (time.perf_counter() - started) * 1000
    return fired


def _check_boundaries(match: Match) -> Match | Fail:
    """Every fusion's shared safety rule: only the replaced outputs may leave the match."""
    inside = {id(n) for n in match.nodes}
    replaced = {id(v) for v in match.outputs}
    for node in match.nodes:
        for value in node.outputs:
            if id(value) in replaced:
                continue
            if value.is_graph_output():
                return Fail("boundary", f"intermediate value '{value.name}' is a graph output", node)
            for user in consumers(value):
                if id(user) not in inside:
                    return Fail(
                        "boundary", f"intermediate value '{value.name}' also feeds {describe(user)}", user
                    )
    return match


def _rewrite(rule: Rule, graph: ir.Graph, match: Match) -> None:
    tape = ir.tape.Tape()  # unbound: the driver places the nodes itself
    new_values = rule.rewrite(tape, match)
    if isinstance(new_values, ir.Value):
        new_values = [new_values]
    if len(new_values) != len(match.outputs):
        raise RuntimeError(f"{rule.name}: rewrite returned {len(new_values)} values for {len(match.outputs)} outputs")
    anchor = match.nodes[-1].name or match.nodes[-1].op_type
    for index, node in enumerate(tape.nodes):
        mark_created(node, rule)
        graph.opset_imports.setdefault(node.domain, 1)
        if not node.name:  # onnxruntime rejects duplicate node names
            node.name = f"{rule.name}/{anchor.lstrip('/')}" + (f"/{index}" if index else "")
    for initializer in tape.initializers:
        graph.register_initializer(initializer)
    # The producer of the first replaced output comes after every other matched node in
    # topological order; inserting there keeps the graph sorted.
    insertion_point = match.outputs[0].producer()
    ir.convenience.replace_nodes_and_values(
        graph, insertion_point, match.nodes, tape.nodes, match.outputs, new_values
    )


def _near_miss(rule: Rule, anchor: ir.Node, failure: Fail) -> NearMiss:
    barrier = op_key(failure.node) if failure.node is not None and is_custom(failure.node) else None
    return NearMiss(
        rule=rule.name,
        anchor=anchor.name or op_key(anchor),
        step=failure.step,
        reason=failure.reason,
        barrier=barrier,
    )


def _dedupe(near_misses: list[NearMiss]) -> list[NearMiss]:
    seen: dict[tuple[str, str, str], NearMiss] = {}
    for miss in near_misses:
        seen.setdefault((miss.rule, miss.anchor, miss.reason), miss)
    return list(seen.values())


__all__ = ["optimize", "LEVEL_NAMES", "MAX_ROUNDS", "RULE_META_KEY", "FUSED_META_KEY"]
