"""GeluFusion: the erf GELU exporters emit  =>  Gelu(x), ONNX's at opset >= 20, else com.microsoft's.

    x * 0.5 * (1 + Erf(x / √2))

arrives as Div(x, 1.4142…) or Mul(x, 0.7071…) -> Erf -> Add(1) and then one of three
shapes for the `0.5 * x * (…)` end (see `match_gelu_tail`), with the inputs of every
Add and Mul in either order.

The output op follows the model's opset as ONNX Runtime's GeluFusion does (since 1.20): the
standard Gelu where the opset has it, com.microsoft.Gelu below. A regression detector has to
predict what onnxruntime will run, and that is the op it will run. It is also why every rule that
consumes a GELU (BiasGeluFusion, GeluApproximation) accepts both forms: the model's opset, not
the pattern, decides which one they meet.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from optimizer.match import (
    MS,
    const_scalar,
    consumer_of,
    describe,
    is_const_close,
    is_op,
    opset,
    other_input,
    producer,
    same_value,
    split_scalar,
    through_noop_casts,
    value_name,
)
from optimizer.rule import Fail, Match, Rule, fail

SQRT2 = math.sqrt(2.0)
STANDARD_GELU_OPSET = 20  # ONNX Gelu's first opset
# The element types com.microsoft.Gelu, FastGelu and QuickGelu are defined for.
GELU_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.BFLOAT16})


class GeluFusion(Rule):
    name = "GeluFusion"
    anchors = ("Erf",)  # the one op of the pattern that nothing else in a transformer uses
    emits = ("Gelu", "com.microsoft.Gelu")

    def match(self, graph: ir.Graph, erf: ir.Node):
        scale = producer(erf.inputs[0])
        if is_op(scale, "Div"):
            x, divisor = scale.inputs[0], const_scalar(scale.inputs[1])
            if divisor is None:
                return fail("scale", f"divisor of {describe(scale)} is not a constant", scale)
            if not math.isclose(divisor, SQRT2, rel_tol=1e-3):
                return fail("scale", f"divisor is {divisor:.5g}, expected √2 ≈ 1.4142", scale)
        elif is_op(scale, "Mul"):
            split = split_scalar(scale)
            if split is None:
                return fail("scale", f"{describe(scale)} does not multiply by a constant", scale)
            x, multiplier = split
            if not math.isclose(multiplier, 1 / SQRT2, rel_tol=1e-3):
                return fail("scale", f"multiplier is {multiplier:.5g}, expected 1/√2 ≈ 0.7071", scale)
        else:  # an Erf that is not scaling its input is some other function; said so all the same
            return fail("scale", f"input of {describe(erf)} comes from {describe(scale)}, not x/√2 or x·(1/√2)", scale)
        dtype_problem = check_gelu_dtype(x, "Gelu")
        if dtype_problem:
            return dtype_problem

        add = consumer_of(erf.outputs[0], "Add")
        if add is None:
            return fail("add", f"output of {describe(erf)} does not feed an Add of 1")
        one = other_input(add, erf.outputs[0])
        if not is_const_close(one, 1.0):
            return fail("add", f"{describe(add)} adds {_constant_text(one)}, expected 1", add)

        tail = match_gelu_tail(add, x)
        if isinstance(tail, Fail):
            return tail
        tail_nodes, output = tail
        standard = opset(graph) >= STANDARD_GELU_OPSET
        return Match(nodes=[scale, erf, add, *tail_nodes], outputs=[output], captures={"x": x, "standard": standard})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        if match.standard:
            return op.op("Gelu", [match.x])  # approximate="none" is the default: the erf form
        return op.op("Gelu", [match.x], domain=MS)


def match_gelu_tail(bracket: ir.Node, x: ir.Value) -> tuple[list[ir.Node], ir.Value] | Fail:
    """The `0.5 * x * (1 + …)` end of a GELU, given the node computing `1 + …`.

    The three shapes exporters emit (each Mul's inputs in either order):
        Mul(Mul(x, 0.5), bracket)   0.5 first: HF gelu_new, onnxscript
        Mul(Mul(x, bracket), 0.5)   0.5 last: TorchScript's aten::gelu
        Mul(x, Mul(bracket, 0.5))   0.5 folded into the bracket
    `x` may reach the tail through Casts to the type it already has (mixed-precision exports,
    ONNX Runtime's fast_gelu3_with_casts); those Casts are part of the match.
    Returns the tail's nodes and the GELU's output value.
    """
    bracket_out = bracket.outputs[0]
    first = consumer_of(bracket_out, "Mul")
    if first is None:
        return fail("mul", f"output of {describe(bracket)} does not feed a Mul")
    other, other_casts = through_noop_casts(other_input(first, bracket_out))

    if same_value(other, x):  # (x * bracket) * 0.5
        last = consumer_of(first.outputs[0], "Mul")
        if last is None:
            return fail("half", f"{describe(first)} is not followed by a Mul by 0.5")
        half = other_input(last, first.outputs[0])
        if not is_const_close(half, 0.5):
            return fail("half", f"{describe(last)} multiplies by {_constant_text(half)}, expected 0.5", last)
        return [*other_casts, first, last], last.outputs[0]

    if const_scalar(other) is not None:  # x * (bracket * 0.5)
        if not is_const_close(other, 0.5):
            return fail("half", f"{describe(first)} multiplies by {_constant_text(other)}, expected 0.5", first)
        last = consumer_of(first.outputs[0], "Mul")
        if last is None or not same_value(other_input(last, first.outputs[0]), x):
            return fail("half", f"output of {describe(first)} is not multiplied by '{value_name(x)}'")
        _, casts = through_noop_casts(other_input(last, first.outputs[0]))
        return [first, *casts, last], last.outputs[0]

    half_x = producer(other)  # (x * 0.5) * bracket
    if is_op(half_x, "Mul") and split_scalar(half_x) is not None:
        data, half = split_scalar(half_x)
        if not same_value(data, x):
            return fail("half", f"{describe(half_x)} scales '{value_name(data)}', not '{value_name(x)}'", half_x)
        if not math.isclose(half, 0.5, rel_tol=1e-3):
            return fail("half", f"{describe(half_x)} multiplies by {half:.5g}, expected 0.5", half_x)
        return [half_x, *other_casts, first], first.outputs[0]
    return fail(
        "half",
        f"{describe(first)} multiplies the bracket by '{value_name(other)}', not by '{value_name(x)}' and 0.5",
        first,
    )


def check_gelu_dtype(x: ir.Value, op_type: str, allowed: frozenset = GELU_TYPES) -> Fail | None:
    """A near miss when `x` has a known element type the contrib op does not take."""
    dtype = x.dtype
    if dtype is None or dtype in allowed:
        return None
    names = ", ".join(sorted(t.name.lower() for t in allowed))
    return fail("dtype", f"'{value_name(x)}' is {dtype.name.lower()}; {op_type} takes {names}")


def _constant_text(value: ir.Value | None) -> str:
    scalar = const_scalar(value)
    return f"{scalar:.5g}" if scalar is not None else f"non-constant '{value_name(value)}'"
