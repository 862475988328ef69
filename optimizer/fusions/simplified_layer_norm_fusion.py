"""SimplifiedLayerNormFusion: RMSNorm => SimplifiedLayerNormalization(x, gamma).

    var = ReduceMean(Pow(x, 2) | Mul(x, x))
    std = Sqrt(Add(var, eps))
    y   = Div(x, std) | Mul(x, Reciprocal(std))      (Llama's x * rsqrt(var + eps))
    out = Mul(y, gamma)                              => SimplifiedLayerNormalization(x, gamma, axis=-1, epsilon=eps)

ONNX Runtime anchors on the Pow; anchoring on the ReduceMean lets the Mul(x, x) square in
too. The fused op lives in the ONNX domain under ONNX Runtime's own registration (since 1),
as layer_norm_fusion.cc emits it, so the result still runs in onnxruntime. A square of a
Sub(x, mean) is a LayerNorm's variance: that is LayerNormFusion's to explain, not ours.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.fusions.layer_norm_fusion import (
    affine_tail,
    check_axes,
    check_float_input,
    normalize_step,
    square_exponent,
    variance_chain,
)
from optimizer.match import describe, is_op, producer, through_noop_casts
from optimizer.rule import Fail, Match, Rule, fail

# ONNX Runtime leaves the float16 RMS norm to its GPU providers (SimplifiedLayerNormWithCastsFusionTest
# expects no fusion on CPU); its Casts run the norm in float32, which this rule does not absorb.
FUSABLE_DTYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


class SimplifiedLayerNormFusion(Rule):
    name = "SimplifiedLayerNormFusion"
    anchors = ("ReduceMean",)
    emits = ("SimplifiedLayerNormalization",)

    def match(self, graph: ir.Graph, var_node: ir.Node):
        square_node = producer(var_node.inputs[0])
        is_square_mul = is_op(square_node, "Mul") and square_node.inputs[0] is square_node.inputs[1]
        if not (is_square_mul or is_op(square_node, "Pow")):
            return fail("square", f"input of {describe(var_node)} comes from {describe(square_node)}, not a square "
                        "(Pow(x, 2) or x·x)", square_node)
        x = square_node.inputs[0]
        if _is_centered(x):
            return fail("square", f"{describe(var_node)} is a LayerNorm's variance (it squares x - mean), "
                        "LayerNormFusion's pattern")
        square_extra: list[ir.Node] = []
        if not is_square_mul:
            square = square_exponent(square_node)
            if isinstance(square, Fail):
                return square
            square_extra = square[1]

        failure = check_float_input(x, "SimplifiedLayerNormalization", FUSABLE_DTYPES)
        if failure:
            return failure
        variance = variance_chain(square_node, "SimplifiedLayerNormalization")
        if isinstance(variance, Fail):
            return variance
        _, eps_node, sqrt_node, epsilon = variance
        scaled = normalize_step(sqrt_node, [x])
        if isinstance(scaled, Fail):
            return scaled
        normalized, scale_nodes = scaled
        axes = check_axes(var_node, None, x)
        if isinstance(axes, Fail):
            return axes
        tail = affine_tail(normalized, x, with_beta=False, axes=axes)
        if isinstance(tail, Fail):
            return tail
        gamma, _, tail_nodes = tail
        # Llama's RMSNorm starts with hidden_states.to(float32): on float32 data a no-op Cast the
        # fused op can read past, so a residual Add in front of it stays visible to SkipLayerNorm.
        source, _ = through_noop_casts(x)
        return Match(
            nodes=[square_node, *square_extra, var_node, eps_node, sqrt_node, *scale_nodes, *tail_nodes],
            outputs=[tail_nodes[-1].outputs[0]],
            captures={"x": source, "gamma": gamma, "axis": -axes, "epsilon": epsilon, "double": x.dtype == ir.DataType.DOUBLE},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        attributes = {"axis": match.axis, "epsilon": match.epsilon}
        if match.double:
            attributes["stash_type"] = int(ir.DataType.DOUBLE)
        return op.op("SimplifiedLayerNormalization", [match.x, match.gamma], attributes=attributes)


def _is_centered(x: ir.Value) -> bool:
    """x = Sub(a, ReduceMean(a)): the centered value of a LayerNorm."""
    sub = producer(x)
    if not is_op(sub, "Sub"):
        return False
    mean = producer(sub.inputs[1])
    return is_op(mean, "ReduceMean") and mean.inputs[0] is sub.inputs[0]
