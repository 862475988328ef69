"""com.microsoft activation kernels: Gelu, BiasGelu, FastGelu, QuickGelu.

These exist to be cheaper than the chains they replace (Add -> Div -> Erf -> Add -> Mul -> Mul
for BiasGelu). On numpy float32 with the usual layout (contiguous, bias over the last axis) the
Gelus run one compiled pass (runtime/kernels/compiled.py), 4x (FastGelu) to 13x (BiasGelu) faster than the
in-place ufunc sequence below, which remains the path for other dtypes, layouts and backends:
it allocates only the output and does every later step in place (`out=`). On the CUDA backend,
float32 and float16 take one elementwise launch each (runtime/kernels/cuda_fused.py) instead
of that sequence's six. The ONNX-domain Gelu lives in activation.py.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels import compiled, cuda_fused
from runtime.kernels.base import Kernel
from runtime.kernels.erf_fit import erf

MS = "com.microsoft"
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _as_rows(x):
    """(..., W) as a (rows, W) view; compiled loops take 2-D rows."""
    return x.reshape(-1, x.shape[-1])


def _bias_fits(x, bias):
    """The compiled loops add a 1-D bias over the last axis, the layout ORT's fusions produce."""
    return x.ndim >= 1 and bias.shape == (x.shape[-1],)


def _exact_gelu(xp, x):
    """0.5 * x * (1 + erf(x / sqrt(2))) into a fresh array; `x` is only read."""
    out = erf(xp, x * x.dtype.type(_SQRT_HALF))
    dtype = out.dtype.type
    out += dtype(1.0)
    out *= x
    out *= dtype(0.5)
    return out


def _tanh_gelu(xp, x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) into a fresh array; `x` is only read."""
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
    return y


class Gelu(Kernel):
    op_type = "Gelu"
    domain = MS
    since_version = 1

    def run(self, x):
        if compiled.accepts(self.xp, x) and x.ndim >= 1:
            out = np.empty_like(x)
            compiled.gelu_rows(_as_rows(x), _as_rows(out))
            return (out,)
        if self.on_cuda and cuda_fused.gelu_accepts(x):
            return (cuda_fused.gelu(x),)
        return (_exact_gelu(self.xp, x),)


class BiasGelu(Kernel):
    op_type = "BiasGelu"
    domain = MS
    since_version = 1

    def run(self, a, bias):
        if compiled.accepts(self.xp, a, bias) and _bias_fits(a, bias):
            out = np.empty_like(a)
            compiled.bias_gelu_rows(_as_rows(a), bias, _as_rows(out))
            return (out,)
        if self.on_cuda and cuda_fused.gelu_accepts(a, bias):
            return (cuda_fused.gelu(a, bias),)
        return (_exact_gelu(self.xp, self.xp.add(a, bias)),)


class FastGelu(Kernel):
    """The tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    op_type = "FastGelu"
    domain = MS
    since_version = 1

    def run(self, x, bias=None):
        xp = self.xp
        if bias is None and compiled.accepts(xp, x) and x.ndim >= 1:
            out = np.empty_like(x)
            compiled.fast_gelu_rows(_as_rows(x), _as_rows(out))
            return (out,)
        if bias is not None and compiled.accepts(xp, x, bias) and _bias_fits(x, bias):
            out = np.empty_like(x)
            compiled.bias_fast_gelu_rows(_as_rows(x), bias, _as_rows(out))
            return (out,)
        if self.on_cuda and cuda_fused.gelu_accepts(x, bias):
            return (cuda_fused.gelu(x, bias, tanh=True),)
        return (_tanh_gelu(xp, x if bias is None else xp.add(x, bias)),)


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
        if self.on_cuda and cuda_fused.gelu_accepts(x):
            return (cuda_fused.quick_gelu(x, self.alpha),)
        dtype = x.dtype.type
        y = xp.multiply(x, dtype(-self.alpha))
        # exp overflows to inf for very negative alpha x; x / inf = 0 is the right limit.
        with np.errstate(over="ignore"):
            xp.exp(y, out=y)
        y += dtype(1.0)
        xp.divide(x, y, out=y)
        return (y,)


KERNELS = [Gelu, BiasGelu, FastGelu, QuickGelu]
