"""MatMulScaleFusion: scaling by a constant before or after MatMul  =>  com.microsoft.FusedMatMul(alpha).

    MatMul(Mul(a, s), b)        => FusedMatMul(a, b, alpha=s)
    MatMul(Div(a, s), b)        => FusedMatMul(a, b, alpha=1/s)
    Mul(MatMul(a, b), s)        => FusedMatMul(a, b, alpha=s)       (and Div)
    FusedMatMul(...) scaled      => its alpha multiplied in

Attention's `Q·Kᵀ / √d` is the usual case. A scale is a single-element constant that
does not broadcast the product to a higher rank. As in ONNX Runtime, a leading scale
node that has other readers is kept for them and its input is read directly; its scaled
value is not needed by the MatMul any more. Alpha is accumulated in float32, the type of
the attribute.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import MS, attr, const_array, consumers, describe, input_at, is_op, rank, sole_consumer
from optimizer.rule import Match, Rule, fail

FUSED_MATMUL_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.BFLOAT16})


class MatMulScaleFusion(Rule):
    name = "MatMulScaleFusion"
    anchors = ("MatMul", "com.microsoft.FusedMatMul")
    emits = ("com.microsoft.FusedMatMul",)

    def match(self, graph: ir.Graph, matmul: ir.Node):
        inputs = list(matmul.inputs[:2])
        alpha = np.float32(attr(matmul, "alpha", 1.0))
        nodes = [matmul]
        merged = False
        for index, value in enumerate(inputs):
            scale_node = value.producer() if value is not None else None
            scaled = _scale(scale_node)
            if scaled is None:
                continue
            data, factor = scaled
            if not rank(data):  # unknown or 0: a scalar operand is not what MatMul scales
                continue
            inputs[index] = data
            alpha *= factor
            merged = True
            if sole_consumer(value) is matmul and scale_node not in nodes:
                nodes.append(scale_node)

        output = matmul.outputs[0]
        readers = consumers(output)
        if len(readers) == 1 and not output.is_graph_output():
            scaled = _scale(readers[0])
            if scaled is not None and scaled[0] is output:
                alpha *= scaled[1]
                nodes.append(readers[0])
                output = readers[0].outputs[0]
                merged = True
        if not merged:
            return fail("scale", f"no input or output of {describe(matmul)} is scaled by a constant")
        if output.dtype is not None and output.dtype not in FUSED_MATMUL_TYPES:
            return fail("dtype", f"{describe(matmul)} computes {output.dtype.name.lower()}; FusedMatMul takes floats")

        attributes = {name: a.value for name, a in matmul.attributes.items()}
        attributes["alpha"] = float(alpha)
        return Match(nodes=nodes, outputs=[output], captures={"inputs": inputs, "attributes": attributes})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FusedMatMul", match.inputs, match.attributes, domain=MS)


def _scale(node: ir.Node | None) -> tuple[ir.Value, np.float32] | None:
    """(scaled value, factor) for Mul or Div by a single-element float constant."""
    if is_op(node, "Div"):
        factor = _scalar_factor(input_at(node, 1), node.inputs[0])
        return None if factor is None else (node.inputs[0], np.float32(1) / factor)
    if is_op(node, "Mul"):
        for const_side in (1, 0):
            factor = _scalar_factor(input_at(node, const_side), input_at(node, 1 - const_side))
            if factor is not None:
                return node.inputs[1 - const_side], factor
    return None


def _scalar_factor(value: ir.Value | None, other: ir.Value | None) -> np.float32 | None:
    """A one-element float constant that leaves `other`'s rank alone when broadcast."""
    array = const_array(value)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    if array.ndim > (rank(other) or 0):
        return None
    return np.float32(array.reshape(()))
