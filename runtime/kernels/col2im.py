"""Col2Im (opset 18): fold sliding-block columns back into an image, summing overlaps.

The inverse of im2col (PyTorch's `fold`). Input [N, C * prod(block), L] holds, for each of
the L block positions, every block tap of every channel. Each tap is one strided slice of
the padded output, so the fold is prod(block) whole-array additions — the same col2im step
ConvTranspose in conv.py ends with — and the padding is cropped off at the end.
"""

from __future__ import annotations

import itertools
import math

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel


class Col2Im(Kernel):
    op_type = "Col2Im"
    since_version = 18

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.dilations = self.attr("dilations")
        self.strides = self.attr("strides")
        self.pads = self.attr("pads")

    def run(self, x, image_shape, block_shape):
        xp = self.xp
        to_host = self.backend.to_host
        image = [int(v) for v in to_host(image_shape).reshape(-1)]
        block = [int(v) for v in to_host(block_shape).reshape(-1)]
        rank = len(image)
        dilations = self.dilations or [1] * rank
        strides = self.strides or [1] * rank
        pads = self.pads or [0] * (2 * rank)
        n, channels_taps, positions = x.shape
        taps = math.prod(block)
        blocks_per_axis = [
            (size + pads[i] + pads[i + rank] - (k - 1) * d - 1) // s + 1
            for i, (size, k, d, s) in enumerate(zip(image, block, dilations, strides, strict=True))
        ]
        if channels_taps % taps or math.prod(blocks_per_axis) != positions:
            raise ValueError(
                f"Col2Im '{self.node.name}': input {list(x.shape)} does not hold blocks {block} "
                f"sliding over image {image} ({blocks_per_axis} positions, pads {pads}, strides {strides}, "
                f"dilations {dilations})"
            )
        c = channels_taps // taps
        columns = x.reshape(n, c, *block, *blocks_per_axis)
        padded = xp.zeros((n, c, *(size + pads[i] + pads[i + rank] for i, size in enumerate(image))), x.dtype)
        for tap in itertools.product(*(range(k) for k in block)):
            region = tuple(
                slice(t * d, t * d + s * (count - 1) + 1, s)
                for t, d, s, count in zip(tap, dilations, strides, blocks_per_axis, strict=True)
            )
            padded[(slice(None), slice(None), *region)] += columns[(slice(None), slice(None), *tap)]
        crop = tuple(slice(pads[i], pads[i] + size) for i, size in enumerate(image))
        return (xp.ascontiguousarray(padded[(slice(None), slice(None), *crop)]),)


KERNELS = [
    Col2Im,
]
