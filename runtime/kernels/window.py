"""The spectral window generators (opset 17): Hann, Hamming and Blackman windows of a given size.

Each is a sum of cosines of 2*pi*n/N, where N is the size (periodic, the default: the window
of size + 1 without its last point, as a DFT frame wants) or size - 1 (symmetric). Computed in
float64 and cast to `output_datatype` (float32 unless said).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel


class _Window(Kernel):
    since_version = 17
    # w[n] = sum(c_k * cos(2 * pi * k * n / N)) over k
    coefficients: tuple[float, ...] = ()

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.periodic = bool(self.attr("periodic", 1))
        self.dtype = ir.DataType(self.attr("output_datatype", 1)).numpy()

    def run(self, size):
        count = int(size)
        period = count if self.periodic else count - 1
        n = np.arange(count, dtype=np.float64)
        window = np.zeros(count)
        for k, c in enumerate(self.coefficients):
            window += c * np.cos(2 * math.pi * k * n / period) if k else c
        return (self.xp.asarray(window.astype(self.dtype)),)


class HannWindow(_Window):
    op_type, coefficients = "HannWindow", (0.5, -0.5)  # sin^2(pi n / N)


class HammingWindow(_Window):
    op_type, coefficients = "HammingWindow", (25 / 46, -(1 - 25 / 46))


class BlackmanWindow(_Window):
    op_type, coefficients = "BlackmanWindow", (0.42, -0.5, 0.08)


KERNELS = [HannWindow, HammingWindow, BlackmanWindow]
