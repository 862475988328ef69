"""Quantization kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the
quantized compute ops QLinearMatMul, ConvInteger and QLinearConv.

Scales and zero points come per tensor (a scalar), per axis (1-D, along `axis`) or blocked
(the input's rank, `block_size` elements of `axis` sharing one value); `_along` turns each
into something that broadcasts against the input. QuantizeLinear targets every integer type
ml_dtypes gives numpy (8/16-bit, int4/uint4, int2/uint2) and its float8/float4 types.

Integer accumulation is done in float64: every product of two 16-bit-or-smaller integers and
every sum of up to 2**53 / 2**32 of them is exact there, and it runs on BLAS, where numpy's
int32 matmul is a plain loop. ConvInteger and QLinearConv hand their zero-point-shifted
operands to conv.py's Conv kernel, built from the same node (their attributes are Conv's), so
padding, groups, dilations and the im2col plan are the ones our float convolution uses.
Padding with zeros after the shift is padding with the zero point before it, as the spec asks.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp
from runtime.kernels.conv import Conv
from runtime.kernels.linalg import shifted_float64

_INTEGER_TARGETS = {
    np.dtype(t)
    for t in (
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        ml_dtypes.uint4,
        ml_dtypes.int4,
        ml_dtypes.uint2,
        ml_dtypes.int2,
    )
}
_FLOAT8_TARGETS = {
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
}
# No inf or NaN encodings: casting already saturates, and a zero point is added as a float.
_FLOAT4_TARGETS = {np.dtype(ml_dtypes.float4_e2m1fn)}


def _integer_range(dtype):
    info = ml_dtypes.iinfo(dtype)
    return int(info.min), int(info.max)


def _along(value, shape, axis, block_size, where):
    """A scale or zero point shaped to broadcast against an input of `shape`."""
    if value.ndim == 0 or value.size == 1 and not block_size:
        return value.reshape(())
    if not block_size:
        if value.ndim != 1 or value.size != shape[axis]:
            raise ValueError(
                f"{where}: per-axis scale/zero point has shape {list(value.shape)}, "
                f"expected [{shape[axis]}] for axis {axis} of input {list(shape)}"
            )
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    blocks = -(-shape[axis] // block_size)
    expected = list(shape)
    expected[axis] = blocks
    if list(value.shape) != expected:
        raise ValueError(
            f"{where}: blocked scale/zero point has shape {list(value.shape)}, expected {expected} "
            f"(block_size {block_size} along axis {axis} of input {list(shape)})"
        )
    # Each block's value repeated over its elements; the last block may be short.
    return value.repeat(block_size, axis=axis)[tuple(slice(0, n) for n in shape)]


def _compute_dtype(*dtypes):
    return np.float64 if any(np.dtype(d) == np.float64 for d in dtypes) else np.float32


def _onnx_dtype(code, where):
    try:
        return np.dtype(ir.DataType(code).numpy())
    except (ValueError, TypeError) as error:
        raise UnsupportedOp(f"{where}: output_dtype {code} has no numpy type") from error


class QuantizeLinear(Kernel):
    """y = saturate(round(x / scale) + zero_point), rounding half to even."""

    op_type = "QuantizeLinear"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.where = f"QuantizeLinear '{node.name}'"
        self.axis = self.attr("axis", 1)
        self.saturate = bool(self.attr("saturate", 1))
        self.block_size = self.attr("block_size", 0)
        code = self.attr("output_dtype", 0)
        self.output_dtype = _onnx_dtype(code, self.where) if code else None
        precision = self.attr("precision", 0)
        self.precision = _onnx_dtype(precision, self.where) if precision else None
        if self.output_dtype is not None and self.output_dtype not in (
            _INTEGER_TARGETS | _FLOAT8_TARGETS | _FLOAT4_TARGETS
        ):
            raise UnsupportedOp(f"{self.where}: cannot quantize to {self.output_dtype}")

    def run(self, x, y_scale, y_zero_point=None):
        xp = self.xp
        target = self.output_dtype or np.dtype(np.uint8)
        if y_zero_point is not None:
            if self.output_dtype is not None and y_zero_point.dtype != self.output_dtype:
                raise ValueError(
                    f"{self.where}: output_dtype {self.output_dtype} but zero point is {y_zero_point.dtype}"
                )
            target = y_zero_point.dtype
        if target not in _INTEGER_TARGETS | _FLOAT8_TARGETS | _FLOAT4_TARGETS:
            raise ValueError(f"{self.where}: cannot quantize to {target}")
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        compute = self.precision or _compute_dtype(x.dtype, y_scale.dtype)
        scale = _along(y_scale, x.shape, axis, self.block_size, self.where).astype(compute)
        q = x.astype(compute) / scale
        if target in _INTEGER_TARGETS:
            q = xp.rint(q)
            if y_zero_point is not None:
                q += _along(y_zero_point, x.shape, axis, self.block_size, self.where).astype(compute)
            low, high = _integer_range(target)
            return (xp.clip(q, low, high).astype(target),)
        if target in _FLOAT4_TARGETS:
            if y_zero_point is not None:
                q = q + _along(y_zero_point, x.shape, axis, self.block_size, self.where).astype(compute)
            return (q.astype(target),)
        # float8: the zero point is zero by the spec; saturate clips overflow (inf included)
        # to the largest finite value instead of inf/NaN.
        if self.saturate:
            info = ml_dtypes.finfo(target)
            q = xp.clip(q, float(info.min), float(info.max))
        return (q.astype(target),)


class DequantizeLinear(Kernel):
    """y = (x - zero_point) * scale, in the scale's type (or output_dtype)."""

    op_type = "DequantizeLinear"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.where = f"DequantizeLinear '{node.name}'"
        self.axis = self.attr("axis", 1)
        self.block_size = self.attr("block_size", 0)
        code = self.attr("output_dtype", 0)
        self.output_dtype = _onnx_dtype(code, self.where) if code else None

    def run(self, x, x_scale, x_zero_point=None):
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        compute = _compute_dtype(x_scale.dtype)
        values = x.astype(compute)
        if x_zero_point is not None:
            if x.dtype in _FLOAT8_TARGETS | _FLOAT4_TARGETS:
                # Float8/float4 carry no offset: the spec has their zero point be zero.
                if x.dtype in _FLOAT8_TARGETS and self.xp.any(x_zero_point.astype(np.float32) != 0):
                    raise ValueError(f"{self.where}: a {x.dtype} zero point must be zero")
            elif x_zero_point.dtype != x.dtype:
                raise ValueError(f"{self.where}: x is {x.dtype} but its zero point is {x_zero_point.dtype}")
            else:
                values = values - _along(x_zero_point, x.shape, axis, self.block_size, self.where).astype(
                    compute
                )
        y = values * _along(x_scale, x.shape, axis, self.block_size, self.where).astype(compute)
        return (y.astype(self.output_dtype or x_scale.dtype, copy=False),)


class DynamicQuantizeLinear(Kernel):
    """uint8 quantization with scale and zero point chosen from x's range (widened to hold 0)."""

    op_type = "DynamicQuantizeLinear"
    since_version = 11

    def run(self, x):
        xp = self.xp
        high = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)  # the method skips np.max's wrapper
        low = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
        scale = np.float32(1.0 if high == low else high - low) / np.float32(255)
        zero_point = np.rint(np.clip(np.float32(0) - low / scale, 0, 255))
        # One temporary, worked on in place: each numpy call on a small activation costs more than its
        # arithmetic, and a quantized model runs this before every product.
        y = xp.divide(x, scale, dtype=np.float32)
        xp.rint(y, out=y)
        y += zero_point
        xp.clip(y, 0, 255, out=y)
        return y.astype(np.uint8), xp.asarray(scale.astype(x.dtype)), xp.asarray(np.uint8(zero_point))


def _requantize(xp, accumulated, multiplier, zero_point, dtype):
    """round(acc * multiplier) + zero point, saturated into `dtype` (half to even)."""
    y = accumulated * multiplier
    if zero_point is not None:
        y += zero_point.astype(np.float64)
    low, high = _integer_range(dtype)
    return xp.clip(xp.rint(y), low, high).astype(dtype)


class QLinearMatMul(Kernel):
    """Quantized matmul; a's scale/zero point per tensor or per row, b's per tensor or per column."""

    op_type = "QLinearMatMul"
    since_version = 10

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
        xp = self.xp
        a_zero_point = self._per_row(a_zero_point, a)
        a_scale = self._per_row(a_scale, a)
        accumulated = xp.matmul(shifted_float64(a, a_zero_point), shifted_float64(b, b_zero_point))
        # The multiplier in the scales' own type, as the spec's reference computes it.
        multiplier = (a_scale * b_scale / y_scale).astype(np.float64)
        dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
        return (_requantize(xp, accumulated, multiplier, y_zero_point, dtype),)

    @staticmethod
    def _per_row(value, a):
        # A 1-D per-row parameter of length M must line up with a's rows, not its columns.
        if value is not None and value.ndim == 1 and value.size > 1 and a.ndim >= 2:
            return value.reshape(-1, 1)
        return value


class ConvInteger(Kernel):
    """Conv over zero-point-shifted integers, accumulated exactly, returned as int32."""

    op_type = "ConvInteger"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.conv = Conv(node, opset, backend)

    def run(self, x, w, x_zero_point=None, w_zero_point=None):
        xp = self.xp
        shifted_w = shifted_float64(w, _per_output_channel(w_zero_point, w.ndim))
        (accumulated,) = self.conv.run(shifted_float64(x, x_zero_point), shifted_w)
        return (xp.rint(accumulated).astype(np.int32),)


class QLinearConv(Kernel):
    """Quantized Conv: int32 bias added to the exact accumulator, then requantized."""

    op_type = "QLinearConv"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.conv = Conv(node, opset, backend)

    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
        xp = self.xp
        shifted_w = shifted_float64(w, _per_output_channel(w_zero_point, w.ndim))
        bias = None if b is None else b.astype(np.float64)
        (accumulated,) = self.conv.run(shifted_float64(x, x_zero_point), shifted_w, bias)
        w_scale = _per_output_channel(w_scale, w.ndim)
        if w_scale.ndim:
            w_scale = w_scale.reshape(1, -1, *([1] * (w.ndim - 2)))  # (1, M, 1, ...) against NCHW
        multiplier = (x_scale * w_scale / y_scale).astype(np.float64)
        dtype = y_zero_point.dtype if y_zero_point is not None else x.dtype
        return (_requantize(xp, accumulated, multiplier, y_zero_point, dtype),)


def _per_output_channel(value, rank):
    """A weight zero point or scale: a scalar, or one value per output channel (M, 1, 1, ...)."""
    if value is None or value.size == 1:
        return None if value is None else value.reshape(())
    return value.reshape(-1, *([1] * (rank - 1)))


class ContribQuantizeLinear(QuantizeLinear):
    """onnxruntime's own QuantizeLinear: ONNX's, written by its quantization tools where ONNX's
    opset had no 16-bit types yet (QDQ models quantized to 16 bits)."""

    domain = "com.microsoft"
    since_version = 1


class ContribDequantizeLinear(DequantizeLinear):
    """onnxruntime's own DequantizeLinear, as ContribQuantizeLinear."""

    domain = "com.microsoft"
    since_version = 1


KERNELS = [
    QuantizeLinear,
    DequantizeLinear,
    ContribQuantizeLinear,
    ContribDequantizeLinear,
    DynamicQuantizeLinear,
    QLinearMatMul,
    ConvInteger,
    QLinearConv,
]
