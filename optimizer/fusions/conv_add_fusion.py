"""ConvAddFusion: Conv(x, W[, B]) -> Add(per-channel constant c)  =>  Conv(x, W, B + c).

The addend must broadcast along the output channels only ([C,1,1], [1,C,1,1] or a
scalar); anything else would change the Add's output shape or vary within a channel.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import (
    const_array,
    describe,
    input_at,
    per_channel_vector,
    producer_and_other,
    static_shape,
    unique_name,
    value_name,
)
from optimizer.rule import Match, Rule, fail


class ConvAddFusion(Rule):
    name = "ConvAddFusion"
    anchors = ("Add",)
    emits = ("Conv",)

    def match(self, graph: ir.Graph, add: ir.Node):
        conv, addend = producer_and_other(add, "Conv")
        if conv is None:
            return fail("conv", f"neither input of {describe(add)} comes from a Conv")
        weight_shape = static_shape(conv.inputs[1])
        if weight_shape is None:
            return fail("weights", f"weights '{value_name(conv.inputs[1])}' of the Conv have no known shape")
        constant = const_array(addend)
        if constant is None:
            return fail("addend", f"addend '{value_name(addend)}' is not constant")
        channels = weight_shape[0]
        vector = per_channel_vector(constant, len(weight_shape), channels)
        if vector is None:
            return fail(
                "addend",
                f"addend shape {list(constant.shape)} is not per-channel (expected [{channels},1,...] for {channels} channels)",
            )
        bias = input_at(conv, 2)
        dtype = conv.outputs[0].dtype.numpy() if conv.outputs[0].dtype is not None else constant.dtype
        if bias is not None:
            bias_array = const_array(bias)
            if bias_array is None:
                return fail("bias", f"Conv bias '{value_name(bias)}' is not constant")
            vector = bias_array.astype(dtype) + vector.astype(dtype)
        return Match(
            nodes=[conv, add],
            outputs=[add.outputs[0]],
            captures={"conv": conv, "bias": vector.astype(dtype), "bias_name": unique_name(graph, f"{conv.name or 'Conv'}_bias")},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        conv = match.conv
        bias = op.initializer(ir.Tensor(match.bias, name=match.bias_name))
        return op.op("Conv", [conv.inputs[0], conv.inputs[1], bias], attributes=dict(conv.attributes))
