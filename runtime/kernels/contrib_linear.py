"""com.microsoft FusedConv, FusedGemm and FusedMatMul: the linear op with what followed it folded in.

FusedConv and FusedGemm are the Conv and Gemm kernels (conv.py, linalg.py) with the activation
applied in place on the product they already allocated, where the unfused graph writes a second
full-size tensor per activation (and per Add of FusedConv's Z). FusedMatMul folds the transposes
into the strided views BLAS reads and the scale into one in-place multiply. FusedGemm, and
FusedMatMul against a constant 2-D float32 B, run on MKL's packed SGEMM where it is installed
(runtime/kernels/gemm.py).

Activations are ONNX Runtime's two sets: FusedConv takes MLAS's (Relu, Silu, Tanh, Sigmoid, and
LeakyRelu / Clip / HardSigmoid with exactly their `activation_params`), FusedGemm takes the
element-wise functors (`activation_alpha` / `_beta` / `_gamma` named as the op's own attributes).
"""

from __future__ import annotations

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels import gemm
from runtime.kernels.base import Kernel, UnsupportedOp
from runtime.kernels.conv import Conv
from runtime.kernels.linalg import Gemm, MatMulInteger

MS = "com.microsoft"

# ---------------------------------------------------------------- in-place activations
# Each takes (xp, y, params) and overwrites y, a fresh array the kernel owns.


def _relu(xp, y, p):
    xp.maximum(y, 0, out=y)


def _tanh(xp, y, p):
    xp.tanh(y, out=y)


def _sigmoid(xp, y, p):
    xp.negative(y, out=y)
    with np.errstate(over="ignore"):  # exp -> inf gives 1 / inf = 0, the right limit
        xp.exp(y, out=y)
    y += 1
    xp.reciprocal(y, out=y)


def _silu(xp, y, p):
    denominator = xp.negative(y)
    with np.errstate(over="ignore"):
        xp.exp(denominator, out=denominator)
    denominator += 1
    xp.divide(y, denominator, out=y)


def _leaky_relu(xp, y, p):
    negative = xp.minimum(y, 0)
    negative *= y.dtype.type(p["alpha"])
    xp.maximum(y, 0, out=y)
    y += negative


def _clip(xp, y, p):
    xp.clip(y, p["min"], p["max"], out=y)


def _hard_sigmoid(xp, y, p):
    y *= y.dtype.type(p["alpha"])
    y += y.dtype.type(p["beta"])
    xp.clip(y, 0, 1, out=y)


def _elu(xp, y, p):
    negative = xp.minimum(y, 0)
    xp.expm1(negative, out=negative)
    negative *= y.dtype.type(p["alpha"])
    xp.maximum(y, 0, out=y)
    y += negative


def _celu(xp, y, p):
    negative = xp.minimum(y, 0)
    negative /= y.dtype.type(p["alpha"])
    xp.expm1(negative, out=negative)
    negative *= y.dtype.type(p["alpha"])
    xp.maximum(y, 0, out=y)
    y += negative


def _selu(xp, y, p):
    _elu(xp, y, p)
    y *= y.dtype.type(p["gamma"])


def _softplus(xp, y, p):
    xp.logaddexp(y, 0, out=y)  # log(1 + exp(y)) without overflow


def _softsign(xp, y, p):
    denominator = xp.abs(y)
    denominator += 1
    y /= denominator


def _thresholded_relu(xp, y, p):
    xp.multiply(y, y > p["alpha"], out=y)


def _parametric_softplus(xp, y, p):
    y *= y.dtype.type(p["beta"])
    xp.logaddexp(y, 0, out=y)
    y *= y.dtype.type(p["alpha"])


def _scaled_tanh(xp, y, p):
    y *= y.dtype.type(p["beta"])
    xp.tanh(y, out=y)
    y *= y.dtype.type(p["alpha"])


# name -> (function, parameter names in activation_params order) for FusedConv (MLAS).
CONV_ACTIVATIONS = {
    "Relu": (_relu, ()),
    "Silu": (_silu, ()),
    "Tanh": (_tanh, ()),
    "Sigmoid": (_sigmoid, ()),
    "LeakyRelu": (_leaky_relu, ("alpha",)),
    "Clip": (_clip, ("min", "max")),
    "HardSigmoid": (_hard_sigmoid, ("alpha", "beta")),
}

# name -> (function, parameter names) for FusedGemm (ORT's functors). ORT reads each parameter
# from `activation_<name>` and has no defaults: a LeakyRelu without activation_alpha is an error.
GEMM_ACTIVATIONS = {
    "Relu": (_relu, ()),
    "Tanh": (_tanh, ()),
    "Sigmoid": (_sigmoid, ()),
    "Softplus": (_softplus, ()),
    "Softsign": (_softsign, ()),
    "LeakyRelu": (_leaky_relu, ("alpha",)),
    "Elu": (_elu, ("alpha",)),
    "Celu": (_celu, ("alpha",)),
    "HardSigmoid": (_hard_sigmoid, ("alpha", "beta")),
    "ThresholdedRelu": (_thresholded_relu, ("alpha",)),
    "Selu": (_selu, ("alpha", "gamma")),
    "ParametricSoftplus": (_parametric_softplus, ("alpha", "beta")),
    "ScaledTanh": (_scaled_tanh, ("alpha", "beta")),
}


class FusedConv(Conv):
    """Y = activation(Conv(X, W, B) + Z); Z (optional) is added before the activation."""

    op_type = "FusedConv"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        name = self.attr("activation")
        self.activation = None
        self.params = {}
        if name is None:
            return
        if name not in CONV_ACTIVATIONS:
            raise UnsupportedOp(
                f"FusedConv '{node.name}': activation {name!r} is not one of {', '.join(CONV_ACTIVATIONS)}"
            )
        self.activation, names = CONV_ACTIVATIONS[name]
        values = self.attr("activation_params", [])
        if len(values) != len(names):
            raise ValueError(
                f"FusedConv '{node.name}': activation {name} takes {len(names)} "
                f"activation_params ({', '.join(names) or 'none'}), got {len(values)}"
            )
        self.params = dict(zip(names, (float(v) for v in values), strict=True))

    def run(self, x, w, b=None, z=None):
        (y,) = super().run(x, w, b)
        if z is not None:
            if z.shape != y.shape:
                raise ValueError(f"FusedConv '{self.node.name}': Z has shape {z.shape}, output has {y.shape}")
            y += z
        if self.activation is not None:
            self.activation(self.xp, y, self.params)
        return (y,)


class FusedGemm(Gemm):
    """Y = activation(alpha * A' B' + beta * C); the activation is required, as in ORT."""

    op_type = "FusedGemm"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        name = self.attr("activation")
        if name is None:
            raise ValueError(f"FusedGemm '{node.name}': attribute activation is required")
        if name not in GEMM_ACTIVATIONS:
            raise UnsupportedOp(
                f"FusedGemm '{node.name}': activation {name!r} is not one of {', '.join(GEMM_ACTIVATIONS)}"
            )
        self.activation, names = GEMM_ACTIVATIONS[name]
        self.params = {}
        for param in names:
            value = self.attr(f"activation_{param}")
            if value is None:
                raise ValueError(
                    f"FusedGemm '{node.name}': activation {name} needs attribute activation_{param}"
                )
            self.params[param] = float(value)

    def run(self, a, b, c=None):
        (y,) = super().run(a, b, c)
        self.activation(self.xp, y, self.params)
        return (y,)


class FusedMatMul(Kernel):
    """Y = alpha * op(A) @ op(B).

    transBatchX moves X's first dimension next to its last before the product: A of shape
    (d0, d1, ..., dk) is read as batches (d1, ..., d(k-1)) of (d0, dk) matrices; transX then
    swaps the matrix's two axes. Both become a strided view, so nothing is copied.
    """

    op_type = "FusedMatMul"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = float(self.attr("alpha", 1.0))
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))
        self.trans_batch_a = bool(self.attr("transBatchA", 0))
        self.trans_batch_b = bool(self.attr("transBatchB", 0))
        # A constant 2-D B is packed (transposed for transB); the batch transposes need rank >= 3
        # and transA a strided A, so those stay on numpy.
        self.packed = (
            None
            if self.trans_a or self.trans_batch_a or self.trans_batch_b or len(node.inputs) < 2
            else gemm.pack_constant(node.inputs[1], self.xp, trans=self.trans_b)
        )

    @staticmethod
    def _operand(x, trans_batch, trans):
        if x.ndim < 2:
            return x  # ORT ignores the transposes for a vector
        if trans_batch:
            x = x.transpose(*range(1, x.ndim - 1), 0, x.ndim - 1)
        if trans:
            x = x.swapaxes(-1, -2)
        return x

    def run(self, a, b):
        xp = self.xp
        if (self.trans_batch_a or self.trans_batch_b) and not (a.ndim == b.ndim and a.ndim >= 3):
            raise ValueError(
                f"FusedMatMul '{self.node.name}': transBatchA/transBatchB need A and B of the same "
                f"rank >= 3, got {a.shape} and {b.shape}"
            )
        if gemm.applies(self.packed, a, b):
            y = gemm.matmul_packed(a, self.packed)
        else:
            y = gemm.product(
                xp,
                self._operand(a, self.trans_batch_a, self.trans_a),
                self._operand(b, self.trans_batch_b, self.trans_b),
            )
            y = xp.asarray(y)  # a vector-vector product is a scalar
        if self.alpha != 1.0:
            y *= y.dtype.type(self.alpha)
        return (y,)


class MatMulIntegerToFloat(MatMulInteger):
    """onnxruntime's Y = (A - a_zero_point)(B - b_zero_point) * (a_scale * b_scale) + bias, float.

    The integer product is MatMulInteger's (the constant weight shifted once), then the float cast,
    the product of the scales, the scaling and the bias each as the unfused subgraph's kernels do them
    (optimizer/fusions/matmul_integer_to_float_fusion.py), so the two agree bit for bit."""

    domain = "com.microsoft"
    op_type = "MatMulIntegerToFloat"
    since_version = 1
    b_zero_point_input = 5

    def run(self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        (accumulated,) = super().run(a, b, a_zero_point, b_zero_point)
        y = accumulated.astype(np.float32)
        y *= a_scale * b_scale  # float32 scales: the Mul of the scales, then the scaling Mul
        if bias is not None:
            y += bias
        return (y,)


KERNELS = [FusedConv, FusedGemm, FusedMatMul, MatMulIntegerToFloat]
