"""Pooling kernels: MaxPool, AveragePool, LpPool and their global forms, any spatial rank.

A window pool is a loop over kernel taps, each tap one vectorised operation over a strided
slice the size of the output (9 slices for a 3x3 pool), which beats reducing over a
(…, kh, kw) window view and keeps temporaries output-sized. The geometry — pads, output size,
the extra end padding ceil_mode needs, each tap's slices — is planned once per input shape.

Output size follows ONNX Runtime: floor (or ceil with ceil_mode, dropping a last window that
would start past the input and its begin padding) of (in + pads - window) / stride + 1.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp
from runtime.kernels.conv import read_auto_pad, spatial_pads


def _output_wanted(node: ir.Node, index: int) -> bool:
    """Whether an optional output is present: ONNX omits one by giving it an empty name."""
    return index < len(node.outputs) and bool(node.outputs[index].name)


class _Geometry:
    """Where every window of a pool over one input shape lies."""

    def __init__(self, sizes, kernel, strides, dilations, auto_pad, pads, ceil_mode):
        begin, end = spatial_pads(auto_pad, pads, sizes, kernel, strides, dilations)
        out = []
        for size, b, e, k, s, d in zip(sizes, begin, end, kernel, strides, dilations, strict=True):
            span = size + b + e - (k - 1) * d - 1
            count = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (count - 1) * s >= size + b:
                count -= 1
            out.append(count)
        # ceil_mode's last window may run past the end padding: pad further so slices stay in bounds.
        extra = [
            max(0, (o - 1) * s + (k - 1) * d + 1 - (size + b + e))
            for o, s, k, d, size, b, e in zip(out, strides, kernel, dilations, sizes, begin, end, strict=True)
        ]
        self.sizes = list(sizes)
        self.begin, self.end, self.extra, self.out = begin, end, extra, out
        self.kernel, self.strides, self.dilations = list(kernel), list(strides), list(dilations)
        everything = (slice(None), slice(None))
        self.taps = [
            everything
            + tuple(
                slice(t * d, t * d + s * (o - 1) + 1, s)
                for t, d, s, o in zip(tap, dilations, strides, out, strict=True)
            )
            for tap in itertools.product(*(range(k) for k in kernel))
        ]
        self.padded = tuple(
            size + b + e + x for size, b, e, x in zip(sizes, begin, end, self.extra, strict=True)
        )
        self.interior = everything + tuple(slice(b, b + size) for b, size in zip(begin, sizes, strict=True))

    def pad(self, xp, x, fill):
        if self.padded == x.shape[2:]:
            return x
        out = xp.full(x.shape[:2] + self.padded, fill, dtype=x.dtype)
        out[self.interior] = x
        return out

    def window_counts(self, xp, include_pad):
        """How many elements each window averages: real input only, or also explicit pads
        (never the ceil_mode overhang), as ONNX Runtime divides."""
        per_axis = []
        for size, b, e, k, s, d, o in zip(
            self.sizes, self.begin, self.end, self.kernel, self.strides, self.dilations, self.out, strict=True
        ):
            low, high = (-b, size + e) if include_pad else (0, size)
            starts = np.arange(o) * s - b
            taps = starts[:, None] + np.arange(k)[None, :] * d
            per_axis.append(((taps >= low) & (taps < high)).sum(axis=1))
        counts = per_axis[0]
        for axis_counts in per_axis[1:]:
            counts = np.multiply.outer(counts, axis_counts)
        return xp.asarray(counts)


def window_sums(padded, taps):
    """Per output position, the sum over its window: one in-place add per kernel tap."""
    total = padded[taps[0]].copy()
    for tap in taps[1:]:
        total += padded[tap]
    return total


def window_maxima(xp, padded, taps):
    """Per output position, the maximum over its window: one in-place maximum per kernel tap."""
    y = padded[taps[0]].copy()
    for tap in taps[1:]:
        xp.maximum(y, padded[tap], out=y)
    return y


class WindowPool(Kernel):
    """Attribute reading and per-shape geometry shared by the window pools (NCHW here, and
    channels-last in runtime/kernels/conv_nhwc.py, which overrides `_plan`)."""

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.auto_pad = read_auto_pad(self)
        self.kernel = self.attr("kernel_shape")
        if self.kernel is None:
            raise UnsupportedOp(f"{self.op_type} '{node.name}': attribute kernel_shape is required")
        rank = len(self.kernel)
        self.strides = self.attr("strides") or [1] * rank
        self.dilations = self.attr("dilations") or [1] * rank
        self.pads = self.attr("pads")
        self.ceil_mode = bool(self.attr("ceil_mode", 0))
        self._plans: dict = {}

    def plan(self, shape):
        """`_plan(shape)`, made once per input shape."""
        plan = self._plans.get(shape)
        if plan is None:
            plan = self._plans[shape] = self._plan(shape)
        return plan

    def _plan(self, shape) -> _Geometry:
        return self._geometry(shape[2:])

    def _geometry(self, sizes) -> _Geometry:
        return _Geometry(
            sizes, self.kernel, self.strides, self.dilations, self.auto_pad, self.pads, self.ceil_mode
        )


class MaxPool(WindowPool):
    op_type = "MaxPool"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.want_indices = _output_wanted(node, 1)
        # storage_order 1: Indices count positions column-major within each image.
        self.column_major = bool(self.attr("storage_order", 0))
        self._tap_positions: dict = {}

    def run(self, x):
        xp = self.xp
        geometry = self.plan(x.shape)
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        padded = geometry.pad(xp, x, fill)
        taps = geometry.taps
        if not self.want_indices:
            return (window_maxima(xp, padded, taps),)
        y = padded[taps[0]].copy()
        positions = self._positions(x.shape, geometry)
        n, c = x.shape[:2]
        image = math.prod(x.shape[2:])
        indices = xp.broadcast_to(positions[0], y.shape).copy()
        for tap, position in zip(taps[1:], positions[1:], strict=True):
            window = padded[tap]
            better = window > y  # strict: the first maximum wins ties
            xp.copyto(y, window, where=better)
            xp.copyto(indices, xp.broadcast_to(position, y.shape), where=better)
        base = (xp.arange(n * c, dtype=np.int64) * image).reshape((n, c) + (1,) * (x.ndim - 2))
        return (y, indices + base)

    def _positions(self, shape, geometry):
        """Per tap, the flat in-image position each output's window element comes from."""
        positions = self._tap_positions.get(shape)
        if positions is not None:
            return positions
        sizes = shape[2:]
        rank = len(sizes)
        if self.column_major:
            weights = [math.prod(sizes[:i]) for i in range(rank)]
        else:
            weights = [math.prod(sizes[i + 1 :]) for i in range(rank)]
        positions = []
        for tap in itertools.product(*(range(k) for k in geometry.kernel)):
            flat = np.zeros(geometry.out, dtype=np.int64)
            for axis, t in enumerate(tap):
                coord = np.arange(geometry.out[axis]) * geometry.strides[axis] - geometry.begin[axis]
                coord = coord + t * geometry.dilations[axis]
                flat = flat + (coord * weights[axis]).reshape([-1 if a == axis else 1 for a in range(rank)])
            positions.append(self.xp.asarray(flat))
        self._tap_positions[shape] = positions
        return positions


class AveragePool(WindowPool):
    op_type = "AveragePool"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.include_pad = bool(self.attr("count_include_pad", 0))
        self._divisors: dict = {}

    def run(self, x):
        xp = self.xp
        geometry = self.plan(x.shape)
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        total = window_sums(geometry.pad(xp, work, 0), geometry.taps)
        divisor = self._divisors.get(x.shape)
        if divisor is None:
            divisor = self._divisors[x.shape] = geometry.window_counts(xp, self.include_pad).astype(
                total.dtype
            )
        total /= divisor
        return (total.astype(x.dtype, copy=False),)


class LpPool(WindowPool):
    op_type = "LpPool"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.p = self.attr("p", 2)

    def run(self, x):
        xp = self.xp
        geometry = self.plan(x.shape)
        powered = xp.abs(x) ** self.p
        total = window_sums(geometry.pad(xp, powered, 0), geometry.taps)
        return ((total ** (1.0 / self.p)).astype(x.dtype, copy=False),)


class GlobalAveragePool(Kernel):
    op_type = "GlobalAveragePool"
    since_version = 1

    def run(self, x):
        accumulate = np.float32 if x.dtype == np.float16 else None  # a half-precision sum overflows
        mean = x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=accumulate)
        return (mean.astype(x.dtype, copy=False),)


class GlobalMaxPool(Kernel):
    op_type = "GlobalMaxPool"
    since_version = 1

    def run(self, x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


class GlobalLpPool(Kernel):
    op_type = "GlobalLpPool"
    since_version = 2

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.p = self.attr("p", 2)

    def run(self, x):
        total = (self.xp.abs(x) ** self.p).sum(axis=tuple(range(2, x.ndim)), keepdims=True)
        return ((total ** (1.0 / self.p)).astype(x.dtype, copy=False),)


KERNELS = [
    MaxPool,
    AveragePool,
    LpPool,
    GlobalAveragePool,
    GlobalMaxPool,
    GlobalLpPool,
]
