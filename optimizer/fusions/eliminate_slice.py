"""EliminateSlice: a Slice that keeps every element  =>  its input.

A slice is a no-op when, on every axis it names, it starts at 0, steps by 1 and ends at
or past the dimension — either a known dimension or the INT_MAX-style sentinel exporters
use for "to the end". Exporters emit these for `x[:, :]`-style indexing.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import attr, const_array, describe, input_at, opset, stand_in_blocker
from optimizer.rule import Match, Rule, fail

# Ends at or beyond this reach the end of any real dimension (exporters use INT32_MAX or INT64_MAX).
END_SENTINEL = np.iinfo(np.int32).max


class EliminateSlice(Rule):
    name = "EliminateSlice"
    anchors = ("Slice",)

    def match(self, graph: ir.Graph, slice_node: ir.Node):
        data = slice_node.inputs[0]
        bounds = slice_bounds(graph, slice_node)
        if data is None or bounds is None or data.shape is None:
            why = "its bounds are not constants" if bounds is None else "the shape of its input is unknown"
            return fail("bounds", f"{describe(slice_node)} may cut something: {why}")
        starts, ends, axes, steps = bounds
        rank = len(data.shape)
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
            axis = axis + rank if axis < 0 else axis
            if not 0 <= axis < rank or step != 1 or start != 0:
                return fail("bounds", f"{describe(slice_node)} cuts axis {axis} (start {start}, step {step})")
            dim = data.shape[axis]
            if end < END_SENTINEL and not (isinstance(dim, int) and end >= dim):
                return fail("bounds", f"{describe(slice_node)} ends axis {axis} at {end}, not known to cover its size {dim}")
        if stand_in_blocker(data) is not None:
            return fail("interface", f"kept: {stand_in_blocker(data)}, which the Slice's output cannot replace")
        return Match(nodes=[slice_node], outputs=[slice_node.outputs[0]], captures={"source": data})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return match.source


def slice_bounds(graph: ir.Graph, node: ir.Node):
    """(starts, ends, axes, steps) as int lists, or None when any of them is not constant."""
    if opset(graph) < 10:
        starts, ends, axes = attr(node, "starts"), attr(node, "ends"), attr(node, "axes")
        if starts is None or ends is None:
            return None
        return list(starts), list(ends), list(axes or range(len(starts))), [1] * len(starts)
    arrays = []
    for index in (1, 2):
        array = const_array(input_at(node, index))
        if array is None:
            return None
        arrays.append([int(v) for v in array.reshape(-1)])
    starts, ends = arrays
    optional = []
    for index, default in ((3, list(range(len(starts)))), (4, [1] * len(starts))):
        value = input_at(node, index)
        if value is None:
            optional.append(default)
            continue
        array = const_array(value)
        if array is None:
            return None
        optional.append([int(v) for v in array.reshape(-1)])
    return starts, ends, *optional
