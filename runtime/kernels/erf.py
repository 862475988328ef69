"""erf evaluated inside a fused kernel's own buffers (numpy has no erf; scipy isn't a dependency).

The Erf kernel's erf (runtime/kernels/elementwise.py) is a float64 rational approximation that
allocates its temporaries; that is right for Erf, but a fused Gelu must not pay float64 traffic
and a dozen temporaries, or it would be no cheaper than the chain it replaces. This one works in
place, in the buffers' own dtype.

Abramowitz & Stegun 7.1.26: erf(|z|) = 1 - t(a1 + t(a2 + t(a3 + t(a4 + t a5)))) exp(-z^2), with
t = 1 / (1 + p|z|). Its absolute error is below 1.5e-7 in exact arithmetic, and it needs five
multiply-adds and one exp, where a series for small |z| plus a continued fraction for large |z|
would need a branch (two passes over every element) to stay accurate at both ends.

Measured against math.erf in tests/runtime/test_kernels_contrib.py: in float32 the 1 - poly*exp
cancellation costs a few ulps, abs error < 7e-7. Gelu multiplies it by x/2, so Gelu's relative
error stays below 1e-6, far inside the fp32 tolerance.

`erf_scaled(x, scale, out, scratch)` computes erf(scale * x) without forming scale * x: the
scale folds into p and into the exponent, which is what Gelu wants (erf(x / sqrt(2))). It writes
into caller-owned buffers so a fused kernel allocates nothing here.
"""

from __future__ import annotations

from typing import Any

_P = 0.3275911
_A1 = 0.254829592
_A2 = -0.284496736
_A3 = 1.421413741
_A4 = -1.453152027
_A5 = 1.061405429


def erf_scaled(xp: Any, x: Any, scale: float, out: Any, scratch: Any) -> Any:
    """erf(scale * x) into `out`, using `scratch` (same shape and dtype); `x` is only read.

    `out` may not alias `x`; `scratch` is clobbered.
    """
    dtype = out.dtype.type
    xp.abs(x, out=scratch)
    xp.multiply(scratch, dtype(_P * abs(scale)), out=out)
    out += dtype(1.0)
    xp.reciprocal(out, out=out)  # out = t
    # Horner's rule for the polynomial in t, accumulated in scratch.
    xp.multiply(out, dtype(_A5), out=scratch)
    scratch += dtype(_A4)
    scratch *= out
    scratch += dtype(_A3)
    scratch *= out
    scratch += dtype(_A2)
    scratch *= out
    scratch += dtype(_A1)
    scratch *= out
    # exp(-(scale x)^2), formed from x again since |x| was overwritten by the polynomial.
    xp.multiply(x, x, out=out)
    out *= dtype(-scale * scale)
    xp.exp(out, out=out)
    out *= scratch
    xp.subtract(dtype(1.0), out, out=out)  # erf(|scale x|)
    if scale < 0:
        xp.negative(x, out=scratch)
        return xp.copysign(out, scratch, out=out)
    return xp.copysign(out, x, out=out)
