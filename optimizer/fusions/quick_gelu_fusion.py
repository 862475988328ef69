"""QuickGeluFusion: x * Sigmoid(alpha * x)  =>  com.microsoft.QuickGelu(x, alpha).

    Mul(x, Sigmoid(Mul(x, alpha)))   CLIP's quick_gelu, alpha = 1.702
    Mul(x, Sigmoid(x))               SiLU / Swish: QuickGelu with alpha = 1, as ONNX Runtime fuses it

A Sigmoid whose product is with some other tensor (a gate, as in squeeze-and-excitation
blocks) is not a candidate and is left alone without a near miss.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.fusions.gelu_fusion import check_gelu_dtype
from optimizer.match import MS, const_array, consumers, describe, is_op, other_input, producer, value_name
from optimizer.rule import Match, Rule, fail


class QuickGeluFusion(Rule):
    name = "QuickGeluFusion"
    anchors = ("Sigmoid",)
    emits = ("com.microsoft.QuickGelu",)

    def match(self, graph: ir.Graph, sigmoid: ir.Node):
        gated = sigmoid.inputs[0]
        for product in consumers(sigmoid.outputs[0]):
            if not is_op(product, "Mul"):
                continue
            x = other_input(product, sigmoid.outputs[0])
            if x is gated:  # x * Sigmoid(x)
                return self._match(x, 1.0, [sigmoid, product], product)
            scale = producer(gated)
            if is_op(scale, "Mul") and x in scale.inputs:
                alpha = const_array(other_input(scale, x))
                if alpha is None:
                    return fail("alpha", f"{describe(scale)} scales '{value_name(x)}' by a non-constant", scale)
                if alpha.size != 1:
                    return fail(
                        "alpha",
                        f"{describe(scale)} scales by {alpha.size} values; QuickGelu's alpha is one number",
                        scale,
                    )
                return self._match(x, float(alpha.reshape(())), [scale, sigmoid, product], product)
        return fail("gate", f"output of {describe(sigmoid)} is not multiplied by its own input (x · Sigmoid(α·x))")

    def _match(self, x: ir.Value, alpha: float, nodes: list[ir.Node], product: ir.Node):
        dtype_problem = check_gelu_dtype(x, "QuickGelu")
        if dtype_problem:
            return dtype_problem
        return Match(nodes=nodes, outputs=[product.outputs[0]], captures={"x": x, "alpha": alpha})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("QuickGelu", [match.x], {"alpha": match.alpha}, domain=MS)
