"""erf, which numpy lacks (and scipy is not a dependency): the rational fits the Erf and Gelu
kernels compute with numpy, and the float32 coefficients the compiled loops use
(runtime/kernels/compiled.py). float64 uses Cephes' rational approximations (Moshier, public
domain; the ones scipy compiles), accurate to double precision: erf for |x| <= 1, erfc for
1 < |x| < 8, and 1 beyond (erfc(8) ~ 1e-29). Everything narrower uses the float32 rational
approximation Eigen and XLA use (x * P(x^2) / Q(x^2) on [-4, 4], a few ulp), which costs a third
of the passes: Gelu is on the hot path of every BERT.
"""

from __future__ import annotations

import numpy as np

_ERF_NUM = (
    9.60497373987051638749e0,
    9.00260197203842689217e1,
    2.23200534594684319226e3,
    7.00332514112805075473e3,
    5.55923013010394962768e4,
)
_ERF_DEN = (
    1.0,
    3.35617141647503099647e1,
    5.21357949780152679795e2,
    4.59432382970980127987e3,
    2.26290000613890934246e4,
    4.92673942608635921086e4,
)
_ERFC_NUM = (
    2.46196981473530512524e-10,
    5.64189564831068821977e-1,
    7.46321056442269912687e0,
    4.86371970985681366614e1,
    1.96520832956077098242e2,
    5.26445194995477358631e2,
    9.34528527171957607540e2,
    1.02755188689515710272e3,
    5.57535335369399327526e2,
)
_ERFC_DEN = (
    1.0,
    1.32281951154744992508e1,
    8.67072140885989742329e1,
    3.54937778887819891062e2,
    9.75708501743205489753e2,
    1.82390916687909736289e3,
    2.24633760818710981792e3,
    1.65666309194161350182e3,
    5.57535340817727675546e2,
)
ERF32_NUM = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
ERF32_DEN = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
              -7.37332916720468e-03, -1.42647390514189e-02)  # fmt: skip
ERF32_NUM = tuple(np.float32(c) for c in ERF32_NUM)
ERF32_DEN = tuple(np.float32(c) for c in ERF32_DEN)


def _horner(coefficients, x):
    """The polynomial with these coefficients (highest power first) at x, into a fresh array."""
    result = x * coefficients[0]
    result += coefficients[1]
    for c in coefficients[2:]:
        result *= x
        result += c
    return result


def _erf64(xp, x):
    ax = xp.abs(x)
    near = xp.minimum(ax, 1.0)
    z = near * near
    erf_near = near * _horner(_ERF_NUM, z)
    erf_near /= _horner(_ERF_DEN, z)
    far = xp.clip(ax, 1.0, 8.0)
    erfc_far = xp.exp(-far * far) * _horner(_ERFC_NUM, far)
    erfc_far /= _horner(_ERFC_DEN, far)
    result = xp.where(ax <= 1.0, erf_near, 1.0 - erfc_far)  # NaN fails `<=` and stays NaN via clip
    return xp.copysign(result, x)


def _erf32(xp, x):
    x = xp.clip(x, np.float32(-4.0), np.float32(4.0))
    x2 = x * x
    result = _horner(ERF32_NUM, x2)
    result *= x
    result /= _horner(ERF32_DEN, x2)
    return xp.clip(result, np.float32(-1.0), np.float32(1.0))  # the fit overshoots 1 by an ulp or two


def erf(xp, x):
    """erf of a float array, in x's dtype: to double precision for float64, to a few float32
    ulp for float32 and narrower types (computed in float32)."""
    if x.dtype == np.float64:
        return _erf64(xp, x)
    if x.dtype == np.float32:
        return _erf32(xp, x)
    return _erf32(xp, x.astype(np.float32)).astype(x.dtype)
