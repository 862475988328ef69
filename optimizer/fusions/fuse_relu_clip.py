"""FuseReluClip: Relu and Clip next to each other  =>  one Clip.

    Relu(x) -> Clip(min, max)  =>  Clip(x, max(0, min), max)    always equal
    Clip(x, min, max) -> Relu  =>  Clip(x, max(0, min), max)    equal when max >= 0

For Relu -> Clip with max < 0 both sides are `max` everywhere (ONNX clips to `max` when
min > max). For Clip -> Relu with max < 0 the Relu makes everything 0, which no Clip with
the same max reproduces, so that case is a near miss.

Clip takes min/max as attributes before opset 11 and as optional constant inputs after.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    attr,
    const_array,
    describe,
    input_at,
    is_op,
    opset,
    producer,
    unique_name,
    value_name,
)
from optimizer.rule import Match, Rule, fail

FLOAT_LOWEST = float(np.finfo(np.float32).min)  # Clip's default min before opset 11


class FuseReluClip(Rule):
    name = "FuseReluClip"
    anchors = ("Clip", "Relu")
    emits = ("Clip",)

    def match(self, graph: ir.Graph, node: ir.Node):
        if is_op(node, "Clip"):
            clip, first = node, producer(node.inputs[0])
            if not is_op(first, "Relu"):
                return fail("relu", f"input of {describe(clip)} comes from {describe(first)}, not a Relu", first)
            x = first.inputs[0]
        else:
            first = producer(node.inputs[0])
            if not is_op(first, "Clip"):
                return fail("clip", f"input of {describe(node)} comes from {describe(first)}, not a Clip", first)
            clip, x = first, first.inputs[0]
        bounds = _clip_bounds(graph, clip)
        if isinstance(bounds, str):
            return fail("clip", bounds, clip)
        low, high = bounds
        if clip is first and high is not None and high < 0:
            return fail("clip", f"{describe(clip)} has max {high} < 0, so the Relu after it is not a Clip")
        new_low = max(0.0, low if low is not None else 0.0)
        dtype = x.dtype.numpy() if x.dtype is not None else np.dtype(np.float32)
        names = (unique_name(graph, f"{clip.name or 'Clip'}_min"), unique_name(graph, f"{clip.name or 'Clip'}_max"))
        return Match(
            nodes=[first, node],
            outputs=[node.outputs[0]],
            captures={"x": x, "low": new_low, "high": high, "dtype": dtype, "names": names,
                      "attribute_form": opset(graph) < 11},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        if match.attribute_form:
            attributes = {"min": float(match.low)}
            if match.high is not None:
                attributes["max"] = float(match.high)
            return op.op("Clip", [match.x], attributes=attributes)
        low = op.initializer(ir.Tensor(np.array(match.low, dtype=match.dtype), name=match.names[0]))
        high = None
        if match.high is not None:
            high = op.initializer(ir.Tensor(np.array(match.high, dtype=match.dtype), name=match.names[1]))
        return op.op("Clip", [match.x, low, high] if high is not None else [match.x, low])


def _clip_bounds(graph: ir.Graph, clip: ir.Node) -> tuple[float | None, float | None] | str:
    """(min, max) of a Clip as floats (None when absent), or why they are not known."""
    if opset(graph) < 11:
        return attr(clip, "min", FLOAT_LOWEST), attr(clip, "max", None)
    bounds = []
    for index, label in ((1, "min"), (2, "max")):
        value = input_at(clip, index)
        if value is None:
            bounds.append(None)
            continue
        array = const_array(value)
        if array is None or array.size != 1:
            return f"{describe(clip)} {label} '{value_name(value)}' is not a constant scalar"
        bounds.append(float(array.reshape(())))
    return bounds[0], bounds[1]
