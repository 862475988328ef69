"""FastGeluFusion: the tanh approximation of GELU  =>  com.microsoft.FastGelu(x).

    0.5 * x * (1 + Tanh(√(2/π) * (x + 0.044715 * x³)))

is GPT-2's "gelu_new" (and `gelu(approximate="tanh")` in older exports). The cube comes
as Pow(x, 3) or as x*x*x in either association; the `0.5 * x * (…)` end takes the same
three shapes as the erf GELU, so it is matched by `gelu_fusion.match_gelu_tail`.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from optimizer.fusions.gelu_fusion import check_gelu_dtype, match_gelu_tail
from optimizer.match import (
    MS,
    consumer_of,
    describe,
    input_at,
    is_const_close,
    is_op,
    other_input,
    producer,
    split_scalar,
    value_name,
)
from optimizer.rule import Fail, Match, Rule, fail

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # 0.7978845608…
CUBIC_COEFFICIENT = 0.044715
FAST_GELU_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.BFLOAT16})


class FastGeluFusion(Rule):
    name = "FastGeluFusion"
    anchors = ("Tanh",)
    emits = ("com.microsoft.FastGelu",)

    def match(self, graph: ir.Graph, tanh: ir.Node):
        scale = producer(tanh.inputs[0])
        split = split_scalar(scale) if is_op(scale, "Mul") else None
        if split is None:
            return None  # a Tanh not scaled by a constant is not a GELU
        inner, multiplier = split
        if not math.isclose(multiplier, SQRT_2_OVER_PI, rel_tol=1e-3):
            return fail("scale", f"multiplier is {multiplier:.5g}, expected √(2/π) ≈ 0.79788", scale)

        inner_add = producer(inner)
        if not is_op(inner_add, "Add"):
            return fail("inner", f"{describe(scale)} scales {describe(inner_add)}, not x + 0.044715·x³", scale)
        cubic = _match_cubic_term(inner_add)
        if isinstance(cubic, Fail):
            return cubic
        x, cubic_nodes = cubic
        dtype_problem = check_gelu_dtype(x, "FastGelu", FAST_GELU_TYPES)
        if dtype_problem:
            return dtype_problem

        bracket = consumer_of(tanh.outputs[0], "Add")
        if bracket is None:
            return fail("add", f"output of {describe(tanh)} does not feed an Add of 1")
        if not is_const_close(other_input(bracket, tanh.outputs[0]), 1.0):
            return fail("add", f"{describe(bracket)} does not add 1 to the Tanh", bracket)

        tail = match_gelu_tail(bracket, x)
        if isinstance(tail, Fail):
            return tail
        tail_nodes, output = tail
        nodes = [*cubic_nodes, inner_add, scale, tanh, bracket, *tail_nodes]
        return Match(nodes=nodes, outputs=[output], captures={"x": x})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FastGelu", [match.x], domain=MS)


def _match_cubic_term(inner_add: ir.Node) -> tuple[ir.Value, list[ir.Node]] | Fail:
    """x and the nodes of `x + 0.044715 * x³`, either Add input order."""
    for x_side in (0, 1):
        x, term = input_at(inner_add, x_side), input_at(inner_add, 1 - x_side)
        coefficient_mul = producer(term)
        split = split_scalar(coefficient_mul) if is_op(coefficient_mul, "Mul") else None
        if split is None:
            continue
        cube, coefficient = split
        cube_nodes = _cube_nodes(cube, x)
        if cube_nodes is None:
            continue
        if not math.isclose(coefficient, CUBIC_COEFFICIENT, rel_tol=1e-3):
            return fail(
                "cube", f"cubic coefficient is {coefficient:.5g}, expected 0.044715", coefficient_mul
            )
        return x, [*cube_nodes, coefficient_mul]
    names = [value_name(v) for v in inner_add.inputs]
    return fail("cube", f"{describe(inner_add)} adds {names}, not x and 0.044715·x³", inner_add)


def _cube_nodes(cube: ir.Value, x: ir.Value) -> list[ir.Node] | None:
    """The nodes computing x³ from x: Pow(x, 3), (x*x)*x or x*(x*x)."""
    node = producer(cube)
    if is_op(node, "Pow"):
        return [node] if node.inputs[0] is x and is_const_close(node.inputs[1], 3.0) else None
    if not is_op(node, "Mul"):
        return None
    square = other_input(node, x)
    square_node = producer(square)
    if is_op(square_node, "Mul") and all(v is x for v in square_node.inputs):
        return [square_node, node]
    return None
