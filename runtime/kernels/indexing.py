"""Indexing kernels: gather and scatter by index tensors, one-hot, top-k and friends.

ONNX allows negative indices almost everywhere (counted from the end of the axis). numpy's
fancy indexing accepts them natively, so only the ops that go through `take_along_axis` or
build index grids normalise them. Scatters copy `data` once and write into the copy; the
input itself is never touched.
"""

from __future__ import annotations

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp


def _normalized(xp, indices, dim):
    """Indices with negatives counted from the end of an axis of length `dim`."""
    return xp.where(indices < 0, indices + dim, indices)


def _along_axis_index(xp, indices, axis):
    """A full fancy-index tuple addressing `indices`' own grid, with `indices` itself on `axis`."""
    grid = list(xp.ogrid[tuple(slice(0, d) for d in indices.shape)]) if indices.ndim else []
    grid[axis] = indices
    return tuple(grid)


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(kernel: Kernel):
    name = kernel.attr("reduction", "none")
    if name != "none" and name not in _REDUCTIONS:
        raise UnsupportedOp(f"{kernel.op_type} '{kernel.node.name}': unknown reduction {name!r}")
    return None if name == "none" else getattr(kernel.xp, _REDUCTIONS[name].__name__)


class Gather(Kernel):
    op_type = "Gather"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 0)

    def run(self, data, indices):
        return (self.xp.asarray(data.take(indices, axis=self.axis)),)  # 0-d result is a scalar


class GatherElements(Kernel):
    op_type = "GatherElements"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 0)

    def run(self, data, indices):
        axis = self.axis + data.ndim if self.axis < 0 else self.axis
        index = _normalized(self.xp, indices, data.shape[axis])
        return (self.xp.take_along_axis(data, index, axis=axis),)


class GatherND(Kernel):
    op_type = "GatherND"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.batch_dims = self.attr("batch_dims", 0)

    def run(self, data, indices):
        return (self.xp.asarray(data[_nd_index(self.xp, data, indices, self.batch_dims)]),)


def _nd_index(xp, data, indices, batch_dims):
    """The fancy index that GatherND/ScatterND address: leading batch dims pair up one to one."""
    depth = indices.shape[-1]
    parts = [indices[..., i] for i in range(depth)]
    if batch_dims == 0:
        return tuple(parts)
    # Each batch coordinate indexes itself; broadcast it against the per-batch index grid.
    batch = []
    extra = indices.ndim - 1 - batch_dims
    for axis in range(batch_dims):
        shape = [1] * (batch_dims + extra)
        shape[axis] = data.shape[axis]
        batch.append(xp.arange(data.shape[axis]).reshape(shape))
    return tuple(batch + parts)


class ScatterElements(Kernel):
    op_type = "ScatterElements"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 0)
        self.reduce = _reduction(self)

    def run(self, data, indices, updates):
        axis = self.axis + data.ndim if self.axis < 0 else self.axis
        out = data.copy()
        index = _along_axis_index(self.xp, _normalized(self.xp, indices, data.shape[axis]), axis)
        if self.reduce is None:
            out[index] = updates
        else:
            self.reduce.at(out, index, updates)
        return (out,)


class Scatter(ScatterElements):
    """Scatter (opsets 9-10) is ScatterElements under its old name."""

    op_type = "Scatter"
    since_version = 9


class ScatterND(Kernel):
    op_type = "ScatterND"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.reduce = _reduction(self)

    def run(self, data, indices, updates):
        out = data.copy()
        index = _nd_index(self.xp, data, indices, 0)
        if self.reduce is None:
            out[index] = updates
        else:
            self.reduce.at(out, index, updates)
        return (out,)


class TensorScatter(Kernel):
    """Writes `update` into a copy of a KV cache along `axis` (opset 24): batch b's rows go to
    positions write_indices[b] onwards (0 without write_indices), wrapping around the cache in
    "circular" mode. One fancy-indexed write per batch entry, not one per position."""

    op_type = "TensorScatter"
    since_version = 24

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", -2)
        self.mode = self.attr("mode", "linear")
        if self.mode not in ("linear", "circular"):
            raise UnsupportedOp(f"TensorScatter '{node.name}': unknown mode {self.mode!r}")

    def run(self, past_cache, update, write_indices=None):
        xp = self.xp
        axis = self.axis % past_cache.ndim
        if axis == 0:
            raise ValueError(f"TensorScatter '{self.node.name}': axis must not be the batch axis 0")
        capacity, length = past_cache.shape[axis], update.shape[axis]
        expected = past_cache.shape[:axis] + (length,) + past_cache.shape[axis + 1 :]
        if update.shape != expected or length > capacity:
            raise ValueError(
                f"TensorScatter '{self.node.name}': update {list(update.shape)} does not fit "
                f"cache {list(past_cache.shape)} along axis {axis}"
            )
        out = past_cache.copy()
        steps = xp.arange(length)
        for batch in range(past_cache.shape[0]):
            start = 0 if write_indices is None else int(write_indices[batch])
            positions = start + steps
            if self.mode == "circular":
                positions %= capacity
            elif start < 0 or start + length > capacity:
                raise ValueError(
                    f"TensorScatter '{self.node.name}': batch {batch} writes positions {start}.."
                    f"{start + length - 1} past the cache's {capacity}"
                )
            # one advanced index on the batch entry's view keeps its axes in place
            out[batch][(slice(None),) * (axis - 1) + (positions,)] = update[batch]
        return (out,)


class OneHot(Kernel):
    op_type = "OneHot"
    since_version = 9

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", -1)

    def run(self, indices, depth, values):
        xp = self.xp
        depth = int(depth.item())
        rank = indices.ndim + 1
        axis = self.axis + rank if self.axis < 0 else self.axis
        positions = _normalized(xp, indices.astype(np.int64), depth)
        classes = xp.arange(depth).reshape([depth if i == axis else 1 for i in range(rank)])
        hot = xp.expand_dims(positions, axis) == classes
        return (xp.where(hot, values[1], values[0]),)


class TopK_1(Kernel):
    op_type = "TopK"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.k = self.attr("k")
        self.axis = self.attr("axis", -1)

    def run(self, x):
        return _top_k(self.xp, x, self.k, self.axis, largest=True)


class TopK(Kernel):
    """TopK with k as an input (10) and largest/sorted (11). Results are always sorted, which
    `sorted=0` permits; equal values keep their original order, as ONNX requires."""

    op_type = "TopK"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", -1)
        self.largest = bool(self.attr("largest", 1))

    def run(self, x, k):
        return _top_k(self.xp, x, int(k.reshape(-1)[0]), self.axis, self.largest)


def _top_k(xp, x, k, axis, largest):
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if largest:
        # Stable ascending sort of the reversed axis, read backwards: descending values with
        # ties in ascending original position (negating would overflow unsigned/min ints).
        order = xp.argsort(xp.flip(x, axis), axis=axis, kind="stable")
        order = (n - 1) - xp.flip(order, axis)
    else:
        order = xp.argsort(x, axis=axis, kind="stable")
    indices = xp.take(order, xp.arange(k), axis=axis)
    return xp.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)


class NonZero(Kernel):
    op_type = "NonZero"
    since_version = 9

    def run(self, x):
        if x.ndim == 0:
            return (self.xp.zeros((0, int(bool(x))), dtype=np.int64),)
        return (self.xp.stack(self.xp.nonzero(x)).astype(np.int64),)


class Compress(Kernel):
    op_type = "Compress"
    since_version = 9

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis")

    def run(self, data, condition):
        # A condition shorter than the axis selects only from its prefix, as numpy's does.
        return (self.xp.compress(condition.astype(bool), data, axis=self.axis),)


class Unique(Kernel):
    op_type = "Unique"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis")
        self.sorted = bool(self.attr("sorted", 1))

    def run(self, x):
        xp = self.xp
        values, first, inverse, counts = xp.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=self.axis
        )
        inverse = inverse.reshape(-1)
        if not self.sorted:
            # Order by first occurrence instead, and renumber the inverse map to match.
            order = xp.argsort(first, kind="stable")
            rank = xp.empty_like(order)
            rank[order] = xp.arange(order.size)
            values = xp.take(values, order, axis=0 if self.axis is None else self.axis)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        as_int64 = np.int64
        return values, first.astype(as_int64), inverse.astype(as_int64), counts.astype(as_int64)


KERNELS = [
    Gather,
    GatherElements,
    GatherND,
    ScatterElements,
    Scatter,
    ScatterND,
    TensorScatter,
    OneHot,
    TopK_1,
    TopK,
    NonZero,
    Compress,
    Unique,
]
