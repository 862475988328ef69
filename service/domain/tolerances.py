"""Which tolerance a compared tensor gets: the project's rtol/atol for float32/float64, one derived from
the type's precision and the depth of the computation for 16-bit (and 8-bit) floats, exact equality for
integers and booleans.

A 16-bit float carries ~3 (float16) or ~2 (bfloat16) significant decimal digits: two engines that order
a reduction differently, or round an intermediate once more, differ by an ulp or more, and float32's
rtol 1e-3 / atol 1e-4 fails a correct float16 model (measured: 2.4e-4 to 4.9e-4 on an Optimum
float16 Llama, onnxruntime against ours). So a narrow type is compared within

    |got - ref| <= sqrt(d) * (rtol_u * u * |ref|  +  atol_u * u * max|ref|)

u its unit roundoff (float16 2^-11 = 4.9e-4, bfloat16 2^-8 = 3.9e-3), max|ref| the largest finite
magnitude in the reference tensor (floored at the type's smallest normal), d the number of reductions
(MatMul, normalization, Softmax, ...) on the longest path to the tensor (at least 1;
service/adapters/engines/precision.py). The absolute term is relative to the tensor's scale, not a fixed
number: an element near zero that comes out of cancellation (a LayerNorm's output, a logit) carries the
rounding of the operands it was computed from, an ulp of the tensor's scale, not of itself (measured on
float16 BERT/GPT-2/Llama/Qwen2: up to 2,200 ulps of the element, never over 2.3 u of max|ref|). A fixed
atol would be too tight for a residual stream in the hundreds and too loose for a tensor whose values
are all ~1e-3.

sqrt(d): each reduction is a place where correct engines round differently, and those independent
differences add up along the path as a random walk does (the probabilistic rounding-error bound,
Higham & Mary 2019, grows as sqrt(n) u). Measured, the largest difference between the engines is
0.10-0.17 sqrt(d) of the first, depth-blind bound 8 u |ref| + 4 u max|ref|, from a MatMul block (d 2)
through 2-layer models (d 20) to BERT-base and GPT-2 small (d 110); that first bound, set on 2-layer
models, failed correct 12-layer ones (1.07 on BERT-base's pooler, onnxruntime against us; 1.9 our fused
graph against our unfused one). It is the depth, not the length of the last op's reduction.

Defaults rtol_u 4, atol_u 2 (float16, d 1: 2.0e-3 |ref| + 9.8e-4 max|ref|; d 110: 2.0e-2 |ref| +
1.0e-2 max|ref|): the measured differences stay at or under 0.36 of the bound at every depth (our fused
against unfused BERT-base the highest: it grows a little faster than sqrt(d)), a bias 3% off fails a
MatMul block 4-fold and a dropped bias fails BERT-base 8- to 19-fold. A bias 3% off deep in BERT-base
(0.003 on unit-sized activations) is within what correct engines differ by there, and passes
(docs/numerics.md, "16-bit floats").

A tensor computed from narrower ones (float32 logits cast up at the end of a float16 model, an
RMSNorm's float32 variance) is compared at the narrowest type its value passed through
(service/adapters/engines/precision.py): the ulp of difference upstream is still in it.

Quantized activations are such a narrow type too. A model quantized as users quantize for the CPU
(onnxruntime.quantization's quantize_dynamic, QDQ exports) rounds each activation to one of 256 levels
across its range (DynamicQuantizeLinear, QuantizeLinear): where two engines' float inputs differ in the
last bit, an element on a rounding boundary lands one level apart, one step of range/255, and the
MatMulInteger after it multiplies that step into every output it feeds. So a tensor computed from
b-bit quantized values takes u = 2^-b of its largest magnitude, as a b-bit float does (8 bits: 2^-8,
bfloat16's), its integer tensors included (compared as numbers, not exactly). Measured on a
quantize_dynamic BERT: onnxruntime against our engine were 38 times float32's bound apart, and
onnxruntime's own fused graph (DynamicQuantizeMatMul) against its unfused one 1.25 times
(docs/numerics.md, "Quantized models").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Significand bits (with the implicit one) of the floating types numpy and ml_dtypes name; a name not
# here is compared exactly. complex64/128 are float32/float64 pairs.
SIGNIFICAND_BITS = {
    "float64": 53, "complex128": 53, "float32": 24, "complex64": 24,
    "float16": 11, "bfloat16": 8,
    "float8_e4m3fn": 4, "float8_e4m3fnuz": 4, "float8_e4m3b11fnuz": 4, "float8_e5m2": 3, "float8_e5m2fnuz": 3,
}  # fmt: skip
# Integer types that hold quantized values, by their bits; an activation quantized to one carries a
# narrow precision on ("uint8 quantized"), its integer tensors and the floats dequantized from them.
QUANTIZED_BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16}
QUANTIZED = " quantized"
PRECISION_BITS = {**SIGNIFICAND_BITS, **{f"{name}{QUANTIZED}": bits for name, bits in QUANTIZED_BITS.items()}}
# At or above this the project's rtol/atol apply (float32, float64): they were chosen for float32.
WIDE_BITS = 24
# Per square root of a tensor's reduction depth.
RTOL_ROUNDOFFS = 4.0
ATOL_ROUNDOFFS = 2.0


def is_float(dtype: str) -> bool:
    return dtype in SIGNIFICAND_BITS


def is_quantized(precision: str | None) -> bool:
    return precision is not None and precision.endswith(QUANTIZED)


def quantized(integer_type: str) -> str:
    """The precision an activation quantized to `integer_type` carries ("uint8 quantized")."""
    return f"{integer_type if integer_type in QUANTIZED_BITS else 'uint8'}{QUANTIZED}"


def unit_roundoff(dtype: str) -> float:
    return 2.0 ** -PRECISION_BITS[dtype]


def narrowest(*dtypes: str | None) -> str | None:
    """The precision of fewest bits among `dtypes`, floating types and quantized activations (anything
    else and None ignored)."""
    known = [d for d in dtypes if d is not None and d in PRECISION_BITS]
    return min(known, key=PRECISION_BITS.__getitem__, default=None)


@dataclass(frozen=True)
class Tolerance:
    """How one tensor is compared: |got - ref| <= rtol * |ref| + atol (* max|ref| when `scaled`)."""

    dtype: str  # the type whose precision set it
    rtol: float
    atol: float
    scaled: bool = False  # atol in units of the reference tensor's largest magnitude
    depth: int = 1  # reductions deep, for a narrow type: rtol and atol already hold its sqrt

    def bound(self, scale: float) -> float:
        """The absolute term for a tensor whose largest finite |ref| is `scale`."""
        return self.atol * scale if self.scaled else self.atol

    def describe(self, scale: float | None = None) -> str:
        """"atol 1e-04 + rtol 1e-03 × |ref|", or for a narrow type the scaled term with its value."""
        if not self.scaled:
            return f"atol {self.atol:.1e} + rtol {self.rtol:.1e} × |ref|"
        of = f" (max|ref| {scale:.2g}: {self.bound(scale):.1e})" if scale is not None else ""
        return f"atol {self.atol:.1e} × max|ref|{of} + rtol {self.rtol:.1e} × |ref|"


@dataclass(frozen=True)
class Tolerances:
    """A project's tolerances (Protocol's rtol, atol, rtol_16bit_roundoffs, atol_16bit_roundoffs)."""

    rtol: float = 1e-3
    atol: float = 1e-4
    rtol_roundoffs: float = RTOL_ROUNDOFFS
    atol_roundoffs: float = ATOL_ROUNDOFFS

    def for_dtype(self, dtype: str, depth: int = 1) -> Tolerance | None:
        """None: neither a floating type nor a quantized precision, compared exactly. `depth`: reductions on the longest path to the
        tensor, which widens a narrow type's bound by its square root (float32 keeps rtol/atol)."""
        if dtype not in PRECISION_BITS:
            return None
        if PRECISION_BITS[dtype] >= WIDE_BITS:
            return Tolerance(dtype, self.rtol, self.atol)
        depth = max(1, depth)
        u = unit_roundoff(dtype) * math.sqrt(depth)
        return Tolerance(dtype, self.rtol_roundoffs * u, self.atol_roundoffs * u, scaled=True, depth=depth)
