"""ConvActivationFusion: Conv -> activation  =>  com.microsoft.FusedConv.

FusedConv keeps every Conv attribute and adds, as ONNX Runtime writes them,
`activation` (the op type) and `activation_params` (floats):
    Relu, Sigmoid, Tanh     no params
    LeakyRelu               [alpha]
    HardSigmoid             [alpha, beta]
    Clip                    [min, max]   (attributes before opset 11, constant inputs after)
ONNX Runtime's kernel checks the parameter count, so defaults are written out.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import MS, attr, const_scalar, consumers, describe, input_at, is_op, opset, value_name
from optimizer.rule import Match, Rule, fail

FLOAT_LOWEST = float(np.finfo(np.float32).min)
FLOAT_MAX = float(np.finfo(np.float32).max)
ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip")


class ConvActivationFusion(Rule):
    name = "ConvActivationFusion"
    anchors = ("Conv",)
    emits = ("com.microsoft.FusedConv",)

    def match(self, graph: ir.Graph, conv: ir.Node):
        activation = next(
            (n for n in consumers(conv.outputs[0]) if any(is_op(n, op) for op in ACTIVATIONS)), None
        )
        if activation is None:
            readers = ", ".join(describe(n) for n in consumers(conv.outputs[0])) or "nothing"
            return fail("activation", f"output of {describe(conv)} feeds {readers}, no activation FusedConv takes")
        kind = activation.op_type
        if kind == "LeakyRelu":
            params = [attr(activation, "alpha", 0.01)]
        elif kind == "HardSigmoid":
            params = [attr(activation, "alpha", 0.2), attr(activation, "beta", 0.5)]
        elif kind == "Clip":
            params = _clip_bounds(graph, activation)
            if isinstance(params, str):
                return fail("clip", params, activation)
        else:
            params = []
        attributes = {name: a.value for name, a in conv.attributes.items()}
        attributes["activation"] = kind
        if params:
            attributes["activation_params"] = [float(p) for p in params]
        inputs = list(conv.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        return Match(
            nodes=[conv, activation],
            outputs=[activation.outputs[0]],
            captures={"inputs": inputs, "attributes": attributes},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FusedConv", match.inputs, match.attributes, domain=MS)


def _clip_bounds(graph: ir.Graph, clip: ir.Node) -> list[float] | str:
    """[min, max] of a Clip, or the reason they are not constants."""
    if opset(graph) < 11:
        return [attr(clip, "min", FLOAT_LOWEST), attr(clip, "max", FLOAT_MAX)]
    bounds = []
    for index, name, default in ((1, "min", FLOAT_LOWEST), (2, "max", FLOAT_MAX)):
        value = input_at(clip, index)
        if value is None:
            bounds.append(default)
            continue
        scalar = const_scalar(value)
        if scalar is None:
            return f"{describe(clip)} has a {name} that is not a constant ('{value_name(value)}')"
        bounds.append(scalar)
    return bounds
