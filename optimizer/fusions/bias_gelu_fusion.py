"""BiasGeluFusion: Add(x, bias) -> Gelu  =>  com.microsoft.BiasGelu(x, bias).

The Gelu may be com.microsoft.Gelu (what GeluFusion emits), the standard ONNX Gelu of
opset 20+ (what exporters emit today), or com.microsoft.FastGelu. ONNX Runtime 1.20
matched only the contrib Gelu, so models whose GELU became ONNX Gelu silently lost this
fusion; matching both domains is the point of this module.

    Add(x, b) -> Gelu                        => BiasGelu(x, b)
    Add(x, b) -> Gelu(approximate="tanh")    => FastGelu(x, b)
    Add(x, b) -> FastGelu(no bias)           => FastGelu(x, b)
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import MS, attr, const_array, describe, is_op, producer, rank, static_shape, value_name
from optimizer.rule import Match, Rule, fail


class BiasGeluFusion(Rule):
    name = "BiasGeluFusion"
    anchors = ("Gelu", "com.microsoft.Gelu", "com.microsoft.FastGelu")
    emits = ("com.microsoft.BiasGelu", "com.microsoft.FastGelu")

    def match(self, graph: ir.Graph, gelu: ir.Node):
        if is_op(gelu, "FastGelu", MS) and len([v for v in gelu.inputs if v is not None]) > 1:
            return fail("gelu", f"{describe(gelu)} already has its bias")
        target = "BiasGelu"
        if is_op(gelu, "Gelu"):  # the ONNX op: its approximation decides the fused op
            approximate = attr(gelu, "approximate", "none")
            if approximate not in ("none", "tanh"):
                return fail("gelu", f"Gelu approximate={approximate!r} has no fused form")
            target = "FastGelu" if approximate == "tanh" else "BiasGelu"
        elif is_op(gelu, "FastGelu", MS):
            target = "FastGelu"

        add = producer(gelu.inputs[0])
        if not is_op(add, "Add"):
            return fail("add", f"input of {describe(gelu)} comes from {describe(add)}, not Add", add)
        x, bias = _split_bias(add)
        if bias is None:
            return fail("bias", _why_no_bias(add))
        x_shape, bias_shape = x.shape, static_shape(bias)
        if x_shape is not None and len(x_shape) and isinstance(x_shape[-1], int):
            if bias_shape[0] != x_shape[-1]:
                return fail(
                    "bias",
                    f"bias '{value_name(bias)}' has {bias_shape[0]} elements but "
                    f"'{value_name(x)}' has last dimension {x_shape[-1]}",
                )
        return Match(nodes=[add, gelu], outputs=[gelu.outputs[0]], captures={"x": x, "bias": bias, "target": target})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op(match.target, [match.x, match.bias], domain=MS)


def _split_bias(add: ir.Node) -> tuple[ir.Value | None, ir.Value | None]:
    """(x, bias) for an Add where exactly one side is a 1-D tensor of known length."""
    a, b = add.inputs[0], add.inputs[1]
    for x, bias in ((a, b), (b, a)):
        shape = static_shape(bias)
        if shape is not None and len(shape) == 1 and rank(x) != 1:
            return x, bias
    return None, None


def _why_no_bias(add: ir.Node) -> str:
    """The near-miss reason when neither Add input is a usable bias, naming the likely bias."""
    constants = [v for v in add.inputs if const_array(v) is not None]
    candidates = constants or [v for v in add.inputs if rank(v) is not None and rank(v) <= 1]
    if len(candidates) == 1:
        bias = candidates[0]
        bias_rank = rank(bias)
        if bias_rank == 1:
            reason = f"bias '{value_name(bias)}' has no known length"
        else:
            reason = f"bias '{value_name(bias)}' has rank {bias_rank}"
        return f"{reason}, so {describe(add)} has no 1-D bias input"
    ranks = [rank(v) for v in add.inputs]
    return f"{describe(add)} has no 1-D bias input (input ranks {ranks})"
