"""Tensor-shaping kernels: ops that move, copy or make data without arithmetic on it.

Most of these return views of their input (Reshape, Transpose, Squeeze, Expand, Slice, Split,
Identity). That is safe because no kernel ever writes into an input array, and it is what
keeps a transformer's many Reshape/Transpose nodes almost free.

Where ONNX moved an attribute to an input (Squeeze/Unsqueeze axes at 13, Slice at 10, Pad at 11,
Split at 13), the older form is its own class with an `_<version>` suffix, so the class that
runs is exactly the schema the model was written against.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, ShapeMemo, UnsupportedOp


def ints(array) -> list[int]:
    """A shape/axes/indices input (1-D, or 0-d as ONNX's own Loop cases write axes) as Python ints."""
    if array.dtype.kind in "iu":  # tolist gives Python ints already: no per-item conversion
        values = array.tolist()
        return values if isinstance(values, list) else [values]
    return [int(v) for v in array.reshape(-1).tolist()]


def _output_wanted(node: ir.Node, index: int) -> bool:
    """Whether an optional output is present: ONNX omits one by giving it an empty name."""
    return index < len(node.outputs) and bool(node.outputs[index].name)


# ---------------------------------------------------------------- reshaping


class Reshape_1(Kernel):
    op_type = "Reshape"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.shape = self.attr("shape", [])

    def run(self, data):
        shape = [data.shape[i] if s == 0 else s for i, s in enumerate(self.shape)]
        return (data.reshape(shape),)


class Reshape(Kernel):
    op_type = "Reshape"
    since_version = 5

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        # allowzero (opset 14): a 0 in `shape` means a zero-sized dimension, not "copy this one".
        self.allowzero = bool(self.attr("allowzero", 0))
        self._dims: list[int] | None = None  # a constant `shape`
        self._targets = ShapeMemo()

    def bind_constants(self, constants):
        if constants[1] is not None:
            self._dims = ints(constants[1])

    def run(self, data, shape):
        if self._dims is None:
            return (data.reshape(self._target(data.shape, ints(shape))),)
        target = self._targets.get(data.shape)
        if target is None:
            target = self._targets.keep(data.shape, self._target(data.shape, self._dims))
        return (data.reshape(target),)

    def _target(self, data_shape, dims):
        if self.allowzero or 0 not in dims:
            return dims
        return [data_shape[i] if d == 0 else d for i, d in enumerate(dims)]


class Flatten(Kernel):
    op_type = "Flatten"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 1)

    def run(self, data):
        axis = self.axis + data.ndim if self.axis < 0 else self.axis
        # Both sizes spelled out: reshape(-1) is ambiguous when the tensor is empty.
        return (data.reshape(math.prod(data.shape[:axis]), math.prod(data.shape[axis:])),)


class Squeeze_1(Kernel):
    op_type = "Squeeze"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        axes = self.attr("axes")
        self.axes = None if axes is None else tuple(axes)

    def run(self, data):
        return (_squeeze(self.xp, data, self.axes),)


class Squeeze(Kernel):
    op_type = "Squeeze"
    since_version = 13

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._constant_axes = len(node.inputs) < 2 or node.inputs[1] is None
        self._shapes = ShapeMemo()

    def bind_constants(self, constants):
        self._constant_axes = len(constants) < 2 or constants[1] is not None

    def run(self, data, axes=None):
        if self._constant_axes:
            shape = self._shapes.get(data.shape)
            if shape is not None:
                return (data.reshape(shape),)
        y = _squeeze(self.xp, data, None if axes is None else tuple(ints(axes)))
        if self._constant_axes:
            self._shapes.keep(data.shape, y.shape)
        return (y,)


def _squeeze(xp, data, axes):
    if axes is None:
        axes = tuple(i for i, d in enumerate(data.shape) if d == 1)
    return xp.squeeze(data, axis=axes)


class Unsqueeze_1(Kernel):
    op_type = "Unsqueeze"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axes = list(self.attr("axes"))
        self._shapes = ShapeMemo()

    def run(self, data):
        shape = self._shapes.get(data.shape)
        if shape is None:
            shape = self._shapes.keep(data.shape, _unsqueezed(data.shape, self.axes))
        return (data.reshape(shape),)


class Unsqueeze(Kernel):
    op_type = "Unsqueeze"
    since_version = 13

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._axes: list[int] | None = None  # constant axes
        self._shapes = ShapeMemo()

    def bind_constants(self, constants):
        if constants[1] is not None:
            self._axes = ints(constants[1])

    def run(self, data, axes):
        if self._axes is None:
            return (data.reshape(_unsqueezed(data.shape, ints(axes))),)
        shape = self._shapes.get(data.shape)
        if shape is None:
            shape = self._shapes.keep(data.shape, _unsqueezed(data.shape, self._axes))
        return (data.reshape(shape),)


def _unsqueezed(data_shape, axes) -> tuple[int, ...]:
    # Axes count in the output's rank, so new dimensions are placed in ascending order.
    rank = len(data_shape) + len(axes)
    shape = list(data_shape)
    for axis in sorted(a + rank if a < 0 else a for a in axes):
        shape.insert(axis, 1)
    return tuple(shape)


class Transpose(Kernel):
    op_type = "Transpose"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        perm = self.attr("perm")
        self.perm = None if perm is None else tuple(perm)

    def run(self, data):
        return (self.xp.transpose(data, self.perm),)


class DepthToSpace(Kernel):
    op_type = "DepthToSpace"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.block = self.attr("blocksize")
        self.mode = self.attr("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise UnsupportedOp(f"DepthToSpace '{node.name}': unknown mode {self.mode!r}")

    def run(self, x):
        n, c, h, w = x.shape
        b = self.block
        if self.mode == "DCR":
            t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return (t.reshape(n, c // (b * b), h * b, w * b),)


class SpaceToDepth(Kernel):
    op_type = "SpaceToDepth"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.block = self.attr("blocksize")
        # mode (opset 24 era): DCR puts the block offset outermost in the channel, CRD innermost.
        self.mode = self.attr("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise UnsupportedOp(f"SpaceToDepth '{node.name}': unknown mode {self.mode!r}")

    def run(self, x):
        n, c, h, w = x.shape
        b = self.block
        t = x.reshape(n, c, h // b, b, w // b, b)
        t = t.transpose(0, 3, 5, 1, 2, 4) if self.mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
        return (t.reshape(n, c * b * b, h // b, w // b),)


# ---------------------------------------------------------------- joining and splitting


class Concat(Kernel):
    op_type = "Concat"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 1)  # opset 1 defaulted to 1; later opsets require it

    def run(self, *inputs):
        return (self.xp.concatenate(inputs, axis=self.axis),)


class Split(Kernel):
    """Split, every opset: `split` sizes from the attribute (<13) or the second input (>=13);
    otherwise equal parts, one per output, or `num_outputs` (18) parts with a short last one."""

    op_type = "Split"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 0)
        self.split = self.attr("split")
        self.parts = self.attr("num_outputs", len(node.outputs))
        self._sizes_constant = len(node.inputs) < 2 or node.inputs[1] is None
        self._indices = ShapeMemo()

    def bind_constants(self, constants):
        self._sizes_constant = len(constants) < 2 or constants[1] is not None

    def run(self, data, split=None):
        if self._sizes_constant:
            indices = self._indices.get(data.shape)
            if indices is not None:
                return tuple(data[index] for index in indices)
        parts = self._split(data, split)
        if self._sizes_constant:
            self._indices.keep(data.shape, _part_indices(data.ndim, self.axis, [part.shape for part in parts]))
        return parts

    def _split(self, data, split):
        axis = self.axis + data.ndim if self.axis < 0 else self.axis
        sizes = ints(split) if split is not None else self.split
        dim = data.shape[axis]
        if sizes is None:
            chunk = -(-dim // self.parts)
            sizes = [min(chunk, dim - i * chunk) for i in range(self.parts)]
        if sum(sizes) != dim:
            raise ValueError(
                f"Split '{self.node.name}': split sizes {sizes} do not add up to dimension {dim} of axis {axis}"
            )
        bounds = np.cumsum(sizes)[:-1].tolist()
        return tuple(self.xp.split(data, bounds, axis=axis))


def _part_indices(rank: int, axis: int, shapes) -> tuple[tuple[slice, ...], ...]:
    """The index of each of Split's parts in its input, from the parts' shapes."""
    axis = axis + rank if axis < 0 else axis
    indices, start = [], 0
    for shape in shapes:
        indices.append((slice(None),) * axis + (slice(start, start + shape[axis]),))
        start += shape[axis]
    return tuple(indices)


# ---------------------------------------------------------------- slicing


def _slice_tuple(shape, starts, ends, axes, steps):
    """Python slices for ONNX Slice: clamp per ONNX, and turn "before index 0" into None."""
    index = [slice(None)] * len(shape)
    if axes is None:
        axes = range(len(starts))
    if steps is None:
        steps = [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if axis < 0:
            axis += len(shape)
        dim = shape[axis]
        if start < 0:
            start += dim
        if end < 0:
            end += dim
        if step > 0:
            start = min(max(start, 0), dim)
            end = min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:
            start = min(max(start, 0), dim - 1)
            end = min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


class Slice_1(Kernel):
    op_type = "Slice"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.starts = self.attr("starts")
        self.ends = self.attr("ends")
        self.axes = self.attr("axes")

    def run(self, data):
        return (data[_slice_tuple(data.shape, self.starts, self.ends, self.axes, None)],)


class Slice(Kernel):
    op_type = "Slice"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._bounds_constant = False
        self._indices = ShapeMemo()

    def bind_constants(self, constants):
        # starts, ends and the optional axes and steps: constant or omitted
        self._bounds_constant = all(
            value is not None or position >= len(self.node.inputs) or self.node.inputs[position] is None
            for position, value in enumerate(constants[1:], start=1)
        )

    def run(self, data, starts, ends, axes=None, steps=None):
        if self._bounds_constant:
            index = self._indices.get(data.shape)
            if index is not None:
                return (data[index],)
        index = _slice_tuple(
            data.shape,
            ints(starts),
            ints(ends),
            None if axes is None else ints(axes),
            None if steps is None else ints(steps),
        )
        if self._bounds_constant:
            self._indices.keep(data.shape, index)
        return (data[index],)


# ---------------------------------------------------------------- broadcasting and padding


class Expand(Kernel):
    op_type = "Expand"
    since_version = 8

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._targets = ShapeMemo()

    def run(self, data, shape):
        # A read-only broadcast view: consumers never write into inputs, so no copy is needed.
        key = (data.shape, shape.tobytes())
        target = self._targets.get(key)
        if target is None:
            target = self._targets.keep(key, np.broadcast_shapes(data.shape, tuple(ints(shape))))
        return (self.xp.broadcast_to(data, target),)


class Tile(Kernel):
    op_type = "Tile"
    since_version = 6

    def run(self, data, repeats):
        return (self.xp.tile(data, ints(repeats)),)


_NUMPY_PAD_MODE = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(xp, data, pads, mode, value, axes=None):
    rank = data.ndim
    if axes is None:
        axes = range(rank)
    n = len(pads) // 2
    begin = [0] * rank
    end = [0] * rank
    for i, axis in enumerate(axes):
        axis = axis + rank if axis < 0 else axis
        begin[axis], end[axis] = pads[i], pads[i + n]
    # Negative pads crop; do that first so numpy only ever sees non-negative widths.
    if any(p < 0 for p in begin + end):
        crop = tuple(
            slice(max(-b, 0), dim - max(-e, 0)) for b, e, dim in zip(begin, end, data.shape, strict=True)
        )
        data = data[crop]
        begin = [max(b, 0) for b in begin]
        end = [max(e, 0) for e in end]
    widths = list(zip(begin, end, strict=True))
    if mode == "constant":
        out = xp.full(
            tuple(d + b + e for d, b, e in zip(data.shape, begin, end, strict=True)), value, dtype=data.dtype
        )
        out[tuple(slice(b, b + d) for b, d in zip(begin, data.shape, strict=True))] = data
        return out
    return xp.pad(data, widths, mode=_NUMPY_PAD_MODE[mode])


class Pad_1(Kernel):
    """Pad before opset 11: `pads` (called `paddings` at opset 1) and `value` are attributes."""

    op_type = "Pad"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.pads = self.attr("pads", self.attr("paddings"))
        self.mode = _pad_mode(node, self.attr("mode", "constant"))
        self.value = self.attr("value", 0.0)

    def run(self, data):
        return (_pad(self.xp, data, self.pads, self.mode, self.value),)


class Pad(Kernel):
    op_type = "Pad"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.mode = _pad_mode(node, self.attr("mode", "constant"))

    def run(self, data, pads, constant_value=None, axes=None):
        value = 0 if constant_value is None or constant_value.size == 0 else constant_value.item()
        return (_pad(self.xp, data, ints(pads), self.mode, value, None if axes is None else ints(axes)),)


def _pad_mode(node, mode):
    if mode not in _NUMPY_PAD_MODE:
        raise UnsupportedOp(f"Pad '{node.name}': unknown mode {mode!r}")
    return mode


class Trilu(Kernel):
    op_type = "Trilu"
    since_version = 14

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.upper = bool(self.attr("upper", 1))

    def run(self, x, k=None):
        diagonal = 0 if k is None else int(k.item())
        return ((self.xp.triu if self.upper else self.xp.tril)(x, diagonal),)


# ---------------------------------------------------------------- pass-through


class Identity(Kernel):
    op_type = "Identity"
    since_version = 1

    def run(self, x):
        return (x,)


class Dropout(Kernel):
    """Inference Dropout: the identity, plus an all-keep mask when one is asked for.

    Training mode (opset 12+, `training_mode` input true) drops with numpy's RandomState: seeded
    by the `seed` attribute it gives the same mask on every run (as ONNX's reference cases
    expect); unseeded, a fresh one each run. Opset < 7 training mode (is_test=0) is refused.
    """

    op_type = "Dropout"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.want_mask = _output_wanted(node, 1)
        # Before opset 10 the mask had the data's type; from 10 it is bool.
        self.mask_is_bool = opset >= 10
        self.seed = self.attr("seed")
        if opset < 7 and self.attr("is_test", 0) == 0 and self.attr("ratio", 0.5) != 0:
            raise UnsupportedOp(f"Dropout '{node.name}': training mode (is_test=0) is random")

    def run(self, data, ratio=None, training_mode=None):
        drop = 0.5 if ratio is None else float(ratio)
        if training_mode is not None and bool(training_mode) and drop != 0.0:
            keep = np.random.RandomState(self.seed).uniform(0.0, 1.0, data.shape) >= drop
            keep = self.backend.from_host(keep)
            output = (data * keep / data.dtype.type(1.0 - drop)).astype(data.dtype, copy=False)
            return (
                (output, keep if self.mask_is_bool else keep.astype(data.dtype))
                if self.want_mask
                else (output,)
            )
        if not self.want_mask:
            return (data,)
        mask = self.xp.ones(data.shape, dtype=bool if self.mask_is_bool else data.dtype)
        return (data, mask)


class ReverseSequence(Kernel):
    """Reverse the first sequence_lens[i] items of each batch entry along time_axis."""

    op_type, since_version = "ReverseSequence", 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.batch_axis = self.attr("batch_axis", 1)
        self.time_axis = self.attr("time_axis", 0)

    def run(self, x, sequence_lens):
        xp = self.xp
        lengths = self.backend.to_host(sequence_lens).astype(np.int64).reshape(-1)
        steps = np.arange(x.shape[self.time_axis])[:, None]
        order = np.where(steps < lengths[None, :], lengths[None, :] - 1 - steps, steps)  # [time, batch]
        if self.time_axis > self.batch_axis:
            order = order.T
        shape = [1] * x.ndim
        shape[self.time_axis], shape[self.batch_axis] = x.shape[self.time_axis], x.shape[self.batch_axis]
        index = xp.asarray(order.reshape(shape))
        return (xp.take_along_axis(x, xp.broadcast_to(index, x.shape), axis=self.time_axis),)


class CenterCropPad(Kernel):
    """Each of `axes` (all by default) cropped or zero-padded to `shape`, about its centre (opset
    18); an odd difference leaves the extra element at the end, as the spec's function does."""

    op_type = "CenterCropPad"
    since_version = 18

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axes = self.attr("axes")

    def run(self, x, shape):
        axes = range(x.ndim) if self.axes is None else [a % x.ndim for a in self.axes]
        out_shape = list(x.shape)
        source = [slice(None)] * x.ndim
        target = [slice(None)] * x.ndim
        for axis, size in zip(axes, shape.tolist(), strict=True):
            have = x.shape[axis]
            start = abs(have - size) // 2
            if size < have:
                source[axis] = slice(start, start + size)
            elif size > have:
                target[axis] = slice(start, start + have)
            out_shape[axis] = size
        out = self.xp.zeros(out_shape, dtype=x.dtype)
        out[tuple(target)] = x[tuple(source)]
        return (out,)


KERNELS = [
    Reshape_1,
    Reshape,
    Flatten,
    Squeeze_1,
    Squeeze,
    Unsqueeze_1,
    Unsqueeze,
    Transpose,
    DepthToSpace,
    SpaceToDepth,
    Concat,
    Split,
    Slice_1,
    Slice,
    Expand,
    Tile,
    Pad_1,
    Pad,
    Trilu,
    Identity,
    Dropout,
    ReverseSequence,
    CenterCropPad,
]
