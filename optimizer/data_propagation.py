"""Whether onnx's data propagation may run on a model: shape inference and the pinned probes ask first.

Data propagation computes shape-like values in C++, materializing each one, so a generator op
whose size comes from a constant decides whether it is safe; the folding budget is the bound.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.folding_budget import MAX_FOLDED_ELEMENTS, predicted_elements
from optimizer.match import const_array

# Ops whose output size comes from the values of an input (their "size" input) rather than its size.
_GENERATORS = {"ConstantOfShape": 0, "Expand": 1, "Tile": 1, "Range": None}


def data_prop_is_bounded(model: ir.Model) -> bool:
    """Whether onnx's data propagation can run without materializing a huge tensor.

    Data propagation computes shape-like values in C++, and a ConstantOfShape([2e9]) or a
    Range(0, 2e9) followed by a Cast makes it allocate the whole result (std::bad_alloc, or
    the machine's memory). Shape inference without it still types every value; it only loses
    dimensions computed from shape arithmetic. So it is turned off when a generator op's size
    comes from a constant above the folding budget, or a declared dimension is above it.
    """
    declared = [*model.graph.inputs, *model.graph.outputs]
    if any(isinstance(d, int) and d > MAX_FOLDED_ELEMENTS for v in declared if v.shape is not None for d in v.shape):
        return False
    for node in model.graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _GENERATORS:
            continue
        inputs = [None if v is None else const_array(v) for v in node.inputs]
        index = _GENERATORS[node.op_type]
        needed = inputs[:3] if index is None else [inputs[index]]
        if any(a is None for a in needed):
            continue
        if inputs[0] is None:  # Expand's or Tile's data is not constant: its size is at least 1
            inputs[0] = np.zeros((), np.bool_)
        try:
            if predicted_elements(node.op_type, inputs) > MAX_FOLDED_ELEMENTS:
                return False
        except (ValueError, IndexError, TypeError, ArithmeticError):
            return False  # nonsense sizes: let inference type the graph without computing them
    return True
