"""The folding budget: how large a constant result may be before it is left to run time.

ConstantFolding and data propagation (shape inference's C++ pass) share it, so it lives below both.
"""

from __future__ import annotations

import math

import numpy as np

from optimizer.text import preview

# Folding trades run-time work for model-file bytes. A shape-sized result is a clear win;
# an activation-sized one (ConstantOfShape or Expand building a [batch, heads, seq, seq]
# mask, say) would bloat the model by megabytes and replace a cheap fill with a memory
# read, so results above this size are left to be computed at run time.
MAX_FOLDED_ELEMENTS = 1_000_000


def predicted_elements(op_type: str, inputs: list) -> int:
    """How many elements `op_type` would produce on `inputs`, without producing them.

    Only ops whose result can outgrow their inputs need a formula; for the rest the largest
    input (or the inputs' broadcast shape) bounds the result. Raises what evaluating would
    raise for inputs that make no sense (a zero Range step, shapes that do not broadcast).
    """
    arrays = [a for a in inputs if a is not None]
    if op_type == "ConstantOfShape":
        return math.prod(_dims(inputs[0]))
    if op_type == "Expand":
        return math.prod(np.broadcast_shapes(inputs[0].shape, tuple(_dims(inputs[1]))))
    if op_type == "Tile":
        return inputs[0].size * math.prod(_dims(inputs[1]))
    if op_type == "Range":
        start, limit, delta = (np.asarray(a).reshape(-1)[0].item() for a in inputs[:3])
        if delta == 0:
            raise ValueError("Range's delta is 0")
        return max(math.ceil((limit - start) / delta), 0)
    if op_type == "Gather":
        data, indices = inputs[0], inputs[1]
        # Dividing out the smallest dimension bounds the result whichever axis is gathered.
        return indices.size * (data.size // max(min(data.shape), 1)) if data.ndim else indices.size
    if op_type == "MatMul":
        a, b = inputs[0].shape, inputs[1].shape
        a2, b2 = (a if len(a) >= 2 else (1, *a)), (b if len(b) >= 2 else (*b, 1))
        return math.prod(np.broadcast_shapes(a2[:-2], b2[:-2])) * a2[-2] * b2[-1]
    largest = max((a.size for a in arrays), default=0)
    if len(arrays) > 1:
        try:
            largest = max(largest, math.prod(np.broadcast_shapes(*(a.shape for a in arrays))))
        except ValueError:
            pass  # not a broadcasting op (Concat, Reshape ...): its inputs bound it
    return largest


def _dims(array) -> list[int]:
    dims = [int(d) for d in np.asarray(array).reshape(-1)]
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in {preview(dims)}")
    return dims
