"""Activation kernels: the ReLU and sigmoid families, Gelu, Mish, and the softmax family.

Formulas are arranged so nothing overflows on the way to a finite answer (no exp of a large
positive number), since a numpy overflow warning in a model run is noise at best. Work
happens in place only on arrays the kernel itself allocated, never on its inputs.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels import compiled, cuda_fused
from runtime.kernels.base import Kernel, ShapeMemo
from runtime.kernels.erf_fit import erf

# ml_dtypes' bfloat16 turns `x * 0.5` into float32, and a formula evaluated one rounding per
# step in 16 bits drifts from one rounded once; so 16-bit floats are computed in float32.
_NARROW_FLOATS = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


class Formula(Kernel):
    """A kernel whose `formula(x)` is evaluated in float32 for 16-bit floats, and whose
    result comes back in x's dtype."""

    def formula(self, x):
        raise NotImplementedError

    def run(self, x):
        if x.dtype in _NARROW_FLOATS:
            return (self.xp.asarray(self.formula(x.astype(np.float32)).astype(x.dtype)),)
        return (self.xp.asarray(self.formula(x)),)


# ---- rectifiers -------------------------------------------------------------------------------


class Relu(Kernel):
    op_type, since_version = "Relu", 1

    def run(self, x):
        return (self.xp.asarray(self.xp.maximum(x, x.dtype.type(0))),)


class LeakyRelu(Formula):
    op_type, since_version = "LeakyRelu", 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 0.01))

    def formula(self, x):
        return self.xp.where(x >= 0, x, x * self.alpha)


class PRelu(Kernel):
    """The slope broadcasts to x (unidirectionally since opset 7; numpy's rules cover both)."""

    op_type, since_version = "PRelu", 1

    def run(self, x, slope):
        return (self.xp.asarray(self.xp.where(x >= 0, x, x * slope)),)


class ThresholdedRelu(Formula):
    op_type, since_version = "ThresholdedRelu", 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 1.0))

    def formula(self, x):
        return self.xp.where(x > self.alpha, x, 0).astype(x.dtype, copy=False)


class _ExponentialLinear(Formula):
    """scale * (max(x, 0) + alpha * expm1(min(x, 0) / width)): Elu, Selu and Celu differ in
    the constants only. expm1 of min(x, 0) never overflows."""

    alpha_default: float
    gamma_default = 1.0  # only Selu has a `gamma` attribute
    width_is_alpha = False  # Celu divides by alpha inside the exponential

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", self.alpha_default))
        self.scale = float(self.attr("gamma", self.gamma_default))
        self.width = self.alpha if self.width_is_alpha else 1.0

    def formula(self, x):
        xp = self.xp
        y = xp.minimum(x, 0)
        if self.width != 1.0:
            y = y / self.width
        y = xp.expm1(y)
        y *= self.alpha
        y += xp.maximum(x, 0)
        if self.scale != 1.0:
            y *= self.scale
        return y


class Elu(_ExponentialLinear):
    op_type, since_version, alpha_default = "Elu", 1, 1.0


class Selu(_ExponentialLinear):
    op_type, since_version, alpha_default = "Selu", 1, 1.67326319217681884765625
    gamma_default = 1.05070102214813232421875


class Celu(_ExponentialLinear):
    op_type, since_version, alpha_default = "Celu", 12, 1.0
    width_is_alpha = True


class Shrink(Formula):
    """x + bias below -lambd, x - bias above lambd, 0 between; integer inputs stay integer."""

    op_type, since_version = "Shrink", 9

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.bias = float(self.attr("bias", 0.0))
        self.lambd = float(self.attr("lambd", 0.5))

    def formula(self, x):
        xp = self.xp
        y = xp.where(x < -self.lambd, x + self.bias, xp.where(x > self.lambd, x - self.bias, 0))
        return y.astype(x.dtype, copy=False)


# ---- sigmoid family ---------------------------------------------------------------------------


def sigmoid(xp, x):
    """1 / (1 + exp(-|x|)) mirrored for negative x, so exp never sees a large argument."""
    e = xp.abs(x)
    e = xp.exp(-e)  # fresh array from here on
    s = e + 1
    s = xp.reciprocal(s)  # sigmoid(|x|)
    return xp.where(x >= 0, s, e * s)  # sigmoid(-|x|) = exp(-|x|) * sigmoid(|x|)


class Sigmoid(Formula):
    op_type, since_version = "Sigmoid", 1

    def formula(self, x):
        return sigmoid(self.xp, x)


class HardSigmoid(Formula):
    op_type, since_version = "HardSigmoid", 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 0.2))
        self.beta = float(self.attr("beta", 0.5))

    def formula(self, x):
        y = x * self.alpha
        y += self.beta
        return self.xp.clip(y, 0, 1)


class HardSwish(Formula):
    """x * HardSigmoid(x) with alpha 1/6, beta 1/2."""

    op_type, since_version = "HardSwish", 14

    def formula(self, x):
        y = x * (1 / 6)
        y += 0.5
        y = self.xp.clip(y, 0, 1)
        y *= x
        return y


class Swish(Formula):
    """x * sigmoid(alpha * x) (opset 24); SiLU at the default alpha 1."""

    op_type, since_version = "Swish", 24

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 1.0))

    def formula(self, x):
        gate = sigmoid(self.xp, x * x.dtype.type(self.alpha) if self.alpha != 1.0 else x)
        gate *= x
        return gate


class SwiGLU(Kernel):
    """Swish(a, alpha) * b (opset 28), the gated MLP of Llama-style models; a and b have one shape."""

    op_type, since_version = "SwiGLU", 28

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 1.0))

    def run(self, a, b):
        if a.shape != b.shape:
            raise ValueError(f"SwiGLU '{self.node.name}': A {list(a.shape)} and B {list(b.shape)} differ")
        dtype = a.dtype
        if dtype in _NARROW_FLOATS:
            a, b = a.astype(np.float32), b.astype(np.float32)
        gate = sigmoid(self.xp, a * a.dtype.type(self.alpha) if self.alpha != 1.0 else a)
        gate *= a
        gate *= b
        return (gate.astype(dtype, copy=False),)


class Tanh(Kernel):
    op_type, since_version = "Tanh", 1

    def run(self, x):
        return (self.xp.asarray(self.xp.tanh(x)),)


class Softplus(Formula):
    """log(1 + exp(x)) as logaddexp(x, 0), which doesn't overflow for large x."""

    op_type, since_version = "Softplus", 1

    def formula(self, x):
        return self.xp.logaddexp(x, x.dtype.type(0))


class Softsign(Formula):
    op_type, since_version = "Softsign", 1

    def formula(self, x):
        d = self.xp.abs(x)
        d += 1
        return x / d


class Mish(Formula):
    """x * tanh(softplus(x))."""

    op_type, since_version = "Mish", 18

    def formula(self, x):
        xp = self.xp
        y = xp.tanh(xp.logaddexp(x, x.dtype.type(0)))
        y *= x
        return y


class Gelu(Formula):
    """approximate="none": x/2 * (1 + erf(x/sqrt 2)); "tanh": x/2 * (1 + tanh(sqrt(2/pi) *
    (x + 0.044715 x^3)))."""

    op_type, since_version = "Gelu", 20

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.approximate = self.attr("approximate", "none")
        if self.approximate not in ("none", "tanh"):
            raise ValueError(
                f"Gelu node '{node.name}': attribute 'approximate' must be 'none' or 'tanh', "
                f"got {self.approximate!r}"
            )

    def run(self, x):
        # On CUDA one elementwise launch, in float32 for float16 too, as Formula computes it.
        if self.on_cuda and cuda_fused.gelu_accepts(x):
            return (cuda_fused.gelu(x, tanh=self.approximate == "tanh"),)
        return super().run(x)

    def formula(self, x):
        xp = self.xp
        # float32 on the CPU (16-bit floats widened by Formula): com.microsoft.Gelu's and FastGelu's
        # compiled loops compute these two formulas, and the array path below took 6x as long (exporters
        # write this op from opset 20, and it stays unfused at level disabled or without a bias before it).
        if compiled.accepts(xp, x) and x.ndim >= 1:
            out = np.empty_like(x)
            rows, into = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
            (compiled.fast_gelu_rows if self.approximate == "tanh" else compiled.gelu_rows)(rows, into)
            return out
        if self.approximate == "tanh":
            inner = x * x
            inner *= 0.044715
            inner += 1
            inner *= x
            inner *= math.sqrt(2 / math.pi)
            y = xp.tanh(inner)
        else:
            y = erf(xp, x * (1 / math.sqrt(2)))
        y += 1
        y *= x
        y *= 0.5
        return y


# ---- softmax family ---------------------------------------------------------------------------
# Opset 13 made these act on one axis (default -1). Before it they flattened the input to 2-D at
# `axis` (default 1) and normalized each row of the flattened shape.


_ZERO_MASKS = ShapeMemo()  # the zero mask `_softmax` hands the compiled loop, by row width


def _softmax(xp, x, axis):
    if x.ndim and axis % x.ndim == x.ndim - 1 and compiled.accepts(xp, x):
        # Last axis, numpy float32: Attention's compiled softmax (one read of each row, the max,
        # exp and sum passes in L1) with a zero mask; 0.6 -> 0.2 ms on BERT-base's scores.
        out = x.copy()
        width = x.shape[-1]
        zeros = _ZERO_MASKS.get(width)
        if zeros is None:  # read by the loop, never written: one per width
            zeros = _ZERO_MASKS.keep(width, np.zeros((1, 1, 1, width), np.float32))
        compiled.masked_softmax_heads(out.reshape(1, 1, -1, width), zeros)
        return out
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    shifted = xp.exp(shifted)
    shifted /= xp.sum(shifted, axis=axis, keepdims=True)
    return shifted


def _log_softmax(xp, x, axis):
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    shifted -= xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))
    return shifted


def _hardmax(xp, x, axis):
    """1 at the first maximum along axis, 0 elsewhere."""
    winner = xp.argmax(x, axis=axis, keepdims=True)
    positions = xp.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - 1 - axis % x.ndim))
    return (positions == winner).astype(x.dtype)


class _AlongAxis(Formula):
    """Opset 13 semantics: `compute` along a single axis."""

    compute: staticmethod

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = int(self.attr("axis", -1))

    def formula(self, x):
        return self.compute(self.xp, x, self.axis)


class _Flattened(Formula):
    """Before opset 13: `compute` along the last axis of x flattened to 2-D at `axis`."""

    compute: staticmethod

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = int(self.attr("axis", 1))

    def formula(self, x):
        axis = self.axis % x.ndim if x.ndim else 0
        flat = x.reshape(math.prod(x.shape[:axis]), -1)
        return self.compute(self.xp, flat, 1).reshape(x.shape)


class Softmax_1(_Flattened):
    op_type, since_version, compute = "Softmax", 1, staticmethod(_softmax)


class Softmax_13(_AlongAxis):
    op_type, since_version, compute = "Softmax", 13, staticmethod(_softmax)


class LogSoftmax_1(_Flattened):
    op_type, since_version, compute = "LogSoftmax", 1, staticmethod(_log_softmax)


class LogSoftmax_13(_AlongAxis):
    op_type, since_version, compute = "LogSoftmax", 13, staticmethod(_log_softmax)


class Hardmax_1(_Flattened):
    op_type, since_version, compute = "Hardmax", 1, staticmethod(_hardmax)


class Hardmax_13(_AlongAxis):
    op_type, since_version, compute = "Hardmax", 13, staticmethod(_hardmax)


KERNELS = [
    Relu, LeakyRelu, PRelu, ThresholdedRelu, Elu, Selu, Celu, Shrink,
    Sigmoid, HardSigmoid, HardSwish, Swish, SwiGLU, Tanh, Softplus, Softsign, Mish, Gelu,
    Softmax_1, Softmax_13, LogSoftmax_1, LogSoftmax_13, Hardmax_1, Hardmax_13,
]  # fmt: skip
