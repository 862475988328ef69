"""GatherSliceToSplitFusion: Slices of one value that cut one axis into consecutive pieces  =>  one Split.

Exporters write `x[..., :half]` and `x[..., half:]` (rotary's rotate_half, a fused QKV projection cut
into Q, K and V) as one Slice per piece; a Split reads the input once and makes every piece. The
Slices must read the same value on the same axis with step 1, and together cover that axis, whose
size must be known, exactly once. Other readers of the value may stay. ONNX Runtime's rule of this
name also takes Gathers of one index; those would need a Squeeze after the Split, leaving as many
nodes as before, so only Slices are taken here.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.fusions.eliminate_slice import slice_bounds
from optimizer.match import consumers, describe, is_op, opset, unique_name, value_name
from optimizer.rule import Match, Rule, fail


class GatherSliceToSplitFusion(Rule):
    name = "GatherSliceToSplitFusion"
    anchors = ("Slice",)
    emits = ()  # a Split is not a fused op: counted in the rule's stats, not the report's fusions
    runs_after_others = True  # rotary's rotate_half and attention's QKV cuts are matched as Slices

    def match(self, graph: ir.Graph, anchor: ir.Node):
        data = anchor.inputs[0]
        slices = [node for node in consumers(data) if is_op(node, "Slice") and node.inputs[0] is data]
        if len(slices) < 2:
            return fail("pieces", f"'{value_name(data)}' is cut by this Slice alone; one Split would not save a node")
        if data.shape is None:
            return fail("shape", f"the shape of '{value_name(data)}' is unknown")
        rank = len(data.shape)
        pieces = []
        for node in slices:
            piece = _piece(graph, node, rank, data.shape)
            if isinstance(piece, str):
                return fail("bounds", f"{describe(node)} {piece}", node)
            pieces.append((*piece, node))
        axes = {axis for axis, _, _, _ in pieces}
        if len(axes) != 1:
            return fail("bounds", f"the Slices of '{value_name(data)}' cut different axes {sorted(axes)}")
        (axis,) = axes
        pieces.sort(key=lambda piece: piece[1])
        covered = 0
        for _, start, end, node in pieces:
            if start != covered:
                what = "overlaps the piece before it" if start < covered else f"leaves [{covered}, {start}) out"
                return fail("cover", f"{describe(node)} starts at {start}: it {what}", node)
            covered = end
        if covered != data.shape[axis]:
            return fail("cover", f"the Slices end at {covered} of axis {axis}'s {data.shape[axis]}")
        position = {id(node): index for index, node in enumerate(graph) if id(node) in {id(p[3]) for p in pieces}}
        # The driver places the Split where the first replaced output's producer stood: the earliest Slice,
        # which comes before every reader of every piece.
        order = sorted(range(len(pieces)), key=lambda i: position[id(pieces[i][3])])
        return Match(nodes=[pieces[i][3] for i in order], outputs=[pieces[i][3].outputs[0] for i in order],
                     captures={"data": data, "axis": axis, "sizes": [end - start for _, start, end, _ in pieces],
                               "order": order, "sizes_as_input": opset(graph) >= 13,
                               "sizes_name": unique_name(graph, f"{data.name or 'split'}_sizes")})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        count = len(match.sizes)
        if match.sizes_as_input:
            sizes = op.initializer(ir.tensor(match.sizes, dtype=ir.DataType.INT64, name=match.sizes_name))
            node_outputs = op.op_multi_out("Split", [match.data, sizes], {"axis": match.axis}, num_outputs=count)
        else:
            attributes = {"axis": match.axis, "split": match.sizes}
            node_outputs = op.op_multi_out("Split", [match.data], attributes, num_outputs=count)
        return [node_outputs[i] for i in match.order]


def _piece(graph: ir.Graph, node: ir.Node, rank: int, shape) -> tuple[int, int, int] | str:
    """(axis, start, end) of a step-1 Slice of one axis with a known size, or why it is not one."""
    bounds = slice_bounds(graph, node)
    if bounds is None:
        return "has bounds that are not constant"
    starts, ends, axes, steps = bounds
    if len(starts) != 1:
        return f"cuts {len(starts)} axes"
    axis = axes[0] + rank if axes[0] < 0 else axes[0]
    if steps[0] != 1:
        return f"steps by {steps[0]}"
    if not 0 <= axis < rank or not isinstance(shape[axis], int):
        return f"cuts axis {axes[0]}, whose size is not known"
    dim = shape[axis]
    start, end = (min(max(v + dim if v < 0 else v, 0), dim) for v in (starts[0], ends[0]))
    if end <= start:
        return "is empty"
    return axis, start, end
