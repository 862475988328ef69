"""GridSample (opsets 16 and 20+): sample an N-D image at the normalized positions of a grid.

For each spatial axis the grid's coordinates (stored last axis first: x, then y, then z)
become pixel coordinates, are folded back by the padding mode (border clamps, reflection
mirrors), and turn into taps — 1 for nearest, 2 for linear, 4 for cubic — each with a
weight and a validity flag (zeros padding: a tap off the image reads 0). The taps of all
axes combine into flat indices into the image's spatial extent; every combination is one
`take_along_axis` over all channels and output positions, so the work is (taps ** rank)
gathers of the output's size, with no per-pixel Python.

Coordinates are computed in the grid's dtype (float32 for float32 grids), as both the spec's
reference and ONNX Runtime do: a nearest-mode coordinate that lands on .5 rounds to even,
and float64 would move some of those ties. Opset 16's mode names (bilinear, bicubic) are
accepted as linear and cubic.
"""

from __future__ import annotations

import itertools

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp

_MODES = {
    "nearest": "nearest",
    "linear": "linear",
    "bilinear": "linear",
    "cubic": "cubic",
    "bicubic": "cubic",
}
_CUBIC_A = -0.75


def _reflect(x, low, high):
    """Mirror x into [low, high] by repeated reflection at the nearer border."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below, above = x < low, x > high
    distance = np.where(below, low - x, np.where(above, x - high, 0))
    flips = np.floor(distance / span)
    rest = distance - flips * span
    even = flips % 2 == 0
    from_low = np.where(even, low + rest, high - rest)
    from_high = np.where(even, high - rest, low + rest)
    return np.where(below, from_low, np.where(above, from_high, x))


def _cubic_weights(t):
    """Keys cubic convolution weights for taps at -1, 0, 1, 2 around a fraction t in [0, 1)."""
    a = _CUBIC_A

    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


class GridSample(Kernel):
    op_type = "GridSample"
    since_version = 16

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        where = f"GridSample '{node.name}'"
        mode = self.attr("mode", "bilinear" if opset < 20 else "linear")
        if mode not in _MODES:
            raise UnsupportedOp(f"{where}: unknown mode {mode!r}")
        self.mode = _MODES[mode]
        self.padding_mode = self.attr("padding_mode", "zeros")
        if self.padding_mode not in ("zeros", "border", "reflection"):
            raise UnsupportedOp(f"{where}: unknown padding_mode {self.padding_mode!r}")
        self.align_corners = bool(self.attr("align_corners", 0))

    def _axis_taps(self, normalized, size):
        """(indices, weights, valid) lists, one entry per tap, each shaped like `normalized`."""
        if self.align_corners:
            x = (normalized + 1) / 2 * (size - 1)
            low, high = 0.0, size - 1.0
        else:
            x = ((normalized + 1) * size - 1) / 2
            low, high = -0.5, size - 0.5
        if self.mode == "nearest":
            x = np.rint(x)  # half to even, as PyTorch's grid_sample
        # Border padding clamps the coordinate for nearest and linear (where clamping it or its
        # taps reads the same pixels), but for cubic only the taps are clamped: that is what
        # PyTorch and ONNX Runtime compute; the spec's reference also clamps coordinates that
        # fall outside [low, high], which no conformance case exercises.
        if self.padding_mode == "border" and self.mode != "cubic":
            x = np.clip(x, 0, size - 1)
        elif self.padding_mode == "reflection":
            x = _reflect(x, low, high)
        if self.mode == "nearest":
            offsets, base, weights = [0], np.trunc(x), [np.ones_like(x)]
        else:
            base = np.floor(x)
            t = x - base
            if self.mode == "linear":
                offsets, weights = [0, 1], [1 - t, t]
            else:
                offsets, weights = [-1, 0, 1, 2], _cubic_weights(t)
        indices, valid = [], []
        for offset in offsets:
            index = base + offset
            if self.padding_mode == "zeros":
                valid.append((index >= 0) & (index < size))
            elif self.padding_mode == "border":
                index = np.clip(index, 0, size - 1)
                valid.append(None)
            else:
                index = np.trunc(_reflect(index, low, high))
                valid.append(None)
            indices.append(np.clip(index, 0, size - 1).astype(np.intp))
        return indices, weights, valid

    def run(self, x, grid):
        xp = self.xp
        dtype = x.dtype
        n, c, *sizes = x.shape
        rank = len(sizes)
        if grid.ndim != rank + 2 or grid.shape[0] != n or grid.shape[-1] != rank:
            raise ValueError(
                f"GridSample '{self.node.name}': grid {list(grid.shape)} must be [{n}, *output, {rank}] "
                f"for input {list(x.shape)}"
            )
        out_spatial = grid.shape[1:-1]
        positions = int(np.prod(out_spatial))
        # Taps are planned on the host (a few small arrays per axis), then gathered by xp.
        coordinates = self.backend.to_host(grid).reshape(n, positions, rank)
        if coordinates.dtype not in (np.float32, np.float64):
            coordinates = coordinates.astype(np.float32)
        # grid's last axis lists x (the innermost spatial axis) first.
        per_axis = [
            self._axis_taps(coordinates[..., rank - 1 - axis], size) for axis, size in enumerate(sizes)
        ]
        strides = [int(np.prod(sizes[axis + 1 :])) for axis in range(rank)]
        compute = np.float32 if dtype in (np.float16,) else dtype
        flat = x.reshape(n, c, -1).astype(compute, copy=False)
        y = xp.zeros((n, c, positions), dtype=compute)
        for combination in itertools.product(*(range(len(taps[0])) for taps in per_axis)):
            index = np.zeros((n, positions), dtype=np.intp)
            weight = np.ones((n, positions), dtype=coordinates.dtype)
            for axis, tap in enumerate(combination):
                indices, weights, valid = per_axis[axis]
                index += indices[tap] * strides[axis]
                weight = weight * weights[tap]
                if valid[tap] is not None:
                    weight = np.where(valid[tap], weight, 0)
            gathered = xp.take_along_axis(flat, xp.asarray(index)[:, None, :], axis=2)
            y += gathered * xp.asarray(weight.astype(compute))[:, None, :]
        return (y.reshape(n, c, *out_spatial).astype(dtype, copy=False),)


KERNELS = [
    GridSample,
]
