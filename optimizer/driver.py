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
from optimizer.match import TAKEN_NAMES_META_KEY, consumers, describe, is_custom, op_key
from optimizer.model_io import DEFAULT_LIMITS, LoadLimits, load_model, save_model
from optimizer.report import NearMiss, OptimizeReport, OptimizeResult, RuleStats
from optimizer.rule import FUSED_META_KEY, RULE_META_KEY, Fail, Match, Rule, mark_created
from optimizer.shape_inference import in_order, infer_shapes
from optimizer.shape_probe import forget_pinned

log = logging.getLogger("fusionwatch.optimizer")

MAX_ROUNDS = 10


def optimize(
    model: str | os.PathLike | onnx.ModelProto | ir.Model,
    level: str = "all",
    disabled: tuple[str, ...] | list[str] = (),
    enable_gelu_approximation: bool = False,
    output: str | os.PathLike | None = None,
    *,
    base_dir: str | os.PathLike | None = None,
    limits: LoadLimits = DEFAULT_LIMITS,
) -> OptimizeResult:
    """Optimize `model` at `level` ("disabled", "basic", "extended", "layout", "all").

    `disabled` takes ONNX Runtime rule names ("BiasGeluFusion"). An `ir.Model` argument is
    optimized in place; paths and protos are loaded into a new one. With `output`, the
    optimized model is also written there (weights external when above 2 GiB). `base_dir` and
    `limits` go to `load_model`, the one checked way in.
    """
    rules = rules_for_level(level, disabled=disabled, enable_gelu_approximation=enable_gelu_approximation)
    model = load_model(model, base_dir=base_dir, limits=limits)
    graph = model.graph
    nodes_before = graph.num_nodes()
    started = time.perf_counter()
    if rules:
        infer_shapes(model)
    stats = {rule.name: RuleStats() for rule in rules}
    # Folding can only turn a symbolic dimension into a number when the inputs it derives from
    # are numbers; with a symbolic sequence a second inference learns nothing, and it costs as
    # much as the first (~150 ms on BERT-base). A symbolic batch alone still leaves every other
    # size a number: TorchScript's TF-style "same" padding computes its pads from an image's size,
    # and once they are folded inference names the spatial sizes after them (and the batch).
    static_inputs = all(
        v.shape is not None and all(isinstance(d, int) for d in list(v.shape)[1:]) for v in graph.inputs
    )
    near_misses: list[NearMiss] = []
    anchors = _AnchorIndex(graph)
    # Rules that undo a form other rules read (Slices made one Split) wait until the others settle;
    # then every rule runs again, so whatever they expose still fuses.
    early = [rule for rule in rules if not rule.runs_after_others]
    quiet = _QuietRules()
    for phase in [early, rules] if len(early) < len(rules) else [rules]:
        for _ in range(MAX_ROUNDS):
            near_misses = []
            fired = 0
            for rule in phase:
                if quiet.saw_this_graph(rule):
                    near_misses.extend(quiet.near_misses(rule))
                    continue
                misses: list[NearMiss] = []
                count = apply_rule(rule, graph, stats[rule.name], misses, anchors)
                near_misses.extend(misses)
                if count:
                    anchors.invalidate()
                if count and rule.refines_shapes and static_inputs:
                    infer_shapes(model, refine=True)
                quiet.ran(rule, count, misses)
                fired += count
            if not fired:
                break
        else:
            log.warning("optimizer did not settle after %d rounds", MAX_ROUNDS)
    forget_pinned(graph, keep_unoptimized=False)
    # Rewrites insert where the graph stays in order, so this is usually already true; checking
    # costs a third of onnx-ir's sort, which is stable and would leave such a graph as it is.
    if not in_order(graph):
        graph.sort()
    if rules:
        # Fusions leave weights they absorbed and shape arithmetic nobody reads any more. The pass
        # sweeps once from the last node back, so a dead chain goes whole only in topological
        # order (a model listing its nodes out of order kept a Shape -> Gather whose reader died).
        RemoveUnusedNodesPass()(model)
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


class _AnchorIndex:
    """The graph's nodes grouped by op key, in graph order, kept while the graph is unchanged.

    Most rules find no anchor or fire nowhere in most rounds; scanning the whole graph once
    per rule cost more than matching did (23 rules x 3,000 nodes on GPT-2). A rule that
    matched but did not fire leaves the graph as it was, and a whole-graph rule counts every
    change it makes (a fold, a merge, a converted region), so only a firing rule invalidates
    the index.
    """

    def __init__(self, graph: ir.Graph) -> None:
        self._graph = graph
        self._nodes: dict[str, list[ir.Node]] | None = None
        self._positions: dict[ir.Node, int] | None = None  # only rules with several anchors need them

    def invalidate(self) -> None:
        self._nodes = self._positions = None

    def nodes_for(self, anchors: tuple[str, ...]) -> list[ir.Node]:
        """The nodes whose op key is one of `anchors`, in graph order."""
        if self._nodes is None:
            # op_key inlined: the index is rebuilt after every rule that fired, ~60 times a tiny GPT-2
            self._nodes = {}
            for node in self._graph:
                domain = node.domain
                key = node.op_type if domain in _ONNX_DOMAINS else f"{domain}.{node.op_type}"
                found = self._nodes.get(key)
                if found is None:
                    self._nodes[key] = [node]
                else:
                    found.append(node)
        if len(anchors) == 1:
            return list(self._nodes.get(anchors[0], ()))
        found = [node for anchor in dict.fromkeys(anchors) for node in self._nodes.get(anchor, ())]
        if len(found) > 1:
            if self._positions is None:
                self._positions = {node: position for position, node in enumerate(self._graph)}
            found.sort(key=self._positions.__getitem__)
        return found


_ONNX_DOMAINS = ("", "ai.onnx")  # op_key's names for ONNX's own domain


class _QuietRules:
    """The rules that fired nowhere, each with the graph change it last ran after and its near misses.

    A rule fires and reports as the graph it is given decides (rule.py: it keeps nothing between
    calls), and one that fires nowhere leaves that graph as it was. So a rule that fired nowhere
    and has seen no rewrite since would fire nowhere again and say the same: the round that proves
    the level settled (and the held-back rules' phase, whose first round starts on the graph the
    first phase settled on) need not run it. About a quarter of a tiny GPT-2's optimize was such
    repeats.
    """

    def __init__(self) -> None:
        self._changes = 0  # rules that fired so far, in every round
        self._quiet: dict[str, tuple[int, list[NearMiss]]] = {}

    def saw_this_graph(self, rule: Rule) -> bool:
        seen = self._quiet.get(rule.name)
        return seen is not None and seen[0] == self._changes

    def near_misses(self, rule: Rule) -> list[NearMiss]:
        return self._quiet[rule.name][1]

    def ran(self, rule: Rule, fired: int, near_misses: list[NearMiss]) -> None:
        if fired:
            self._changes += 1
            self._quiet.pop(rule.name, None)
        else:
            self._quiet[rule.name] = (self._changes, near_misses)


class _TakenNames:
    """The names unique_name must avoid (initializers, graph inputs, node outputs), as a set
    that follows the driver's rewrites instead of walking every node on each question."""

    def __init__(self, graph: ir.Graph) -> None:
        self._graph = graph
        self._outputs: Counter[str | None] | None = None

    def __contains__(self, name: str) -> bool:
        if self._outputs is None:
            self._outputs = Counter(v.name for node in self._graph for v in node.outputs)
        return (
            self._outputs[name] > 0
            or name in self._graph.initializers
            or any(v.name == name for v in self._graph.inputs)
        )

    def replaced(self, removed_names: list[str | None], added: list[ir.Node]) -> None:
        if self._outputs is not None:
            self._outputs.subtract(removed_names)
            self._outputs.update(v.name for node in added for v in node.outputs)


def apply_rule(
    rule: Rule,
    graph: ir.Graph,
    stats: RuleStats,
    near_misses: list[NearMiss],
    anchor_index: _AnchorIndex | None = None,
) -> int:
    """One rule over the whole graph; returns how many times it fired."""
    started = time.perf_counter()
    if not rule.anchors:
        misses: list[tuple[ir.Node, Fail]] = []
        fired = rule.run_on_graph(graph, misses)
        near_misses.extend(_near_miss(rule, node, failure) for node, failure in misses)
    else:
        fired = 0
        candidates = (anchor_index or _AnchorIndex(graph)).nodes_for(tuple(rule.anchors))
        # Only for this sweep, whose every change goes through _rewrite (which updates it).
        taken = graph.meta[TAKEN_NAMES_META_KEY] = _TakenNames(graph)
        try:
            for node in candidates:
                if node.graph is not graph:  # removed by an earlier rewrite in this sweep
                    continue
                result = _guarded_match(rule, graph, node)
                if result is None:  # every anchor that did not fire is reported (rule.py)
                    result = Fail("anchor", f"{describe(node)} is not where {rule.name}'s pattern starts", node)
                if isinstance(result, Match):
                    result = _check_boundaries(result)
                if isinstance(result, Fail):
                    near_misses.append(_near_miss(rule, node, result))
                elif isinstance(result, Match):
                    _rewrite(rule, graph, result, taken)
                    fired += 1
        finally:
            del graph.meta[TAKEN_NAMES_META_KEY]
    stats.fired += fired
    stats.ms += (time.perf_counter() - started) * 1000
    return fired


def _guarded_match(rule: Rule, graph: ir.Graph, node: ir.Node) -> Match | Fail | None:
    """A rule's match, with its own failure on a malformed graph reported as a near miss.

    Rules read shapes and constants an invalid model can make inconsistent (a perm that repeats an
    axis, a table that is missing); such a model must get a report saying where, not take the
    optimizer (and a service's job) down. The warning carries the traceback, so a bug in a rule on
    a valid model still shows.
    """
    try:
        return rule.match(graph, node)
    except Exception as error:  # noqa: BLE001 — reported below, not swallowed
        log.warning("rule raised on a node", extra={"rule": rule.name, "node": describe(node)[:200]}, exc_info=True)
        return Fail("error", f"{rule.name} could not read this part of the graph ({type(error).__name__}: {error})", node)


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


def _rewrite(rule: Rule, graph: ir.Graph, match: Match, taken: _TakenNames) -> None:
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
    removed_names = [v.name for node in match.nodes for v in node.outputs]
    ir.convenience.replace_nodes_and_values(
        graph, insertion_point, match.nodes, tape.nodes, match.outputs, new_values
    )
    taken.replaced(removed_names, tape.nodes)


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
