"""com.microsoft activation kernels: Gelu, BiasGelu, FastGelu, QuickGelu.

These exist to be cheaper than the chains they replace (Add -> Div -> Erf -> Add -> Mul -> Mul
for BiasGelu), so each one allocates only its output and at most one scratch buffer, and does
every step as an in-place ufunc (`out=`) on them. The ONNX-domain Gelu lives in activation.py.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel
from runtime.kernels.erf import erf_scaled

MS = "com.microsoft"
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _exact_gelu(xp, x, out, scratch):
    """0.5 * x * (1 + erf(x / sqrt(2))) into `out`; `x` is only read."""
    erf_scaled(xp, x, _SQRT_HALF, out, scratch)
    dtype = out.dtype.type
    out += dtype(1.0)
    out *= x
    out *= dtype(0.5)
    return out


class Gelu(Kernel):
    op_type = "Gelu"
    domain = MS
    since_version = 1

    def run(self, x):
        return (_exact_gelu(self.xp, x, self.xp.empty_like(x), self.xp.empty_like(x)),)


class BiasGelu(Kernel):
    op_type = "BiasGelu"
    domain = MS
    since_version = 1

    def run(self, a, bias):
        x = self.xp.add(a, bias)  # the one fresh temporary; everything after is in place
        return (_exact_gelu(self.xp, x, self.xp.empty_like(x), self.xp.empty_like(x)),)


class FastGelu(Kernel):
    """The tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    op_type = "FastGelu"
    domain = MS
    since_version = 1

    def run(self, x, bias=None):
        xp = self.xp
        if bias is not None:
            x = xp.add(x, bias)
        dtype = x.dtype.type
        y = xp.multiply(x, x)
        # sqrt(2/pi) (x + 0.044715 x^3) = x (c + c*0.044715 x^2): one multiply-add, one multiply.
        y *= dtype(_SQRT_2_OVER_PI * 0.044715)
        y += dtype(_SQRT_2_OVER_PI)
        y *= x
        xp.tanh(y, out=y)
        y += dtype(1.0)
        y *= x
        y *= dtype(0.5)
        return (y,)


class QuickGelu(Kernel):
    """x * sigmoid(alpha x), written as x / (1 + exp(-alpha x)) to need one buffer."""

    op_type = "QuickGelu"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 1.702))

    def run(self, x):
        xp = self.xp
        dtype = x.dtype.type
        y = xp.multiply(x, dtype(-self.alpha))
        # exp overflows to inf for very negative alpha x; x / inf = 0 is the right limit.
        with np.errstate(over="ignore"):
            xp.exp(y, out=y)
        y += dtype(1.0)
        xp.divide(x, y, out=y)
        return (y,)


KERNELS = [Gelu, BiasGelu, FastGelu, QuickGelu]
