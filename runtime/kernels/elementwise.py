"""Elementwise kernels: arithmetic, math functions, comparisons, logic, bitwise, Where, Cast, Clip.

Most ops are one numpy ufunc, so a kernel is a line naming it; the ufunc is looked up on the
backend's array module once, in `__init__` (`"add"` resolves to numpy's or CuPy's `add`).
Kernels never write into their inputs (an input may be a graph input or an initializer);
an output may be an input itself where the op is a no-op (a one-input Sum), which is safe
for the same reason. numpy returns a scalar, not an array, for 0-d results, hence `asarray`.

Binary arithmetic starts at opset 7: before it, ops broadcast by `axis`/`broadcast`
attributes instead of numpy's rules, which we don't implement.
"""

from __future__ import annotations

from functools import reduce
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels import compiled
from runtime.kernels.base import Kernel, UnsupportedOp
from runtime.kernels.erf_fit import erf

# ---- shared bases ------------------------------------------------------------------------


class UnaryUfunc(Kernel):
    """y = ufunc(x)."""

    ufunc: ClassVar[str]

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._fn = getattr(self.xp, self.ufunc)
        self._array_type = self.xp.ndarray

    def run(self, x):
        out = self._fn(x)
        return (out if type(out) is self._array_type else self.xp.asarray(out),)


class BinaryUfunc(Kernel):
    """z = ufunc(a, b) with numpy broadcasting (ONNX multidirectional broadcasting)."""

    ufunc: ClassVar[str]

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._fn = getattr(self.xp, self.ufunc)
        self._array_type = self.xp.ndarray

    def run(self, a, b):
        out = self._fn(a, b)
        # asarray only for what is not an array already (a 0-d result comes back a numpy scalar).
        return (out if type(out) is self._array_type else self.xp.asarray(out),)


class VariadicUfunc(Kernel):
    """Folds a binary ufunc over any number of broadcast inputs (Max, Min, Sum)."""

    ufunc: ClassVar[str]

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._fn = getattr(self.xp, self.ufunc)

    def run(self, *inputs):
        if len(inputs) == 1:
            return (inputs[0],)
        return (self.xp.asarray(reduce(self._fn, inputs)),)


# ---- arithmetic --------------------------------------------------------------------------


class Add(BinaryUfunc):
    op_type, since_version, ufunc = "Add", 7, "add"


class Sub(BinaryUfunc):
    op_type, since_version, ufunc = "Sub", 7, "subtract"


class Mul(BinaryUfunc):
    op_type, since_version, ufunc = "Mul", 7, "multiply"


class Div(BinaryUfunc):
    """Integer division truncates toward zero as in C (ONNX), where numpy's `//` floors."""

    op_type = "Div"
    since_version = 7
    ufunc = "divide"

    def run(self, a, b):
        xp = self.xp
        if a.dtype.kind in "iu":
            # a - fmod(a, b) is an exact multiple of b, so floor division of it is exact.
            return (xp.asarray(xp.floor_divide(a - xp.fmod(a, b), b)),)
        return (xp.asarray(xp.divide(a, b)),)


class Pow(Kernel):
    """The output keeps the base's type, whatever the exponent's (Pow-12 allows mixing).

    A float32/float64 base with a one-element exponent of 2 or 3 (layer norm's variance, GPT-2's
    tanh Gelu) is multiplied out, as ONNX Runtime's Pow does: np.power calls libm pow per
    element, 7.6 ms on a 1x128x3072 float32 tensor against 0.3 ms. The products agree with pow
    to an ulp or two, keep its inf, NaN and signed-zero results, and broadcast the same way.
    """

    op_type = "Pow"
    since_version = 7

    def run(self, x, y):
        exponent = _small_integer_exponent(x, y)
        if exponent == 2:
            return (x * x,)
        if exponent == 3:
            return (x * x * x,)
        z = self.xp.power(x, y)
        return (self.xp.asarray(z if z.dtype == x.dtype else z.astype(x.dtype)),)


def _small_integer_exponent(x, y):
    """2 or 3 when Pow(x, y) can be multiplied out exactly as ONNX Runtime does, else None.

    Only for a numpy float32/float64 base (float16 would round each product; integers keep
    np.power's overflow behaviour) and a host exponent of one element with no more dims than x,
    so the result's shape is x's.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        return None
    if not isinstance(y, np.ndarray) or y.size != 1 or y.ndim > x.ndim:
        return None
    value = y.reshape(()).item()
    return int(value) if value in (2, 3) else None


class Mod(Kernel):
    """fmod=0: the sign of the divisor (numpy's `mod`); fmod=1: the sign of the dividend (C fmod)."""

    op_type = "Mod"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._fn = self.xp.fmod if self.attr("fmod", 0) else self.xp.mod

    def run(self, a, b):
        # x mod 0 (and inf mod y) is NaN by IEEE and by onnxruntime, not a warning for the log.
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.xp.asarray(self._fn(a, b)),)


class Max(VariadicUfunc):
    op_type, since_version, ufunc = "Max", 1, "maximum"


class Min(VariadicUfunc):
    op_type, since_version, ufunc = "Min", 1, "minimum"


class Sum(VariadicUfunc):
    op_type, since_version, ufunc = "Sum", 1, "add"


class Mean(VariadicUfunc):
    op_type = "Mean"
    since_version = 1
    ufunc = "add"

    def run(self, *inputs):
        if len(inputs) == 1:
            return (inputs[0],)
        total = reduce(self._fn, inputs)  # a fresh array: safe to divide in place
        total /= len(inputs)
        return (self.xp.asarray(total),)


class Neg(UnaryUfunc):
    op_type, since_version, ufunc = "Neg", 1, "negative"


class Abs(UnaryUfunc):
    op_type, since_version, ufunc = "Abs", 1, "abs"


class Reciprocal(UnaryUfunc):
    op_type, since_version, ufunc = "Reciprocal", 1, "reciprocal"


class Sqrt(UnaryUfunc):
    op_type, since_version, ufunc = "Sqrt", 1, "sqrt"


class Exp(UnaryUfunc):
    op_type, since_version, ufunc = "Exp", 1, "exp"


class Log(UnaryUfunc):
    op_type, since_version, ufunc = "Log", 1, "log"


class Ceil(UnaryUfunc):
    op_type, since_version, ufunc = "Ceil", 1, "ceil"


class Floor(UnaryUfunc):
    op_type, since_version, ufunc = "Floor", 1, "floor"


class Round(UnaryUfunc):
    op_type, since_version, ufunc = "Round", 11, "rint"  # halves to even, as ONNX


class Sign(UnaryUfunc):
    op_type, since_version, ufunc = "Sign", 9, "sign"


# ---- trigonometric and hyperbolic ------------------------------------------------------------


class Sin(UnaryUfunc):
    op_type, since_version, ufunc = "Sin", 7, "sin"


class Cos(UnaryUfunc):
    op_type, since_version, ufunc = "Cos", 7, "cos"


class Tan(UnaryUfunc):
    op_type, since_version, ufunc = "Tan", 7, "tan"


class Asin(UnaryUfunc):
    op_type, since_version, ufunc = "Asin", 7, "arcsin"


class Acos(UnaryUfunc):
    op_type, since_version, ufunc = "Acos", 7, "arccos"


class Atan(UnaryUfunc):
    op_type, since_version, ufunc = "Atan", 7, "arctan"


class Sinh(UnaryUfunc):
    op_type, since_version, ufunc = "Sinh", 9, "sinh"


class Cosh(UnaryUfunc):
    op_type, since_version, ufunc = "Cosh", 9, "cosh"


class Asinh(UnaryUfunc):
    op_type, since_version, ufunc = "Asinh", 9, "arcsinh"


class Acosh(UnaryUfunc):
    op_type, since_version, ufunc = "Acosh", 9, "arccosh"


class Atanh(UnaryUfunc):
    op_type, since_version, ufunc = "Atanh", 9, "arctanh"


# ---- erf ------------------------------------------------------------------------------------


class Erf(Kernel):
    """numpy float32 runs one compiled pass (runtime/kernels/compiled.py) of erf_fit's fit: the
    numpy form is ~15 passes, 2.5 ms on BERT-base's 1x128x3072 Gelu input against ~0.3."""

    op_type = "Erf"
    since_version = 9

    def run(self, x):
        if compiled.accepts(self.xp, x):
            out = np.empty_like(x)
            compiled.erf_values(x.reshape(-1), out.reshape(-1))
            return (out,)
        return (self.xp.asarray(erf(self.xp, x)),)


# ---- predicates and comparisons ------------------------------------------------------------------


class IsNaN(UnaryUfunc):
    op_type, since_version, ufunc = "IsNaN", 9, "isnan"


class IsInf(Kernel):
    op_type = "IsInf"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.negative = bool(self.attr("detect_negative", 1))
        self.positive = bool(self.attr("detect_positive", 1))

    def run(self, x):
        xp = self.xp
        if self.negative and self.positive:
            return (xp.asarray(xp.isinf(x)),)
        if self.positive:
            return (xp.asarray(x == np.inf),)
        if self.negative:
            return (xp.asarray(x == -np.inf),)
        return (xp.zeros(x.shape, dtype=bool),)


class Equal(BinaryUfunc):
    op_type, since_version, ufunc = "Equal", 7, "equal"


class Less(BinaryUfunc):
    op_type, since_version, ufunc = "Less", 7, "less"


class Greater(BinaryUfunc):
    op_type, since_version, ufunc = "Greater", 7, "greater"


class LessOrEqual(BinaryUfunc):
    op_type, since_version, ufunc = "LessOrEqual", 12, "less_equal"


class GreaterOrEqual(BinaryUfunc):
    op_type, since_version, ufunc = "GreaterOrEqual", 12, "greater_equal"


# ---- logic and bits ---------------------------------------------------------------------------


class And(BinaryUfunc):
    op_type, since_version, ufunc = "And", 7, "logical_and"


class Or(BinaryUfunc):
    op_type, since_version, ufunc = "Or", 7, "logical_or"


class Xor(BinaryUfunc):
    op_type, since_version, ufunc = "Xor", 7, "logical_xor"


class Not(UnaryUfunc):
    op_type, since_version, ufunc = "Not", 1, "logical_not"


class BitwiseAnd(BinaryUfunc):
    op_type, since_version, ufunc = "BitwiseAnd", 18, "bitwise_and"


class BitwiseOr(BinaryUfunc):
    op_type, since_version, ufunc = "BitwiseOr", 18, "bitwise_or"


class BitwiseXor(BinaryUfunc):
    op_type, since_version, ufunc = "BitwiseXor", 18, "bitwise_xor"


class BitwiseNot(UnaryUfunc):
    op_type, since_version, ufunc = "BitwiseNot", 18, "invert"


class BitShift(BinaryUfunc):
    """numpy's shifts already give ONNX's answers for shifts past the width (0, or -1 for a
    negative value shifted right), so the direction is the whole kernel."""

    op_type = "BitShift"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        direction = node.attributes.get("direction")
        value = None if direction is None else direction.value
        if value not in ("LEFT", "RIGHT"):
            raise ValueError(
                f"BitShift node '{node.name}': attribute 'direction' must be 'LEFT' or 'RIGHT', got {value!r}"
            )
        self.ufunc = "left_shift" if value == "LEFT" else "right_shift"
        super().__init__(node, opset, backend)


# ---- selection and range ------------------------------------------------------------------------


class Where(Kernel):
    """out = x where condition else y.

    On numpy, where one side is a single value and the condition and the other side already have
    the result's shape (the attention fusion's guard, Where(IsNaN(out), 0, out) over the
    (B, S, D) context, and the unfused graph's over the (B, N, S, T) softmax), that side is copied
    and the single value written where it belongs: np.where's broadcasting loop took 4.7 µs at
    (1, 32, 256) float32, the copy and `copyto` 1.6.
    """

    op_type = "Where"
    since_version = 9

    def run(self, condition, x, y):
        xp = self.xp
        if xp is np and x.dtype == y.dtype and condition.dtype == np.bool_:
            if x.size == 1 and y.shape == condition.shape and y.ndim >= x.ndim:
                out = y.copy()
                np.copyto(out, x.reshape(()), where=condition)
                return (out,)
            if y.size == 1 and x.shape == condition.shape and x.ndim >= y.ndim:
                out = x.copy()
                np.copyto(out, y.reshape(()), where=~condition)
                return (out,)
        return (xp.asarray(xp.where(condition, x, y)),)


class Clip_1(Kernel):
    """Before opset 11 the bounds are float attributes."""

    op_type = "Clip"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.low = float(self.attr("min", -np.inf))
        self.high = float(self.attr("max", np.inf))

    def run(self, x):
        return (self.xp.asarray(self.xp.clip(x, self.low, self.high)),)


class Clip_11(Kernel):
    """From opset 11 the bounds are optional 0-d inputs of x's type. When min > max every
    value becomes max, which maximum-then-minimum gives."""

    op_type = "Clip"
    since_version = 11

    def run(self, x, low=None, high=None):
        xp = self.xp
        if low is not None:
            x = xp.maximum(x, low)
        if high is not None:
            x = xp.minimum(x, high)
        return (xp.asarray(x),)


# ---- casts --------------------------------------------------------------------------------------

_SATURATING_FLOAT8 = {
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_FLOAT8_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_STRING = np.dtype(object)


def _to_float8_e8m0(xp, x, saturate: bool, round_mode: str):
    """E8M0 is a bare float32 exponent: the result's bits are x's exponent field, rounded
    by the mantissa per `round_mode`; NaN and infinities map to the NaN encoding 0xFF."""
    bits = x.astype(np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    mantissa = bits & 0x7FFFFF
    special = exponent == 0xFF
    if round_mode == "up":
        bump = mantissa > 0
    elif round_mode == "nearest":
        # Round half to even on the exponent's lowest bit (guard bit 22, sticky below it).
        guard = (mantissa & 0x400000) > 0
        sticky = (mantissa & 0x3FFFFF) > 0
        bump = guard & (sticky | (exponent > 0))
    else:  # "down"
        bump = xp.zeros(exponent.shape, dtype=bool)
    if saturate:
        bump &= exponent != 0xFE
    exponent = exponent + bump.astype(np.uint16)
    result = xp.where(special, np.uint16(0xFF), exponent).astype(np.uint8)
    return result.view(ml_dtypes.float8_e8m0fnu)


def cast_array(xp, x, dtype: np.dtype, saturate: bool = True, round_mode: str = "up"):
    """x converted to dtype with ONNX Cast semantics: floats truncate toward zero into
    integers, float8 targets clip to their finite range when `saturate`, E8M0 rounds its
    exponent per `round_mode`, numbers become their shortest decimal strings."""
    if dtype in _SATURATING_FLOAT8 and saturate and x.dtype not in _SATURATING_FLOAT8:
        info = ml_dtypes.finfo(dtype)
        return xp.clip(x.astype(np.float32), float(info.min), float(info.max)).astype(dtype)
    if dtype == _FLOAT8_E8M0:
        return _to_float8_e8m0(xp, x, saturate, round_mode)
    if dtype == _STRING:
        return xp.asarray(_as_strings(np.asarray(x)), dtype=object)
    if x.dtype == _STRING:
        return x.astype(np.str_).astype(dtype)
    return x.astype(dtype)


def _as_strings(x: np.ndarray) -> np.ndarray:
    """Numbers as the spec spells them: the special values as its reserved literals ("INF", "-INF",
    "NaN"), booleans as "1" and "0" as onnxruntime writes them (numpy's "True" reads back as no number)."""
    if x.dtype == np.bool_:
        return np.where(x, "1", "0")
    text = x.astype(np.str_)
    if x.dtype.kind == "f":
        wide = x.astype(np.float64)
        text = np.select([np.isnan(wide), np.isposinf(wide), np.isneginf(wide)], ["NaN", "INF", "-INF"], text)
    return text


def _onnx_dtype(to: Any, node: ir.Node) -> np.dtype:
    try:
        data_type = ir.DataType[to] if isinstance(to, str) else ir.DataType(to)
        return np.dtype(data_type.numpy())
    except (KeyError, ValueError, TypeError) as error:
        raise UnsupportedOp(
            f"Cast node '{node.name}': attribute 'to'={to!r} is not a type numpy can hold ({error})"
        ) from error


class Cast(Kernel):
    """Cast-1 names the target type as a string ("FLOAT"); later versions as an enum."""

    op_type = "Cast"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        to = self.attr("to")
        if to is None:
            raise ValueError(f"Cast node '{node.name}' has no 'to' attribute")
        self.dtype = _onnx_dtype(to, node)
        self.saturate = bool(self.attr("saturate", 1))
        self.round_mode = self.attr("round_mode", "up")
        if self.round_mode not in ("up", "down", "nearest"):
            raise ValueError(
                f"Cast node '{node.name}': attribute 'round_mode' must be up, down or nearest, "
                f"got {self.round_mode!r}"
            )

    def run(self, x):
        return (self.xp.asarray(cast_array(self.xp, x, self.dtype, self.saturate, self.round_mode)),)


class CastLike(Cast):
    """Cast to the type of a second input; the target is only known when it runs."""

    op_type = "CastLike"
    since_version = 15

    def __init__(self, node, opset, backend=numpy_backend):
        Kernel.__init__(self, node, opset, backend)
        self.saturate = bool(self.attr("saturate", 1))
        self.round_mode = self.attr("round_mode", "up")

    def run(self, x, like):
        return (self.xp.asarray(cast_array(self.xp, x, like.dtype, self.saturate, self.round_mode)),)


class BitCast(Kernel):
    """The same bytes read as another type of the same width (opset 26): a view, no copy.
    numpy's dtypes are little-endian on every platform we run on, as the spec asks."""

    op_type = "BitCast"
    since_version = 26

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.dtype = _onnx_dtype(self.attr("to"), node)

    def run(self, x):
        if x.dtype.itemsize != self.dtype.itemsize or x.dtype.kind in "OUS":
            raise ValueError(
                f"BitCast '{self.node.name}': {x.dtype} and {self.dtype} differ in width, or are strings"
            )
        contiguous = x if x.flags.c_contiguous else x.copy()  # ascontiguousarray would make a 0-d x 1-d
        return (contiguous.view(self.dtype),)


KERNELS = [
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Mod,
    Max,
    Min,
    Sum,
    Mean,
    Neg,
    Abs,
    Reciprocal,
    Sqrt,
    Exp,
    Log,
    Ceil,
    Floor,
    Round,
    Sign,
    Erf,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    IsNaN,
    IsInf,
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
    And,
    Or,
    Xor,
    Not,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    BitwiseNot,
    BitShift,
    Where,
    Clip_1,
    Clip_11,
    Cast,
    CastLike,
    BitCast,
]
