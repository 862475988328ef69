"""How long the feeds make each symbolic dimension of a graph's inputs (feeds.py fills them).

A dimension's name (its dim_param) decides, in this order:

  named like "batch"       the batch ("batch_size", "batch")
  named like "encoder"     the encoder's length, the sequence length unless a caller says otherwise
                           ("encoder_sequence_length"; "past_encoder_sequence_length", since a
                           cross-attention past is as long as the encoder's output)
  starts with "past"       the past: PAST_SEQUENCE_LENGTH cached positions when the graph has a past
                           ("past_sequence_length", "past_decoder_sequence_length", "past_seq_len")
  starts with "total"      past + sequence: a mask over cached and new positions
                           ("total_sequence_length", ONNX Runtime GenAI's exports; "total_seq_len")
  an expression            evaluated: integers, + - * // and parentheses over names sized by the
                           rules above, bound by the next one, or naming the new tokens
                           ("sequence_length", "seq_len"): "past_sequence_length + sequence_length"
                           (Optimum's mask), "past_sequence_length + 1", "s1 + s2" (torch's)
  any other name, or none  the batch on the first axis, the sequence length on any other ("seq",
                           "sequence_length", "unk__12"); such a name, once bound, has that size
                           inside expressions too

The new tokens are the sequence length, so a decoder with a past is fed `sequence_length` new
positions after PAST_SEQUENCE_LENGTH cached ones, and its mask covers both. An expression these
rules cannot evaluate (an unknown name, a function, a negative size) is a FeedError naming the
input, the axis and the expression: a guessed length would only move the failure into an engine.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable

import onnx

# A few cached positions: enough that a left-padded batch's padding reaches into the past (a quarter
# of 4 + 8 positions in tools/model_scan.py), few enough that the new tokens still decide the timing.
PAST_SEQUENCE_LENGTH = 4
# Longer dim_params are refused before parsing: real exports write a few terms, and the evaluation
# below recurses once per operator.
LONGEST_EXPRESSION = 200

# Names of the new tokens an expression may use even where no input has them on their own axis.
SEQUENCE_NAMES = frozenset({"sequence_length", "decoder_sequence_length", "seq_len", "sequence", "seq"})
_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,  # past + sequence
    ast.Sub: operator.sub,  # total - sequence
    ast.Mult: operator.mul,  # 2*s0
    ast.FloorDiv: operator.floordiv,  # s0//2
}


class FeedError(ValueError):
    """A graph input no feed rule covers; the message names the input and its type, or the dimension
    and the expression that could not be sized."""


def names_past(name: str) -> bool:
    """A dimension name that sizes a key/value past ("past_sequence_length"), not the encoder's."""
    lowered = name.lower()
    return lowered.startswith("past") and "encoder" not in lowered and "batch" not in lowered


class Dimensions:
    """The sizes of one graph's symbolic dimensions for one batch, sequence, past and encoder length.

    `past` applies only when some input's dimension names a past (standalone or inside an
    expression); a graph without one gets 0, so a "total_sequence_length" there is the sequence."""

    def __init__(
        self,
        inputs: Iterable[onnx.ValueInfoProto],
        batch: int,
        sequence: int,
        past: int = PAST_SEQUENCE_LENGTH,
        encoder: int | None = None,
    ) -> None:
        inputs = [value for value in inputs if value.type.WhichOneof("value") == "tensor_type"]
        named = [dim.dim_param for value in inputs for dim in value.type.tensor_type.shape.dim if dim.dim_param]
        has_past = any(names_past(part) for param in named for part in _names_in(param))
        self.batch, self.sequence = batch, sequence
        self.past = past if has_past else 0
        self.encoder = sequence if encoder is None else encoder
        # Other names take their size where they stand alone, the first place they do, so that an
        # expression over them ("s1 + s2", a torch export's mask) agrees with the inputs they size.
        self._bound: dict[str, int] = {}
        for value in inputs:
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                param = dim.dim_param
                if param and _is_name(param) and self._by_name(param) is None:
                    self._bound.setdefault(param, batch if axis == 0 else sequence)

    def shape(self, value: onnx.ValueInfoProto) -> tuple[int, ...]:
        return tuple(self.size(value.name, axis, dim) for axis, dim in enumerate(value.type.tensor_type.shape.dim))

    def size(self, input_name: str, axis: int, dim: onnx.TensorShapeProto.Dimension) -> int:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            return dim.dim_value
        param = dim.dim_param
        if not param or _is_name(param):
            by_name = self._by_name(param) if param else None
            if by_name is not None:
                return by_name
            return self.batch if axis == 0 else self.sequence
        return self._evaluate_expression(input_name, axis, param)

    def _by_name(self, name: str) -> int | None:
        """The size a name's own words give it, or None for a name they say nothing about."""
        lowered = name.lower()
        if "batch" in lowered:
            return self.batch
        if "encoder" in lowered:
            return self.encoder
        if names_past(name):
            return self.past
        if lowered.startswith("total"):
            return self.past + self.sequence
        return None

    def _evaluate_expression(self, input_name: str, axis: int, expression: str) -> int:
        def refuse(why: str) -> FeedError:
            return FeedError(f"input '{input_name}' dimension {axis} is '{expression}': {why}")

        if len(expression) > LONGEST_EXPRESSION:
            raise refuse(f"longer than {LONGEST_EXPRESSION} characters")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError:
            # Not an expression at all ("batch size", "?"): a name like any other, as feeds always took it.
            return self.batch if axis == 0 else self.sequence

        def evaluate(node: ast.AST) -> int:
            if isinstance(node, ast.Constant) and type(node.value) is int:
                return node.value
            if isinstance(node, ast.Name):
                size = self._by_name(node.id)
                size = self._bound.get(node.id) if size is None else size
                if size is None and node.id in SEQUENCE_NAMES:
                    size = self.sequence
                if size is None:
                    raise refuse(
                        f"no rule sizes '{node.id}' (names like batch, past…, total…, encoder, sequence_length, "
                        "or a name that sizes an axis on its own)"
                    )
                return size
            if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
                left, right = evaluate(node.left), evaluate(node.right)
                if isinstance(node.op, ast.FloorDiv) and right == 0:
                    raise refuse("divides by zero")
                return _OPERATORS[type(node.op)](left, right)
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                return -evaluate(node.operand)
            raise refuse("only integers, names, + - * // and parentheses are evaluated")

        size = evaluate(tree.body)
        if size < 0:
            raise refuse(f"evaluates to {size}")
        return size


def _is_name(param: str) -> bool:
    return param.strip().isidentifier()


def _names_in(param: str) -> list[str]:
    """The names a dim_param mentions: itself when it is a name, those of its expression otherwise."""
    if _is_name(param) or len(param) > LONGEST_EXPRESSION:
        return [param.strip()]
    try:
        tree = ast.parse(param.strip(), mode="eval")
    except SyntaxError:
        return [param]
    return [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
