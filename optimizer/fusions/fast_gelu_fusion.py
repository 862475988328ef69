"""FastGeluFusion: the tanh approximation of GELU  =>  com.microsoft.FastGelu(x).

    0.5 * x * (1 + Tanh(√(2/π) * (x + 0.044715 * x³)))

is GPT-2's "gelu_new" (and `gelu(approximate="tanh")` in older exports). The cube comes
as Pow(x, 3) or as x*x*x in either association; the `0.5 * x * (…)` end takes the same
three shapes as the erf GELU, so it is matched by `gelu_fusion.match_gelu_tail`.

The Tanh's argument also comes factored, as Megatron and ONNX Runtime's own fast_gelu.onnx
write it:  (√(2/π) · x) · (1 + 0.044715 · x · x). Either way `x` may pass through Casts to the
type it already has (mixed-precision exports), which the fusion absorbs.
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
    same_value,
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
        if not is_op(scale, "Mul"):
            return fail("scale", f"input of {describe(tanh)} comes from {describe(scale)}, not a Mul by √(2/π)", scale)
        split = split_scalar(scale)
        if split is None:
            argument = _match_factored(scale)
        else:
            inner, multiplier = split
            if not math.isclose(multiplier, SQRT_2_OVER_PI, rel_tol=1e-3):
                return fail("scale", f"multiplier is {multiplier:.5g}, expected √(2/π) ≈ 0.79788", scale)
            inner_add = producer(inner)
            if not is_op(inner_add, "Add"):
                return fail("inner", f"{describe(scale)} scales {describe(inner_add)}, not x + 0.044715·x³", scale)
            argument = _match_cubic_term(inner_add)
            if not isinstance(argument, Fail):
                argument = argument[0], [*argument[1], inner_add, scale]
        if isinstance(argument, Fail):
            return argument
        x, argument_nodes = argument
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
        nodes = [*argument_nodes, tanh, bracket, *tail_nodes]
        return Match(nodes=nodes, outputs=[output], captures={"x": x})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FastGelu", [match.x], domain=MS)


def _match_factored(scale: ir.Node) -> tuple[ir.Value, list[ir.Node]] | Fail:
    """x and the nodes of `(√(2/π) · x) · (1 + 0.044715 · x²)`, every Mul and Add either way round."""
    for side in (0, 1):
        linear, bracket = producer(input_at(scale, side)), producer(input_at(scale, 1 - side))
        split = split_scalar(linear) if is_op(linear, "Mul") else None
        if split is None or not is_op(bracket, "Add"):
            continue
        x, multiplier = split
        if not math.isclose(multiplier, SQRT_2_OVER_PI, rel_tol=1e-3):
            return fail("scale", f"multiplier is {multiplier:.5g}, expected √(2/π) ≈ 0.79788", linear)
        bracket_split = split_scalar(bracket)
        if bracket_split is None or not math.isclose(bracket_split[1], 1.0, rel_tol=1e-3):
            return fail("inner", f"{describe(bracket)} is not 1 + 0.044715·x²", bracket)
        square = _match_scaled_square(bracket_split[0], x)
        if isinstance(square, Fail):
            return square
        return x, [*square, bracket, linear, scale]
    return fail("scale", f"{describe(scale)} multiplies neither by √(2/π) nor √(2/π)·x by 1 + 0.044715·x²", scale)


def _match_scaled_square(term: ir.Value, x: ir.Value) -> list[ir.Node] | Fail:
    """The nodes of `0.044715 · x²` as x·(x·c), (x·x)·c or Pow(x, 2)·c."""
    outer = producer(term)
    if not is_op(outer, "Mul"):
        return fail("inner", f"0.044715·x² is computed by {describe(outer)}, not a Mul", outer)
    split = split_scalar(outer)
    if split is not None:  # (x·x)·c or Pow(x, 2)·c
        square, coefficient = split
        square_node = producer(square)
        is_square = (is_op(square_node, "Mul") and all(same_value(v, x) for v in square_node.inputs)) or (
            is_op(square_node, "Pow") and same_value(square_node.inputs[0], x) and is_const_close(square_node.inputs[1], 2.0)
        )
        if not is_square:
            return fail("inner", f"{describe(outer)} scales '{value_name(square)}', not x²", outer)
        nodes = [square_node, outer]
    else:  # x·(x·c)
        inner = next((producer(v) for v in outer.inputs if is_op(producer(v), "Mul") and split_scalar(producer(v))), None)
        if inner is None or not same_value(other_input(outer, inner.outputs[0]), x) or not same_value(split_scalar(inner)[0], x):
            return fail("inner", f"{describe(outer)} is not 0.044715·x²", outer)
        coefficient = split_scalar(inner)[1]
        nodes = [inner, outer]
    if not math.isclose(coefficient, CUBIC_COEFFICIENT, rel_tol=1e-3):
        return fail("cube", f"quadratic coefficient is {coefficient:.5g}, expected 0.044715", outer)
    return nodes


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
        # x³ may read x through a no-op Cast the Add's other side does not have (or the reverse).
        x = input_at(cube_nodes[0], 0)
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
        return [node] if same_value(node.inputs[0], x) and is_const_close(node.inputs[1], 3.0) else None
    if not is_op(node, "Mul"):
        return None
    for square in node.inputs:
        square_node = producer(square)
        if (is_op(square_node, "Mul") and same_value(other_input(node, square), x)
                and all(same_value(v, x) for v in square_node.inputs)):
            return [square_node, node]
    return None
