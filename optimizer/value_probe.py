"""Evaluating a small pattern on probe arrays: how rules prove what a chain of data-movement ops does.

A rule hands in numbered arrays for the values a pattern starts from; each node on the way is
evaluated with `constant_eval` (standard ops only), constants are read, and a Shape of a value
with no probe array reads its pinned shape (optimizer.shape_probe) when one is given. Exporters
spell slices, repeats and reshapes with run-time shape arithmetic; running the chain says what it
does regardless of spelling, where matching each spelling would not.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from optimizer import constant_eval
from optimizer.match import const_array, describe, is_op, opset, producer, value_name

# What a probe may fail with: the chain holds an op or variant the evaluator lacks, or its numbers
# do not fit the op (then it is not the pattern).
PROBE_ERRORS = (constant_eval.NotEvaluable, ValueError, IndexError, TypeError)


def evaluate_on_probe(
    graph: ir.Graph,
    value: ir.Value,
    known: dict[int, np.ndarray],
    shapes: dict | None = None,
    limit: int = 40,
    shape_of: Callable[[ir.Value], tuple[int, ...] | None] | None = None,
    stand_in: Callable[[ir.Value], np.ndarray | None] | None = None,
) -> np.ndarray:
    """`value` computed from `known` (id of a value -> its probe array), constants and, for Shape of
    anything else, `shapes` (value name -> pinned shape) or `shape_of` (value -> its probe shape, None
    when it has none); at most `limit` nodes are evaluated.

    `stand_in` (value -> an array, or None) supplies arrays for values met on the way instead of
    evaluating their producers; with it, a Shape of a value with no pinned shape evaluates the value."""
    budget = [0]

    def run(current: ir.Value) -> np.ndarray:
        if id(current) in known:
            return known[id(current)]
        constant = const_array(current)
        if constant is not None:
            return constant
        if stand_in is not None:
            array = stand_in(current)
            if array is not None:
                known[id(current)] = array
                return array
        node = producer(current)
        budget[0] += 1
        if node is None or budget[0] > limit or not constant_eval.can_evaluate(node):
            raise constant_eval.NotEvaluable(f"'{value_name(current)}' comes from {describe(node)}")
        source = node.inputs[0] if node.inputs else None
        if is_op(node, "Shape") and id(source) not in known and (shapes is not None or shape_of is not None):
            pinned = shape_of(source) if shape_of is not None else shapes.get(source.name)
            if pinned is None and stand_in is None:
                raise constant_eval.NotEvaluable(f"no pinned shape for '{value_name(source)}'")
            # only its shape is read
            inputs = [run(source) if pinned is None else np.broadcast_to(np.zeros((), np.bool_), pinned)]
        else:
            inputs = [None if v is None else run(v) for v in node.inputs]
        for output, array in zip(
            node.outputs, constant_eval.evaluate(node, inputs, opset(graph)), strict=False
        ):
            known[id(output)] = array
        return known[id(current)]

    return run(value)
