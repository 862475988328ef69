"""Linear-algebra kernels: MatMul, Gemm, Einsum, MatMulInteger, all handed to BLAS via matmul.

ONNX MatMul's broadcasting and 1-D promotion rules are numpy's, so MatMul is one call. Gemm
scales and adds in place on its own fresh product rather than allocating temporaries.
Where MKL is installed, float32 MatMul and Gemm run on it (runtime/kernels/gemm.py says why),
against a constant weight on MKL's packed SGEMM, the weight packed here at construction.
"""

from __future__ import annotations

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels import gemm
from runtime.kernels.base import Kernel


class MatMul(Kernel):
    op_type = "MatMul"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.packed = gemm.pack_constant(node.inputs[1] if len(node.inputs) > 1 else None, self.xp)

    def run(self, a, b):
        if gemm.applies(self.packed, a, b):
            return (gemm.matmul_packed(a, self.packed),)
        # asarray: 1-D @ 1-D gives a scalar; astype: numpy has no bfloat16 matmul and answers in float32.
        return (self.xp.asarray(gemm.product(self.xp, a, b)).astype(a.dtype, copy=False),)


class Gemm(Kernel):
    """Y = alpha * A' B' + beta * C. The `broadcast` attribute of opsets < 7 is ignored: C
    broadcasting to Y is always allowed, which is what every later opset says."""

    op_type = "Gemm"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = self.attr("alpha", 1.0)
        self.beta = self.attr("beta", 1.0)
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))
        # transB=1 stores B^T; it is packed transposed. transA=1 is rare enough to leave to numpy.
        self.packed = (
            None
            if self.trans_a or len(node.inputs) < 2
            else gemm.pack_constant(node.inputs[1], self.xp, trans=self.trans_b)
        )

    def run(self, a, b, c=None):
        if gemm.applies(self.packed, a, b):
            y = gemm.matmul_packed(a, self.packed)
        else:
            y = gemm.product(self.xp, a.T if self.trans_a else a, b.T if self.trans_b else b)
        if self.alpha != 1.0:
            y *= y.dtype.type(self.alpha)
        if c is not None and self.beta != 0.0:
            if self.beta == 1.0:
                y += c
            else:
                y += c * c.dtype.type(self.beta)
        return (y,)


class Einsum(Kernel):
    op_type = "Einsum"
    since_version = 12

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.equation = self.attr("equation").replace(" ", "")
        # Contraction-order search pays off only with three or more operands.
        self.optimize = len(node.inputs) > 2

    def run(self, *inputs):
        dtype = inputs[0].dtype
        if dtype.type not in _EINSUM_NATIVE:
            # numpy's einsum has no loops for bfloat16/float8 (ml_dtypes): accumulate in float32.
            inputs = [x.astype(np.float32) for x in inputs]
        out = self.xp.einsum(self.equation, *inputs, optimize=self.optimize)
        return (self.xp.asarray(out).astype(dtype, copy=False),)


_EINSUM_NATIVE = {
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.complex64,
    np.complex128,
    np.bool_,
}


class MatMulInteger(Kernel):
    """int8/uint8 matmul accumulated in int32; zero points are scalars, per-row for A
    (shape [M]) or per-column for B (shape [N])."""

    op_type = "MatMulInteger"
    since_version = 10

    shifted_b: np.ndarray | None = None  # B less its zero point, in float64, where both are constant
    b_zero_point_input = 3  # where B's zero point is among the node's inputs

    def bind_constants(self, constants):
        # A quantized model's weights are constant: shifted and widened once here, not on every run
        # (a K x N conversion per call beside an M x K x N product that is small at short sequences).
        index = self.b_zero_point_input
        b = constants[1] if len(constants) > 1 else None
        b_zero_point = constants[index] if len(constants) > index else None
        has_zero_point = len(self.node.inputs) > index and self.node.inputs[index] is not None
        if b is not None and (b_zero_point is not None or not has_zero_point):
            self.shifted_b = shifted_float64(b, b_zero_point)

    def run(self, a, b, a_zero_point=None, b_zero_point=None):
        # Accumulated in float64 on BLAS, where numpy's int32 matmul is a plain loop (a quantized
        # BERT-base's products took minutes a run): every product of two shifted 8-bit values and every
        # sum of up to 2**37 of them is exact in float64, so the int32 result is the same.
        a64 = a.astype(np.float64)
        if a_zero_point is not None:
            zero = a_zero_point.astype(np.float64)
            a64 -= zero.reshape(-1, 1) if zero.ndim == 1 and a.ndim >= 2 else zero
        b64 = self.shifted_b if self.shifted_b is not None else shifted_float64(b, b_zero_point)
        return (self.xp.matmul(a64, b64).astype(np.int64).astype(np.int32),)


def shifted_float64(values: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """Integer values less their zero point (broadcasting as given), in float64: exact for 8- and
    16-bit operands, and what the quantized products accumulate on BLAS."""
    shifted = values.astype(np.float64)
    if zero_point is not None:
        shifted -= zero_point.astype(np.float64)
    return shifted


class Det(Kernel):
    """Determinants of the (..., M, M) matrices; float16 ones computed in float32 (numpy has no
    half-precision LU)."""

    op_type = "Det"
    since_version = 11

    def run(self, x):
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        return (self.xp.asarray(self.xp.linalg.det(work)).astype(x.dtype, copy=False),)


KERNELS = [
    MatMul,
    Gemm,
    Einsum,
    MatMulInteger,
    Det,
]
