"""A small numpy evaluator for the ops exporters put in constant subgraphs.

ConstantFolding uses it to turn shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat,
Range, ConstantOfShape, Cast ...) into initializers. It is deliberately not a runtime:
the optimizer may not depend on runtime/ (dependencies point service -> runtime ->
optimizer), and it may not call onnx.reference or onnxruntime. So it covers only the
standard-domain ops that exporters emit on constants, one line each in `EVALUATORS`.

An evaluator takes the node, its input arrays (None for an omitted optional input) and
the graph's opset, and returns the output arrays. It raises `NotEvaluable` for a variant
it does not cover (a dtype numpy cannot hold, an attribute form it does not read); the
folder then leaves the node alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from optimizer.match import attr


class NotEvaluable(Exception):
    """This node's variant is outside what the evaluator covers; leave it in the graph."""


Evaluator = Callable[[ir.Node, list, int], list]


# --- helpers -----------------------------------------------------------------------------


def _ints(array) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _axes(node: ir.Node, inputs: list, opset: int, attr_until: int, input_index: int = 1) -> list[int] | None:
    """Axes from the attribute (before opset `attr_until`) or from an input (from it on)."""
    if opset < attr_until:
        axes = attr(node, "axes")
        return None if axes is None else list(axes)
    value = inputs[input_index] if len(inputs) > input_index else None
    return None if value is None else _ints(value)


def _numpy_dtype(onnx_type: int) -> np.dtype:
    data_type = ir.DataType(onnx_type)
    if data_type in (ir.DataType.STRING, ir.DataType.UNDEFINED) or data_type.itemsize < 1:
        raise NotEvaluable(f"dtype {data_type.name}")
    dtype = data_type.numpy()
    if dtype.kind == "V" or dtype.names is not None or not dtype.isbuiltin:
        raise NotEvaluable(f"dtype {data_type.name} has no plain numpy equivalent")
    return dtype


def _same_dtype(fn) -> Evaluator:
    """An elementwise op whose result keeps its first input's dtype (ONNX requires equal types)."""

    def evaluate(node, inputs, opset):
        return [np.asarray(fn(*inputs)).astype(inputs[0].dtype, copy=False)]

    return evaluate


def _boolean(fn) -> Evaluator:
    return lambda node, inputs, opset: [np.asarray(fn(*inputs), dtype=np.bool_)]


def _variadic(fn) -> Evaluator:
    def evaluate(node, inputs, opset):
        result = inputs[0]
        for other in inputs[1:]:
            result = fn(result, other)
        return [np.asarray(result).astype(inputs[0].dtype, copy=False)]

    return evaluate


# --- arithmetic ----------------------------------------------------------------------------


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        # ONNX (like C) truncates integer division toward zero; numpy's // floors.
        quotient = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -quotient, quotient)
    return a / b


def _mod(node, inputs, opset):
    a, b = inputs
    if attr(node, "fmod", 0):
        return [np.fmod(a, b).astype(a.dtype, copy=False)]
    if not np.issubdtype(a.dtype, np.integer):
        raise NotEvaluable("Mod with fmod=0 is defined for integers only")
    return [np.mod(a, b).astype(a.dtype, copy=False)]


def _pow(node, inputs, opset):
    base, exponent = inputs
    return [np.power(base, exponent.astype(base.dtype, copy=False)).astype(base.dtype, copy=False)]


# --- shapes and data movement --------------------------------------------------------------


def _constant(node, inputs, opset):
    for name, make in (
        ("value", None),
        ("value_float", lambda v: np.array(v, dtype=np.float32)),
        ("value_floats", lambda v: np.array(v, dtype=np.float32)),
        ("value_int", lambda v: np.array(v, dtype=np.int64)),
        ("value_ints", lambda v: np.array(v, dtype=np.int64)),
    ):
        value = attr(node, name)
        if value is not None:
            return [np.asarray(value) if make is None else make(value)]
    raise NotEvaluable("Constant holds a string or sparse value")


def _shape(node, inputs, opset):
    shape = np.array(inputs[0].shape, dtype=np.int64)
    rank = len(shape)
    start, end = attr(node, "start", 0), attr(node, "end", rank)
    start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
    return [shape[start:end]]


def _size(node, inputs, opset):
    return [np.array(inputs[0].size, dtype=np.int64)]


def _gather(node, inputs, opset):
    data, indices = inputs
    return [np.take(data, indices.astype(np.int64), axis=attr(node, "axis", 0))]


def _unsqueeze(node, inputs, opset):
    data = inputs[0]
    axes = _axes(node, inputs, opset, attr_until=13)
    if axes is None:
        raise NotEvaluable("Unsqueeze without axes")
    out_rank = data.ndim + len(axes)
    result = data
    for axis in sorted(a + out_rank if a < 0 else a for a in axes):
        result = np.expand_dims(result, axis)
    return [result]


def _squeeze(node, inputs, opset):
    data = inputs[0]
    axes = _axes(node, inputs, opset, attr_until=13)
    if axes is None:
        return [np.squeeze(data)]
    return [np.squeeze(data, axis=tuple(a + data.ndim if a < 0 else a for a in axes))]


def _concat(node, inputs, opset):
    return [np.concatenate(inputs, axis=attr(node, "axis"))]


def _reshape(node, inputs, opset):
    data, shape = inputs[0], _ints(inputs[1])
    if not attr(node, "allowzero", 0):
        shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [data.reshape(shape)]


def _flatten(node, inputs, opset):
    data = inputs[0]
    axis = attr(node, "axis", 1)
    axis = axis + data.ndim if axis < 0 else axis
    outer, inner = (int(np.prod(part, dtype=np.int64)) for part in (data.shape[:axis], data.shape[axis:]))
    return [data.reshape(outer, inner)]


def _slice_bounds(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX's clamping rules, which differ from Python's for negative steps."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return slice(start, end, step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def _slice(node, inputs, opset):
    data = inputs[0]
    if opset < 10:
        starts, ends = attr(node, "starts"), attr(node, "ends")
        axes, steps = attr(node, "axes"), None
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else None
    axes = list(range(len(starts))) if axes is None else [a + data.ndim if a < 0 else a for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise ValueError("Slice step is 0")
        index[axis] = _slice_bounds(int(start), int(end), int(step), data.shape[axis])
    return [data[tuple(index)]]


def _transpose(node, inputs, opset):
    perm = attr(node, "perm")
    return [np.transpose(inputs[0], None if perm is None else list(perm))]


def _expand(node, inputs, opset):
    data, shape = inputs[0], _ints(inputs[1])
    return [np.broadcast_to(data, np.broadcast_shapes(data.shape, tuple(shape))).copy()]


def _tile(node, inputs, opset):
    return [np.tile(inputs[0], _ints(inputs[1]))]


def _where(node, inputs, opset):
    condition, x, y = inputs
    return [np.where(condition, x, y).astype(x.dtype, copy=False)]


def _range(node, inputs, opset):
    start, limit, delta = inputs
    return [np.arange(start, limit, delta, dtype=start.dtype)]


def _constant_of_shape(node, inputs, opset):
    value = attr(node, "value")
    fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(_ints(inputs[0]), fill[0], dtype=fill.dtype)]


def _cast(node, inputs, opset):
    return [inputs[0].astype(_numpy_dtype(attr(node, "to")))]


def _cast_like(node, inputs, opset):
    return [inputs[0].astype(inputs[1].dtype)]


def _reduce(fn, axes_input_since: int) -> Evaluator:
    def evaluate(node, inputs, opset):
        data = inputs[0]
        axes = _axes(node, inputs, opset, attr_until=axes_input_since)
        keepdims = bool(attr(node, "keepdims", 1))
        if not axes:
            if attr(node, "noop_with_empty_axes", 0):
                return [data]
            axes = list(range(data.ndim))
        axis = tuple(a + data.ndim if a < 0 else a for a in axes)
        return [np.asarray(fn(data, axis=axis, keepdims=keepdims)).astype(data.dtype, copy=False)]

    return evaluate


def _identity(node, inputs, opset):
    return [inputs[0]]


def _split(node, inputs, opset):
    data = inputs[0]
    axis = attr(node, "axis", 0)
    axis = axis + data.ndim if axis < 0 else axis
    count = len(node.outputs)
    sizes = attr(node, "split") if opset < 13 else (_ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None
                                                   else None)
    if sizes is None:  # equal parts; since opset 18 the last may be smaller (num_outputs)
        part = -(-data.shape[axis] // count)
        sizes = [min(part, data.shape[axis] - part * i) for i in range(count)]
    if sum(sizes) != data.shape[axis] or len(sizes) != count:
        raise ValueError(f"Split sizes {list(sizes)} do not cut an axis of {data.shape[axis]} into {count}")
    return np.split(data, np.cumsum(sizes)[:-1], axis=axis)


def _trilu(node, inputs, opset):
    k = int(inputs[1].reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else 0
    return [np.triu(inputs[0], k) if attr(node, "upper", 1) else np.tril(inputs[0], k)]


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x) if x.size else x.astype(np.float64)


def _float_only(fn) -> Evaluator:
    """A float function: evaluated in the input's own precision (float32 stays float32), as a kernel does."""

    def evaluate(node, inputs, opset):
        if inputs[0].dtype.kind != "f":
            raise NotEvaluable(f"{node.op_type} of {inputs[0].dtype}")
        return [np.asarray(fn(inputs[0])).astype(inputs[0].dtype, copy=False)]

    return evaluate


# --- the table -----------------------------------------------------------------------------
# Only standard-domain ops; the folder never evaluates contrib or custom domains.

EVALUATORS: dict[str, Evaluator] = {
    # constants and shapes
    "Constant": _constant,
    "Identity": _identity,
    "Shape": _shape,  # only reached when the input is constant; static shapes are folded by the rule
    "Size": _size,
    # data movement
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Slice": _slice,
    "Transpose": _transpose,
    "Expand": _expand,
    "Tile": _tile,
    "Where": _where,
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Cast": _cast,
    "CastLike": _cast_like,
    # arithmetic
    "Add": _same_dtype(np.add),
    "Sub": _same_dtype(np.subtract),
    "Mul": _same_dtype(np.multiply),
    "Div": _same_dtype(_div),
    "Mod": _mod,
    "Pow": _pow,
    "Neg": _same_dtype(np.negative),
    "Abs": _same_dtype(np.abs),
    "Sqrt": _same_dtype(np.sqrt),
    "Reciprocal": _same_dtype(np.reciprocal),
    "Exp": _same_dtype(np.exp),
    "Log": _same_dtype(np.log),
    "Floor": _same_dtype(np.floor),
    "Ceil": _same_dtype(np.ceil),
    "Sign": _same_dtype(np.sign),
    "Min": _variadic(np.minimum),
    "Max": _variadic(np.maximum),
    "Sum": _variadic(np.add),
    "MatMul": _same_dtype(np.matmul),
    "ReduceSum": _reduce(np.sum, axes_input_since=13),
    "ReduceProd": _reduce(np.prod, axes_input_since=18),
    "ReduceMax": _reduce(np.max, axes_input_since=18),
    "ReduceMin": _reduce(np.min, axes_input_since=18),
    "ReduceMean": _reduce(np.mean, axes_input_since=18),
    # comparisons and logic
    "Equal": _boolean(np.equal),
    "Less": _boolean(np.less),
    "LessOrEqual": _boolean(np.less_equal),
    "Greater": _boolean(np.greater),
    "GreaterOrEqual": _boolean(np.greater_equal),
    "Not": _boolean(np.logical_not),
    "And": _boolean(np.logical_and),
    "Or": _boolean(np.logical_or),
    "Xor": _boolean(np.logical_xor),
    "IsNaN": _boolean(np.isnan),
    "IsInf": _boolean(np.isinf),
    # what exporters compute once from constants: rotary angles' sin/cos, causal masks, ...
    "Sin": _float_only(np.sin),
    "Cos": _float_only(np.cos),
    "Tanh": _float_only(np.tanh),
    "Erf": _float_only(_erf),
    "Sigmoid": _float_only(lambda x: 1 / (1 + np.exp(-x))),
    "Relu": _same_dtype(lambda x: np.maximum(x, 0)),
    "Split": _split,
    "Trilu": _trilu,
}


def can_evaluate(node: ir.Node) -> bool:
    return (node.domain or "") == "" and node.op_type in EVALUATORS


def evaluate(node: ir.Node, inputs: list, opset: int) -> list[np.ndarray]:
    """The node's outputs as numpy arrays; NotEvaluable when the variant is not covered."""
    outputs = EVALUATORS[node.op_type](node, inputs, opset)
    return [np.asarray(o) for o in outputs]
