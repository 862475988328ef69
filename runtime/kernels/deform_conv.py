"""DeformConv (opset 19+): convolution whose kernel taps sample the input at learned offsets.

It is Conv's im2col with a different column builder. Each output position's kernel tap
reads the input at (regular tap position + its offset), a fractional point, by bilinear
interpolation with zeros outside the image, then is scaled by the optional mask. The columns
[N, C*K, P] are built with one gather per interpolation corner (2 ** rank of them) over all
channels of an offset group at once, and then multiplied by the weights in one batched GEMM
per group, exactly as conv.py's Conv does after im2col.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel


class DeformConv(Kernel):
    op_type = "DeformConv"
    since_version = 19

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.where = f"DeformConv '{node.name}'"
        self.group = self.attr("group", 1)
        self.offset_group = self.attr("offset_group", 1)
        self.dilations = self.attr("dilations")
        self.strides = self.attr("strides")
        self.pads = self.attr("pads")

    def run(self, x, w, offset, b=None, mask=None):
        xp = self.xp
        dtype = x.dtype
        compute = np.float32 if dtype == np.float16 else dtype
        x, w, offset = (a.astype(compute, copy=False) for a in (x, w, offset))
        n, c, *sizes = x.shape
        m, cg, *kernel = w.shape
        rank = len(kernel)
        out = list(offset.shape[2:])
        groups, offset_groups = self.group, self.offset_group
        taps = math.prod(kernel)
        positions = math.prod(out)
        if cg * groups != c or c % offset_groups or offset.shape[1] != offset_groups * taps * rank:
            raise ValueError(
                f"{self.where}: X {list(x.shape)}, W {list(w.shape)} and offset {list(offset.shape)} do not fit "
                f"group {groups}, offset_group {offset_groups}"
            )
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        pads = self.pads or [0] * (2 * rank)
        begin = pads[:rank]
        expected = [
            (size + pads[i] + pads[i + rank] - (k - 1) * d - 1) // s + 1
            for i, (size, k, d, s) in enumerate(zip(sizes, kernel, dilations, strides, strict=True))
        ]
        if expected != out:
            raise ValueError(
                f"{self.where}: offset is {'x'.join(map(str, out))} per position, the output is "
                f"{'x'.join(map(str, expected))} for these pads, strides and dilations"
            )

        # Sampling points [N, offset_groups, taps, positions] per axis: the regular grid plus offsets.
        offset = offset.reshape(n, offset_groups, taps, rank, positions)
        tap_grid = np.stack(np.meshgrid(*(np.arange(k) for k in kernel), indexing="ij"), axis=-1).reshape(
            taps, rank
        )
        out_grid = np.stack(np.meshgrid(*(np.arange(o) for o in out), indexing="ij"), axis=-1).reshape(
            positions, rank
        )
        points = []
        for axis in range(rank):
            regular = (
                out_grid[:, axis][None, :] * strides[axis]
                - begin[axis]
                + tap_grid[:, axis][:, None] * dilations[axis]
            )
            points.append(xp.asarray(regular.astype(compute)) + offset[:, :, :, axis, :])

        cpo = c // offset_groups
        flat = x.reshape(n, offset_groups, cpo, math.prod(sizes))
        columns = xp.zeros((n, offset_groups, cpo, taps * positions), dtype=compute)
        lows = [xp.floor(p) for p in points]
        for corner in itertools.product((0, 1), repeat=rank):
            index = xp.zeros(points[0].shape, dtype=np.int64)
            weight = xp.ones(points[0].shape, dtype=compute)
            for axis, step in enumerate(corner):
                tap = lows[axis] + step
                fraction = points[axis] - lows[axis]
                weight = weight * (fraction if step else 1 - fraction)
                inside = (tap >= 0) & (tap <= sizes[axis] - 1)
                weight = xp.where(inside, weight, 0)
                clamped = xp.clip(tap, 0, sizes[axis] - 1).astype(np.int64)
                index = index * sizes[axis] + clamped
            gathered = xp.take_along_axis(flat, index.reshape(n, offset_groups, 1, -1), axis=3)
            columns += gathered * weight.reshape(n, offset_groups, 1, -1)
        if mask is not None:
            columns *= mask.astype(compute, copy=False).reshape(n, offset_groups, 1, taps * positions)

        # [N, C, taps, P] -> per group [N, G, C/G * taps, P], then Conv's GEMM.
        columns = columns.reshape(n, groups, cg * taps, positions)
        y = xp.matmul(w.reshape(groups, m // groups, cg * taps), columns).reshape(n, m, positions)
        if b is not None:
            y += b.astype(compute, copy=False).reshape(m, 1)
        return (y.reshape(n, m, *out).astype(dtype, copy=False),)


KERNELS = [
    DeformConv,
]
