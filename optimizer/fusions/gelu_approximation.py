"""GeluApproximation (opt-in): exact GELU  =>  com.microsoft.FastGelu, the tanh approximation.

    com.microsoft.Gelu(x) or ONNX Gelu(x)   => FastGelu(x)
    com.microsoft.BiasGelu(x, bias)         => FastGelu(x, bias)

It changes numerics (the tanh form differs from the erf form by at most 4.7e-4 in
absolute value, near |x| = 2.7), so it runs only with `enable_gelu_approximation=True`, as in ONNX
Runtime. It comes last in the extended level, after BiasGeluFusion has folded the bias
Adds into BiasGelu, so the bias rides along into FastGelu.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.fusions.fast_gelu_fusion import FAST_GELU_TYPES
from optimizer.fusions.gelu_fusion import check_gelu_dtype
from optimizer.match import MS, attr, describe, is_op, rank, static_shape, value_name
from optimizer.rule import Match, Rule, fail


class GeluApproximation(Rule):
    name = "GeluApproximation"
    anchors = ("Gelu", "com.microsoft.Gelu", "com.microsoft.BiasGelu")
    emits = ("com.microsoft.FastGelu",)

    def match(self, graph: ir.Graph, gelu: ir.Node):
        x = gelu.inputs[0]
        dtype_problem = check_gelu_dtype(x, "FastGelu", FAST_GELU_TYPES)
        if dtype_problem:
            return dtype_problem
        if is_op(gelu, "Gelu") and attr(gelu, "approximate", "none") not in ("none", "tanh"):
            return fail("gelu", f"{describe(gelu)} has approximate={attr(gelu, 'approximate')!r}")
        x_rank = rank(x)
        if x_rank is None or x_rank < 1:
            shape_text = "unknown" if x_rank is None else "a scalar"
            return fail("shape", f"'{value_name(x)}' is {shape_text}; FastGelu needs an input of rank ≥ 1")
        inputs = [x]
        if is_op(gelu, "BiasGelu", MS):
            bias = gelu.inputs[1]
            bias_shape = static_shape(bias)
            if bias_shape is None or len(bias_shape) != 1:
                return fail("bias", f"bias '{value_name(bias)}' of {describe(gelu)} is not 1-D with a known length")
            last = x.shape[-1] if x.shape is not None else None
            if isinstance(last, int) and last != bias_shape[0]:
                return fail(
                    "bias",
                    f"bias '{value_name(bias)}' has {bias_shape[0]} elements but '{value_name(x)}' "
                    f"has last dimension {last}",
                )
            inputs.append(bias)
        return Match(nodes=[gelu], outputs=[gelu.outputs[0]], captures={"inputs": inputs})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FastGelu", match.inputs, domain=MS)
