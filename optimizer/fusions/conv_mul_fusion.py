"""ConvMulFusion: Conv(x, W[, B]) -> Mul(per-channel constant s)  =>  Conv(x, W*s, B*s).

Scaling an output channel equals scaling its filter and bias, so the weights (and the
bias, when there is one) must be constants the rule can rewrite.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import (
    const_array,
    describe,
    input_at,
    per_channel_vector,
    producer_and_other,
    unique_name,
    value_name,
)
from optimizer.rule import Match, Rule, fail


class ConvMulFusion(Rule):
    name = "ConvMulFusion"
    anchors = ("Mul",)
    emits = ("Conv",)

    def match(self, graph: ir.Graph, mul: ir.Node):
        conv, factor = producer_and_other(mul, "Conv")
        if conv is None:
            return fail("conv", f"neither input of {describe(mul)} comes from a Conv")
        weights = const_array(conv.inputs[1])
        if weights is None:
            return fail("weights", f"Conv weights '{value_name(conv.inputs[1])}' are not constant")
        scale = const_array(factor)
        if scale is None:
            return fail("multiplier", f"multiplier '{value_name(factor)}' is not constant")
        channels = weights.shape[0]
        vector = per_channel_vector(scale, weights.ndim, channels)
        if vector is None:
            return fail(
                "multiplier",
                f"multiplier shape {list(scale.shape)} is not per-channel (expected [{channels},1,...] for {channels} channels)",
            )
        bias = input_at(conv, 2)
        new_bias = None
        if bias is not None:
            bias_array = const_array(bias)
            if bias_array is None:
                return fail("bias", f"Conv bias '{value_name(bias)}' is not constant")
            new_bias = (bias_array * vector).astype(bias_array.dtype)
        new_weights = (weights * vector.reshape((channels,) + (1,) * (weights.ndim - 1))).astype(weights.dtype)
        base = conv.name or "Conv"
        return Match(
            nodes=[conv, mul],
            outputs=[mul.outputs[0]],
            captures={
                "conv": conv,
                "weights": new_weights,
                "bias": new_bias,
                "names": (unique_name(graph, f"{base}_scaled_weights"), unique_name(graph, f"{base}_scaled_bias")),
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        conv = match.conv
        inputs = [conv.inputs[0], op.initializer(ir.Tensor(match.weights, name=match.names[0]))]
        if match.bias is not None:
            inputs.append(op.initializer(ir.Tensor(match.bias, name=match.names[1])))
        return op.op("Conv", inputs, attributes=dict(conv.attributes))
