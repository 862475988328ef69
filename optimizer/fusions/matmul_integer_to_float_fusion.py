"""MatMulIntegerToFloatFusion: MatMulInteger -> Cast(float) -> Mul(a_scale * b_scale) [-> Add(bias)]
=>  com.microsoft.MatMulIntegerToFloat.

What onnxruntime.quantization.quantize_dynamic writes for every MatMul it quantizes: the integer
product of the quantized activation and weight, cast to float, times the product of their scales,
plus the float bias. ONNX Runtime fuses it at `extended` (its MatMulIntegerToFloatFusion, where its
DynamicQuantizeMatMulFusion did not take the product first), into one op computing

    Y = (A - a_zero_point) (B - b_zero_point) * (a_scale * b_scale) + bias.

Matched only as written: the scale is a Mul of two values (the activation's and the weight's
scale, the weight's constant, per tensor or per column), and the bias is a constant 1-D vector of
the output's width. Our kernel computes the product, the float cast, the scale Mul and the Add
as the subgraph's own kernels do, so the fused and unfused graphs agree bit for bit.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import MS, attr, const_array, describe, is_op, other_input, producer, sole_consumer
from optimizer.rule import Match, Rule, fail


class MatMulIntegerToFloatFusion(Rule):
    name = "MatMulIntegerToFloatFusion"
    anchors = ("MatMulInteger",)
    emits = ("com.microsoft.MatMulIntegerToFloat",)

    def match(self, graph: ir.Graph, product: ir.Node):
        cast = sole_consumer(product.outputs[0])
        if not is_op(cast, "Cast") or attr(cast, "to") != int(ir.DataType.FLOAT):
            return fail("cast", f"output of {describe(product)} is read by {describe(cast) if cast else 'several nodes'}, "
                        "not one Cast to float")
        scaling = sole_consumer(cast.outputs[0])
        if not is_op(scaling, "Mul"):
            return fail("scale", f"{describe(cast)} is read by {describe(scaling) if scaling else 'several nodes'}, "
                        "not one Mul by the scales")
        scales = _scales(other_input(scaling, cast.outputs[0]))
        if isinstance(scales, str):
            return fail("scale", f"{describe(scaling)} multiplies by {scales}")
        a_scale, b_scale, scales_mul = scales
        nodes, output, bias = [product, cast, scaling], scaling.outputs[0], None
        adding = sole_consumer(output)
        width = _width(product)
        if is_op(adding, "Add"):
            candidate = other_input(adding, output)
            array = const_array(candidate)
            if array is not None and array.ndim == 1 and array.dtype.name == "float32" and width == array.shape[0]:
                nodes, output, bias = [*nodes, adding], adding.outputs[0], candidate
        if len(scales_mul.outputs[0].uses()) == 1:  # the scales' product is read only here: it goes too
            nodes.append(scales_mul)
        a, b = product.inputs[0], product.inputs[1]
        a_zero = product.inputs[2] if len(product.inputs) > 2 else None
        b_zero = product.inputs[3] if len(product.inputs) > 3 else None
        inputs = [a, b, a_scale, b_scale, a_zero, b_zero, bias]
        while inputs and inputs[-1] is None:
            inputs.pop()
        return Match(nodes=nodes, outputs=[output], captures={"inputs": inputs})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("MatMulIntegerToFloat", match.inputs, domain=MS)


def _scales(value: ir.Value | None) -> tuple[ir.Value, ir.Value, ir.Node] | str:
    """(a_scale, b_scale, the Mul of the two) for Mul(a_scale, b_scale) with b_scale constant, else why not."""
    node = producer(value)
    if not is_op(node, "Mul") or len(node.inputs) != 2:
        return f"{describe(node)}, not a Mul of the activation's and the weight's scales"
    first, second = node.inputs
    for a_scale, b_scale in ((first, second), (second, first)):
        b_array = const_array(b_scale)
        if b_array is not None and b_array.ndim <= 1 and b_array.dtype.name == "float32" \
                and a_scale is not None and a_scale.dtype == ir.DataType.FLOAT and _scalar(a_scale):
            return a_scale, b_scale, node
    return f"{describe(node)}, whose inputs are not a float scale and a constant per-tensor or per-column one"


def _scalar(value: ir.Value) -> bool:
    return value.shape is not None and all(d == 1 for d in value.shape)


def _width(product: ir.Node) -> int | None:
    """The product's output width (B's last dimension) where the graph fixes it."""
    weight = const_array(product.inputs[1])
    return int(weight.shape[-1]) if weight is not None and weight.ndim == 2 else None
