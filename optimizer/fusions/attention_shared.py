"""Matched nodes a reader outside the attention block still needs: left in the graph, not fused away.

TorchScript's MPT and T5 encoder reshape K into heads once and read that reshape twice: Kᵀ for the
scores, and a second Transpose whose only use is K's length (MPT slices its ALiBi table by it, T5
its position bias). The driver's boundary rule refuses any match whose intermediate value feeds a
node outside it, since removing the producer would leave that reader without its input. Here the
producer is not removed: the nodes whose outputs leave the block, and every matched node they are
computed from, stay in the graph exactly as they were, and the fused op replaces only the rest.
The outside reader then sees the very values it saw before, and the fused op computes what the
subgraph computed (it reads the block's inputs, never a matched node's output), so the rewrite is
exact for every input. What nobody reads after the fusion goes with dead-code removal.

Narrow on purpose: only the Q/K/V side may stay. A shared value inside the scaled-dot-product
core (the scores, the probabilities, a product) would keep the work the fusion exists to replace,
and a graph output is left to the driver's boundary near miss. The price where a kept node is a
projection (MPT's packed QKV MatMul, T5's K MatMul): the fused op computes that projection again,
a MatMul per layer against the whole block in one op.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import consumers
from optimizer.rule import Match


def keep_shared(match: Match, core: list[ir.Node]) -> Match:
    """`match` less the nodes an outside reader needs (and their matched producers); unchanged
    (for the driver's boundary near miss) when those would include the core or a graph output."""
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
    kept: dict[int, ir.Node] = {}
    stack = list(leaving)
    while stack:
        node = stack.pop()
        if id(node) in kept:
            continue
        kept[id(node)] = node
        stack += [v.producer() for v in node.inputs if v is not None and id(v.producer()) in inside]
    core_ids = {id(n) for n in core}
    outputs_from = {id(v.producer()) for v in match.outputs}
    if any(key in core_ids or key in outputs_from for key in kept):
        return match
    match.nodes = [n for n in match.nodes if id(n) not in kept]
    return match


__all__ = ["keep_shared"]
