"""ConvBNFusion: Conv(x, W[, B]) -> BatchNormalization(scale, bias, mean, var)  =>  Conv(x, W', B').

With f = scale / sqrt(var + epsilon) per output channel:
    W' = W * f           B' = (B - mean) * f + bias     (B = 0 when the Conv has none)
Folding is done in float64 and cast back, so the folded weights lose no more precision
than the weights themselves hold. Only inference-mode BatchNormalization folds: in
training mode it computes batch statistics and extra outputs.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    attr,
    const_array,
    consumers,
    describe,
    input_at,
    is_op,
    producer,
    unique_name,
    value_name,
)
from optimizer.rule import Match, Rule, fail

PARAMETERS = ("scale", "bias", "mean", "var")


class ConvBNFusion(Rule):
    name = "ConvBNFusion"
    anchors = ("BatchNormalization",)
    emits = ("Conv",)

    def match(self, graph: ir.Graph, bn: ir.Node):
        conv = producer(bn.inputs[0])
        if not is_op(conv, "Conv"):
            return fail("conv", f"input of {describe(bn)} comes from {describe(conv)}, not a Conv", conv)
        if attr(bn, "training_mode", 0):
            return fail("batchnorm", "BatchNormalization runs in training mode")
        if attr(bn, "spatial", 1) == 0:  # opset < 9: one statistic per element, not per channel
            return fail("batchnorm", "BatchNormalization has spatial=0 (per-element statistics)")
        for extra in bn.outputs[1:]:
            if extra.is_graph_output() or consumers(extra):
                return fail("batchnorm", f"BatchNormalization's running statistic '{value_name(extra)}' is used")
        params = {}
        for index, label in enumerate(PARAMETERS, start=1):
            array = const_array(input_at(bn, index))
            if array is None:
                return fail("parameters", f"BatchNormalization {label} '{value_name(input_at(bn, index))}' is not constant")
            params[label] = array.astype(np.float64).reshape(-1)
        weights = const_array(conv.inputs[1])
        if weights is None:
            return fail("weights", f"Conv weights '{value_name(conv.inputs[1])}' are not constant")
        channels = weights.shape[0]
        if any(p.size != channels for p in params.values()):
            sizes = {k: p.size for k, p in params.items()}
            return fail("parameters", f"BatchNormalization parameter sizes {sizes} do not match the Conv's {channels} channels")
        bias = input_at(conv, 2)
        conv_bias = np.zeros(channels)
        if bias is not None:
            bias_array = const_array(bias)
            if bias_array is None:
                return fail("bias", f"Conv bias '{value_name(bias)}' is not constant")
            conv_bias = bias_array.astype(np.float64).reshape(-1)
        factor = params["scale"] / np.sqrt(params["var"] + attr(bn, "epsilon", 1e-5))
        new_weights = weights.astype(np.float64) * factor.reshape((channels,) + (1,) * (weights.ndim - 1))
        new_bias = (conv_bias - params["mean"]) * factor + params["bias"]
        base = conv.name or "Conv"
        return Match(
            nodes=[conv, bn],
            outputs=[bn.outputs[0]],
            captures={
                "conv": conv,
                "weights": new_weights.astype(weights.dtype),
                "bias": new_bias.astype(weights.dtype),
                "names": (unique_name(graph, f"{base}_bn_weights"), unique_name(graph, f"{base}_bn_bias")),
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        conv = match.conv
        weights = op.initializer(ir.Tensor(match.weights, name=match.names[0]))
        bias = op.initializer(ir.Tensor(match.bias, name=match.names[1]))
        return op.op("Conv", [conv.inputs[0], weights, bias], attributes=dict(conv.attributes))
