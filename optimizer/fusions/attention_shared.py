"""Matched nodes a reader outside the attention block still needs: left in the graph, not fused away.

TorchScript's MPT and T5 encoder reshape K into heads once and read that reshape twice: Kᵀ for the
scores, and a second Transpose whose only use is K's length (MPT slices its ALiBi table by it, T5
its position bias). The driver's boundary rule refuses any match whose intermediate value feeds a
node outside it, since removing the producer would leave that reader without its input. Here the
producer is not removed: the nodes whose outputs leave the block, and every matched node they are
computed from, stay in the graph exactly as they were, and the fused op replaces only the rest.
The outside reader then sees the very values it saw before, and the fused op computes what the
subgraph computed (it reads values the subgraph read, never a removed node's output), so the
rewrite is exact for every input. What nobody reads after the fusion goes with dead-code removal.

A kept node may be a projection (MPT's one QKV MatMul, T5's K MatMul): packed Attention would
compute it a second time. Then the block becomes MultiHeadAttention over Q, K and V as projected,
[batch, sequence, hidden] each (the projection's output, or the Slice/Split of it that picks that
role's columns), kept too; the layout probe proves each role's head split takes those columns in
order, head n at columns [n·H, (n+1)·H), which is how MultiHeadAttention splits its inputs.

Narrow on purpose: only the Q/K/V side may stay. A shared value inside the scaled-dot-product
core (the scores, the probabilities, a product) would keep the work the fusion exists to replace,
and a graph output is left to the driver's boundary near miss. The projected form takes no cache,
no causal `unidirectional`, no 3-D [batch*heads] scores and no GPT-2-style flattened projection;
with any of those and a kept projection the block stays a boundary near miss.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.fusions.attention_layout import LayoutProbe
from optimizer.match import consumers, describe, is_op
from optimizer.rule import Fail, Match, fail


def keep_shared(graph: ir.Graph, match: Match, core: list[ir.Node]) -> Match:
    """`match` less the nodes an outside reader needs (and their matched producers), as
    MultiHeadAttention over the projections when one of those is a projection; unchanged (for the
    driver's boundary near miss) when they include the core or a graph output, or when a kept
    projection leaves no form that does not compute it twice."""
    inside = {id(n) for n in match.nodes}
    replaced = {id(v) for v in match.outputs}
    leaving = []
    for node in match.nodes:
        for value in node.outputs:
            if id(value) in replaced:
                continue
            if value.is_graph_output():
                return match
            if any(id(user) not in inside for user in consumers(value)):
                leaving.append(node)
                break
    if not leaving:
        return match
    kept = _with_producers(leaving, inside)
    linear = {id(n) for path, _ in match.captures.get("parts", ()) for n in path.linear_nodes}
    if linear & kept.keys():
        projected = _projected(graph, match)
        if projected is None:
            return match
        kept = _with_producers(leaving + [v.producer() for v in projected], inside)
        match.captures["projected"] = projected
    outputs_from = {id(v.producer()) for v in match.outputs}
    if any(id(n) in kept for n in core) or outputs_from & kept.keys():
        match.captures.pop("projected", None)
        return match
    match.nodes = [n for n in match.nodes if id(n) not in kept]
    return match


def reads_own_output(match: Match, values: list[ir.Value]) -> Fail | None:
    """Why `match` cannot become one node, when one of `values`, outputs the fused op replaces (a
    present key/value), comes back into the block through nodes outside it: fused, the op would
    compute an input from its own output, a cycle no order of the nodes can run. The walk starts
    only at those outputs' outside readers, which are rarely more than the graph output; a Shape of
    the concatenated key (transformers' SDPA mask slice) is taken into the match as one the rewrite recomputes."""
    inside = {id(n) for n in match.nodes}
    for value in values:
        seen: set[int] = set()
        stack = [(u, u) for u in consumers(value) if id(u) not in inside]  # (node, the reader it came from)
        while stack:
            node, reader = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            for output in node.outputs:
                for user in consumers(output):
                    if id(user) in inside:
                        return fail("boundary", f"'{value.name}', an output the fused op would replace, is read by "
                                    f"{describe(reader)} outside the block, and what that computes reaches the block's "
                                    f"{describe(user)} (through {describe(node)}): fused, the op would need its own "
                                    "output as an input", reader)
                    stack.append((user, reader))
    return None


def _with_producers(nodes: list[ir.Node], inside: set[int]) -> dict[int, ir.Node]:
    """`nodes` and every matched node they are computed from."""
    kept: dict[int, ir.Node] = {}
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if id(node) in kept or id(node) not in inside:
            continue
        kept[id(node)] = node
        stack += [v.producer() for v in node.inputs if v is not None and v.producer() is not None]
    return kept


def _projected(graph: ir.Graph, match: Match) -> list[ir.Value] | None:
    """Q, K, V as [batch, sequence, hidden] values of the projections whose columns j are head
    j // H, position j % H of that role; None where the packed match has no such form."""
    captures = match.captures
    if captures.get("past") is not None or captures.get("present") or captures.get("unidirectional"):
        return None
    if captures.get("batched_bias") is not None or "parts" not in captures:
        return None
    hidden = captures["hidden"]
    values = []
    for path, columns in captures["parts"]:
        if path.flat_linear:
            return None
        value = _role_columns(graph, path, np.asarray(columns), hidden)
        if value is None:
            return None
        values.append(value)
    return values


def _role_columns(graph: ir.Graph, path, columns: np.ndarray, hidden: int) -> ir.Value | None:
    linear_out = path.linear_nodes[-1].outputs[0]
    width = path.weight.shape[1]
    start = int(columns[0])
    if columns.shape != (hidden,) or not np.array_equal(columns, start + np.arange(hidden)):
        return None
    if width == hidden:
        return linear_out
    first = path.chain[0] if path.chain else None
    if not (is_op(first, "Slice") or is_op(first, "Split")) or first.inputs[0] is not linear_out:
        return None
    # The probe evaluates the Slice bounds (MPT computes them from the projection's shape) or the
    # Split sizes at its sizes, on numbered columns: they must pick exactly start..start+hidden.
    probe = LayoutProbe(graph, path.x)
    probe.shapes[id(path.x)] = (probe.batch, probe.seq, path.weight.shape[0])
    numbered = np.arange(probe.batch * probe.seq * width, dtype=np.int64).reshape(probe.batch, probe.seq, width)
    probe.shapes[id(linear_out)] = numbered.shape
    picked = probe.run([first], numbered, path.picks)
    if isinstance(picked, str) or not np.array_equal(picked, numbered[..., start:start + hidden]):
        return None
    return first.outputs[path.picks.get(id(first), 0)]


__all__ = ["keep_shared", "reads_own_output"]
