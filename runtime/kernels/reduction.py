"""Reduction kernels: the Reduce* ops, ArgMax/ArgMin and CumSum.

The Reduce* ops took `axes` as an attribute until opset 18 (ReduceSum until 13) and as an
optional input after, which added `noop_with_empty_axes` (empty axes: return the input
instead of reducing everything). Each op is therefore two classes that share its math, a
module-level function `(xp, x, axis, keepdims) -> array`; both are made from the op's one
row in `_REDUCE_OPS`, so the two versions cannot drift apart.

Integer sums and products keep the input's type (numpy widens them to int64 by default).
Reducing an empty set gives the op's identity (0 for sums, 1 for products, -inf for
maxima and log-sums, +inf for minima), which numpy's max/min would refuse to compute.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel

# ---- the math of each op ----------------------------------------------------------------------


def _sum(xp, x, axis, keepdims):
    return xp.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _mean(xp, x, axis, keepdims):
    if xp is np and (x.dtype == np.float32 or x.dtype == np.float64):
        # np.mean's own two steps for these types (a pairwise sum in x's type, one division by
        # the count), without its Python wrappers: 13 -> ~3 us a call on a tiny model's rows.
        total = np.add.reduce(x, axis=axis, keepdims=keepdims)
        return total / (x.size // total.size)
    return xp.mean(x, axis=axis, keepdims=keepdims).astype(x.dtype, copy=False)


def _max(xp, x, axis, keepdims):
    return xp.max(x, axis=axis, keepdims=keepdims)


def _min(xp, x, axis, keepdims):
    return xp.min(x, axis=axis, keepdims=keepdims)


def _prod(xp, x, axis, keepdims):
    return xp.prod(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _l1(xp, x, axis, keepdims):
    return xp.sum(xp.abs(x), axis=axis, keepdims=keepdims, dtype=x.dtype)


def _l2(xp, x, axis, keepdims):
    squares = xp.sum(x * x, axis=axis, keepdims=keepdims, dtype=x.dtype)
    return xp.sqrt(squares).astype(x.dtype, copy=False)


def _sum_square(xp, x, axis, keepdims):
    return xp.sum(x * x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _log_sum(xp, x, axis, keepdims):
    return xp.log(xp.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype))


def _log_sum_exp(xp, x, axis, keepdims):
    """log(sum(exp(x - m))) + m with m the maximum, so exp can't overflow; an infinite
    maximum shifts by 0 instead (inf - inf would be NaN)."""
    shift = xp.max(x, axis=axis, keepdims=True)
    shift = xp.where(xp.isfinite(shift), shift, 0).astype(x.dtype, copy=False)
    total = xp.sum(xp.exp(x - shift), axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer (all inputs -inf), not an error
        result = xp.log(total)
    result += shift
    if not keepdims:
        result = result.reshape(_reduced_shape(x.shape, axis))
    return result


def _reduced_shape(shape, axis):
    if axis is None:
        return ()
    dropped = {a % len(shape) for a in axis}
    return tuple(size for i, size in enumerate(shape) if i not in dropped)


# ---- the two ways of getting axes -------------------------------------------------------------


class Reduce(Kernel):
    """Shared run: empty inputs produce the identity, everything else goes to `reduce`."""

    reduce: ClassVar[staticmethod]
    empty_value: ClassVar[float]

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.keepdims = bool(self.attr("keepdims", 1))

    def _reduce(self, x, axis):
        if x.size == 0:
            shape = np.sum(np.empty(x.shape, dtype=np.int8), axis=axis, keepdims=self.keepdims).shape
            value = self.empty_value
            if x.dtype.kind in "iu" and not np.isfinite(value):  # integers have no infinities
                info = np.iinfo(x.dtype)
                value = info.min if value < 0 else info.max
            elif x.dtype.kind == "b":  # max of nothing is False, min of nothing is True
                value = value > 0
            return self.xp.full(shape, value, dtype=x.dtype)
        return self.xp.asarray(self.reduce(self.xp, x, axis, self.keepdims))


class ReduceAxesAttribute(Reduce):
    """Axes from the `axes` attribute; none means all."""

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        axes = self.attr("axes")
        self.axis = tuple(int(a) for a in axes) if axes else None

    def run(self, x):
        return (self._reduce(x, self.axis),)


class ReduceAxesInput(Reduce):
    """Axes from the optional second input; none or empty means all, unless
    noop_with_empty_axes, when the input passes through unchanged."""

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.noop_with_empty_axes = bool(self.attr("noop_with_empty_axes", 0))

    def run(self, x, axes=None):
        if axes is None or axes.size == 0:
            if self.noop_with_empty_axes:
                return (x,)
            return (self._reduce(x, None),)
        return (self._reduce(x, tuple(int(a) for a in axes.tolist())),)


# ---- the ops ---------------------------------------------------------------------------------


# One row an op: (op, its math, what reducing an empty set gives, the opset that made axes an input).
_REDUCE_OPS = [
    ("ReduceSum", _sum, 0, 13),
    ("ReduceMean", _mean, np.nan, 18),
    ("ReduceMax", _max, -np.inf, 18),
    ("ReduceMin", _min, np.inf, 18),
    ("ReduceProd", _prod, 1, 18),
    ("ReduceL1", _l1, 0, 18),
    ("ReduceL2", _l2, 0, 18),
    ("ReduceSumSquare", _sum_square, 0, 18),
    ("ReduceLogSum", _log_sum, -np.inf, 18),
    ("ReduceLogSumExp", _log_sum_exp, -np.inf, 18),
]


def _versions(op_type, reduce, empty_value, axes_input_since) -> list[type[Reduce]]:
    """The op's two kernel classes, named as ONNX's reference ops are (`ReduceSum_1`, `ReduceSum_13`)."""
    shared = {"op_type": op_type, "reduce": staticmethod(reduce), "empty_value": empty_value}
    return [
        type(f"{op_type}_1", (ReduceAxesAttribute,), {**shared, "since_version": 1}),
        type(
            f"{op_type}_{axes_input_since}",
            (ReduceAxesInput,),
            {**shared, "since_version": axes_input_since},
        ),
    ]


# ---- index of the extreme ---------------------------------------------------------------------


class _ArgExtreme(Kernel):
    """Index (int64) of the first extreme along `axis`, or the last with select_last_index,
    found by searching the reversed axis."""

    find: ClassVar[str]

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = int(self.attr("axis", 0))
        self.keepdims = bool(self.attr("keepdims", 1))
        self.last = bool(self.attr("select_last_index", 0))
        self._find = getattr(self.xp, self.find)

    def run(self, x):
        xp = self.xp
        if not self.last:
            index = self._find(x, axis=self.axis, keepdims=self.keepdims)
            return (xp.asarray(index, dtype=np.int64),)
        flipped = self._find(xp.flip(x, axis=self.axis), axis=self.axis, keepdims=self.keepdims)
        return (xp.asarray(x.shape[self.axis] - 1 - flipped, dtype=np.int64),)


class ArgMax(_ArgExtreme):
    op_type, since_version, find = "ArgMax", 1, "argmax"


class ArgMin(_ArgExtreme):
    op_type, since_version, find = "ArgMin", 1, "argmin"


# ---- running sums -----------------------------------------------------------------------------


class _Cumulative(Kernel):
    """Running sum or product along the axis given as a 0-d input. `exclusive` shifts the
    results by one (the first is the identity) by scanning all but the last element into an
    identity-filled output, which stays exact where undoing the last step would not;
    `reverse` scans from the end. Subclasses name the numpy scan and its identity."""

    scan_name = ""
    identity = 0

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.exclusive = bool(self.attr("exclusive", 0))
        self.reverse = bool(self.attr("reverse", 0))
        self.scan = getattr(self.xp, self.scan_name)

    def run(self, x, axis):
        xp = self.xp
        axis = int(axis) % x.ndim
        if self.reverse:
            x = xp.flip(x, axis=axis)
        if self.exclusive:
            head = [slice(None)] * x.ndim
            tail = [slice(None)] * x.ndim
            head[axis] = slice(None, -1)
            tail[axis] = slice(1, None)
            y = xp.full_like(x, self.identity)
            self.scan(x[tuple(head)], axis=axis, dtype=x.dtype, out=y[tuple(tail)])
        else:
            y = self.scan(x, axis=axis, dtype=x.dtype)
        if self.reverse:
            y = xp.flip(y, axis=axis)
        return (xp.ascontiguousarray(y),)


class CumSum(_Cumulative):
    op_type, since_version, scan_name, identity = "CumSum", 11, "cumsum", 0


class CumProd(_Cumulative):
    op_type, since_version, scan_name, identity = "CumProd", 26, "cumprod", 1


KERNELS = [
    *(kernel for row in _REDUCE_OPS for kernel in _versions(*row)),
    ArgMax,
    ArgMin,
    CumSum,
    CumProd,
]
