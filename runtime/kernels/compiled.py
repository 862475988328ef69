"""Compiled inner loops for the fused kernels (com.microsoft, and the channels-last pool) on numpy, float32.

A fused kernel exists to be cheaper than the chain it replaces, and that has to show in our own
timings, not only in ONNX Runtime's. numpy cannot run a chain of elementwise steps in one pass:
every ufunc reads and writes the whole tensor, so BiasGelu is about twenty passes over a
1x128x3072 tensor however the buffers are reused, and it stays several times slower than the
one-pass loop ONNX Runtime runs. These loops do each fused op in one pass over its rows (two or
three passes over one row while it sits in L1, for the normalizations and softmax), compiled by
numba for the host CPU.

What the loops rely on, and why:
  - No transcendental library calls in a loop body. This numba has no SVML, so `math.exp` or
    `math.tanh` would be a scalar call per element and stop LLVM from vectorizing. erf is the
    float32 rational fit Eigen and XLA use (the coefficients of runtime/kernels/elementwise.py's
    Erf, so there is one erf in the project), tanh is Eigen's float32 rational fit, and exp is
    Cephes' expf (range reduction by ln 2, a degree-5 polynomial, the power of two built in the
    exponent bits). Each is a few ulp; tests/runtime/test_kernels_contrib.py measures them.
  - Clamps are conditional expressions, not min()/max(): they compile to vector selects.
  - 512-bit vectors where the CPU has them: each row loop starts with `wide_vectors()`.
  - No two arrays a loop writes and reads may alias: LLVM vectorizes behind a run-time overlap
    check and runs the scalar loop when it fails (see `skip_layer_norm_rows`).
  - fastmath without `nnan`/`ninf`: reassociation (so row sums vectorize), contraction into FMA,
    reciprocal division; but infinities and NaNs keep their IEEE meaning, as the masks rely on
    (-inf, the float32 minimum) and as onnxruntime's results have them.
  - `cache=True`: compiling all loops takes seconds; the machine code is written next to this
    module (`__pycache__`, or numba's user-wide cache directory where that is read-only) and
    reused by every later process. Where numba finds nowhere to write, the loops compile per
    process (`_compiled`). numba keys the cache on this file's content only, so a change to the
    erf coefficients in elementwise.py reaches these loops once the stale cache is deleted
    (`rm runtime/kernels/__pycache__/compiled.*.nb[ci]`) or this file changes.
  - Rows split across threads only on the products' own workers. prange over rows halves
    BiasGelu on its own (0.21 -> 0.11 ms on the 2-core target), but on numba's default pool
    it made a whole BERT-base run slower, 121 -> 199 ms: numba's workers and the BLAS's both
    spin-wait after their parallel regions and steal each other's cores. So each row loop is a
    `_span` over rows lo..hi plus a `_chunks` twin running the span in parts under prange, and
    `_split` takes the twin only where numba's omp layer shares Intel OpenMP's workers with MKL
    and oneDNN and the session's workers spin (runtime/kernels/row_threads.py).

Callers pass C-contiguous float32 views (2-D rows, `rows = x.reshape(-1, width)`, for the row
loops; flat for Erf; (N, H, W, C) for the channels-last max pool); anything else takes the
kernels' numpy path.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, prange, types
from numba.extending import intrinsic

from runtime.kernels import row_threads
from runtime.kernels.erf_fit import ERF32_DEN, ERF32_NUM

# No `nnan`/`ninf`: see the module docstring.
JIT_OPTIONS = {
    "fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"},
    "error_model": "numpy",
    "boundscheck": False,
    "nogil": True,
}


def _compiled(function=None, **extra):
    """numba.njit with this module's options, cached on disk where numba finds a place to write.

    numba looks for a writable `__pycache__` beside this file, then a user-wide cache directory;
    where neither exists (a read-only install with no writable home) it raises at decoration,
    which would make the whole runtime unimportable. There the loops compile per process instead
    (seconds at first use, the same machine code).
    """

    def decorate(python_function):
        try:
            return njit(cache=True, **JIT_OPTIONS, **extra)(python_function)
        except RuntimeError as error:
            if "cannot cache" not in str(error):
                raise
            return njit(cache=False, **JIT_OPTIONS, **extra)(python_function)

    return decorate if function is None else decorate(function)


_F = np.float32
_F32_DTYPE = np.dtype(np.float32)
# An absent bias (or residual row) for the loops that take one: (0,)-shaped, so each loop has one
# compiled signature with or without it.
NO_BIAS = np.zeros(0, np.float32)
_SQRT_HALF = _F(1.0 / math.sqrt(2.0))
_SQRT_2_OVER_PI = _F(math.sqrt(2.0 / math.pi))
_FAST_GELU_CUBIC = _F(math.sqrt(2.0 / math.pi) * 0.044715)
_ERF_P0, _ERF_P1, _ERF_P2, _ERF_P3, _ERF_P4, _ERF_P5, _ERF_P6 = ERF32_NUM
_ERF_Q0, _ERF_Q1, _ERF_Q2, _ERF_Q3, _ERF_Q4 = ERF32_DEN


def accepts(xp, *arrays) -> bool:
    """Whether these loops can take the arrays: numpy (not CuPy), float32, C-contiguous, non-empty.

    Anything else (float64, float16, strided views, empty tensors, a GPU backend) takes the
    kernel's array-API path, which is also the reference these loops are tested against.
    """
    if xp is not np:
        return False
    for a in arrays:  # a loop, not all() over a generator: half the cost, on every fused kernel's call
        if not isinstance(a, np.ndarray) or a.dtype != _F32_DTYPE or not a.flags.c_contiguous or not a.size:
            return False
    return True


# ---------------------------------------------------------------- scalar building blocks


@_compiled(inline="always")
def erf32(x):
    """Eigen's float32 erf: x P(x^2) / Q(x^2) on [-4, 4] (erf(4) = 1 - 1.5e-8), clipped to [-1, 1].

    The clamps are written so that NaN fails them and stays NaN (the Erf kernel returns it).
    """
    x = _F(4.0) if x > _F(4.0) else x
    x = _F(-4.0) if x < _F(-4.0) else x
    x2 = x * x
    p = (
        (((((_ERF_P0 * x2 + _ERF_P1) * x2 + _ERF_P2) * x2 + _ERF_P3) * x2 + _ERF_P4) * x2 + _ERF_P5) * x2
        + _ERF_P6
    ) * x
    q = (((_ERF_Q0 * x2 + _ERF_Q1) * x2 + _ERF_Q2) * x2 + _ERF_Q3) * x2 + _ERF_Q4
    r = p / q
    r = _F(1.0) if r > _F(1.0) else r  # the fit overshoots 1 by an ulp or two
    return _F(-1.0) if r < _F(-1.0) else r


_TANH_ALPHA = tuple(
    _F(c)
    for c in (
        -2.76076847742355e-16,
        2.00018790482477e-13,
        -8.60467152213735e-11,
        5.12229709037114e-08,
        1.48572235717979e-05,
        6.37261928875436e-04,
        4.89352455891786e-03,
    )
)
_TANH_BETA = tuple(
    _F(c) for c in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
)
_TANH_P0, _TANH_P1, _TANH_P2, _TANH_P3, _TANH_P4, _TANH_P5, _TANH_P6 = _TANH_ALPHA
_TANH_Q0, _TANH_Q1, _TANH_Q2, _TANH_Q3 = _TANH_BETA
_TANH_CLAMP = _F(7.90531110763549805)  # beyond it tanh rounds to +-1 in float32


@_compiled(inline="always")
def tanh32(x):
    """Eigen's float32 tanh: x P(x^2) / Q(x^2) on [-7.905, 7.905]."""
    x = x if x < _TANH_CLAMP else _TANH_CLAMP
    x = x if x > -_TANH_CLAMP else -_TANH_CLAMP
    x2 = x * x
    p = (
        (((((_TANH_P0 * x2 + _TANH_P1) * x2 + _TANH_P2) * x2 + _TANH_P3) * x2 + _TANH_P4) * x2 + _TANH_P5)
        * x2
        + _TANH_P6
    ) * x
    q = ((_TANH_Q0 * x2 + _TANH_Q1) * x2 + _TANH_Q2) * x2 + _TANH_Q3
    return p / q


@intrinsic
def _float32_from_bits(typingctx, bits):
    """Reinterpret an int32's bits as a float32 (a register move; LLVM vectorizes it)."""
    signature = types.float32(types.int32)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())

    return signature, codegen


@intrinsic
def _float32_bits(typingctx, value):
    """Reinterpret a float32's bits as an int32."""
    signature = types.int32(types.float32)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], llvm_ir.IntType(32))

    return signature, codegen


class _WideVectorAttributes(llvm_ir.FunctionAttributes):
    """A function's attributes plus LLVM's "prefer-vector-width"="512" (llvmlite knows no string
    attributes). Never empty, so llvmlite prints it even for a function with no other attribute."""

    def __bool__(self):
        return True

    def _to_list(self, *args):
        return [*super()._to_list(*args), '"prefer-vector-width"="512"']


@intrinsic
def wide_vectors(typingctx):
    """Vectorize the calling loop function at 512 bits where the CPU has AVX-512.

    LLVM's x86 tuning for most AVX-512 CPUs prefers 256-bit vectors (Intel's older parts
    lowered their clock under 512-bit work), and numba exposes no option for it. On the 2-core
    target (Xeon, AVX-512) the loops measured faster at 512 bits, single-threaded: BiasGelu
    0.204 -> 0.157 ms at 1x128x3072, FastGelu 0.222 -> 0.157, SkipLayerNorm 0.052 -> 0.034 at
    1x128x768 (`taskset -c 1 python -m bench.fused_kernels --threads 1`, the `256-bit` column). The attribute is only a preference: where the CPU lacks AVX-512, LLVM
    uses the widest vectors it has. It reaches the caller's LLVM function while numba lowers
    the call; the intrinsic itself emits no code.
    """

    def codegen(context, builder, signature, args):
        function = builder.function
        if not isinstance(function.attributes, _WideVectorAttributes):
            wide = _WideVectorAttributes(function.attributes)
            wide.alignstack = function.attributes.alignstack
            wide.personality = function.attributes.personality
            function.attributes = wide
        return context.get_dummy_value()

    return types.none(), codegen


_SIGN_SHIFT = np.int32(31)
_MAGNITUDE = np.int32(0x7FFFFFFF)
_LOWEST_KEY = np.int32(-(2**31))


@_compiled(inline="always")
def _ordered_bits(x):
    """An int32 that orders as the float32 x does: negative floats get their magnitude bits flipped."""
    bits = _float32_bits(x)
    return bits ^ ((bits >> _SIGN_SHIFT) & _MAGNITUDE)


@_compiled(inline="always")
def _ordered_bits_inverse(key):
    """The float32 bits `_ordered_bits` came from (the map is its own inverse)."""
    return key ^ ((key >> _SIGN_SHIFT) & _MAGNITUDE)


_INF = _F(np.inf)
_EXP_HI = _F(88.3762626647949)  # exp overflows float32 above it
# Below it exp(x) < 3e-38 and we return 0: the last normal float32s would cost a subnormal
# intermediate (a microcode assist, ~100x slower per element) on every masked score.
_EXP_LO = _F(-86.5)
_LOG2E = _F(1.44269504088896341)
_LN2_HI, _LN2_LO = _F(0.693359375), _F(-2.12194440e-4)
_EXP_POLY = tuple(
    _F(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    )
)
_EXP_P0, _EXP_P1, _EXP_P2, _EXP_P3, _EXP_P4, _EXP_P5 = _EXP_POLY


@_compiled(inline="always")
def exp32(x):
    """Cephes' expf: exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln 2 / 2.

    inf above 88.376 (exact exp overflows at 88.72: the softmax never asks, its arguments are <= 0),
    0 below -86.5.
    """
    xc = x if x < _EXP_HI else _EXP_HI
    xc = xc if xc > _EXP_LO else _EXP_LO
    n = np.floor(xc * _LOG2E + _F(0.5))
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    r2 = r * r
    y = (
        (((((_EXP_P0 * r + _EXP_P1) * r + _EXP_P2) * r + _EXP_P3) * r + _EXP_P4) * r + _EXP_P5) * r2
        + r
        + _F(1.0)
    )
    y = y * _float32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))
    y = y if x < _EXP_HI else _INF
    return y if x > _EXP_LO else _F(0.0)


@_compiled(inline="always")
def _gelu(x):
    return _F(0.5) * x * (_F(1.0) + erf32(x * _SQRT_HALF))


@_compiled(inline="always")
def _fast_gelu(x):
    inner = x * (_SQRT_2_OVER_PI + _FAST_GELU_CUBIC * x * x)
    return _F(0.5) * x * (_F(1.0) + tanh32(inner))


# ---------------------------------------------------------------- activations


def _split(span, chunked, rows, elements, *args):
    """Run a row loop over all its rows: in `row_threads.chunks` parts on the products' OpenMP
    workers when that is more than one, else on this thread."""
    parts = row_threads.chunks(rows, elements)
    if parts > 1:
        chunked(*args, parts)
    else:
        span(*args, 0, rows)


@_compiled(inline="always")
def _chunk_start(rows, chunks, c):
    return rows * c // chunks


@_compiled
def erf_values(x, out):
    """out = erf(x) over flat (size,) views: the Erf kernel's float32 path, one pass instead of ~15."""
    wide_vectors()
    for i in range(x.shape[0]):
        out[i] = erf32(x[i])


def gelu_rows(x, out):
    """out = Gelu(x), exact (erf) form; x and out are (rows, width)."""
    _split(gelu_span, gelu_chunks, x.shape[0], x.size, x, NO_BIAS, False, out)


def bias_gelu_rows(x, bias, out):
    """out = Gelu(x + bias), bias broadcast over the rows."""
    _split(gelu_span, gelu_chunks, x.shape[0], x.size, x, bias, False, out)


def fast_gelu_rows(x, out):
    """out = FastGelu(x), the tanh form."""
    _split(gelu_span, gelu_chunks, x.shape[0], x.size, x, NO_BIAS, True, out)


def bias_fast_gelu_rows(x, bias, out):
    """out = FastGelu(x + bias)."""
    _split(gelu_span, gelu_chunks, x.shape[0], x.size, x, bias, True, out)


@_compiled
def gelu_span(x, bias, fast, out, lo, hi):
    """Rows lo..hi of Gelu or FastGelu (`fast`), plus the bias where it is not (0,)-shaped; LLVM
    unswitches the two loop-invariant branches, so each of the four loops vectorizes."""
    wide_vectors()
    with_bias = bias.shape[0] > 0
    for i in range(lo, hi):
        for j in range(x.shape[1]):
            v = x[i, j] + bias[j] if with_bias else x[i, j]
            out[i, j] = _fast_gelu(v) if fast else _gelu(v)


@_compiled(parallel=True)
def gelu_chunks(x, bias, fast, out, chunks):
    rows = x.shape[0]
    for c in prange(chunks):
        wide_vectors()
        gelu_span(x, bias, fast, out, _chunk_start(rows, chunks, c), _chunk_start(rows, chunks, c + 1))


# ---------------------------------------------------------------- normalization


def skip_layer_norm_rows(x, skip, bias, gamma, beta, epsilon, centered, out, summed, mean, inv_std):
    """out = normalize(x + skip + bias) * gamma + beta, row by row over (rows, width) views.

    `skip` has rows or a divisor of them (a (S, H) skip repeats for every batch). `summed` gets
    the sum, one row per row of x, or is a single (1, width) scratch row when the sum isn't an
    output; `mean` and `inv_std` get one value per row. `centered=False` is the RMS (simplified)
    form: no mean, mean left 0.

    Why a scratch row and not `out` itself: LLVM vectorizes the last pass (`summed` in, `out`
    out) only behind a run-time check that the two arrays don't overlap, so with `summed` being
    `out` every row ran scalar (SkipLayerNorm at 1x128x768 went 0.071 -> 0.038 ms single-
    threaded once it stopped, `python -m bench.fused_kernels`).

    Statistics are accumulated in float32, as onnxruntime's float kernel does; at hidden 768 the
    rounding is ~1e-7 relative. The variance is taken about the mean in a second pass over the
    row (still in L1) rather than as E[x^2] - mean^2, which cancels when |mean| >> std.
    """
    _split(
        skip_layer_norm_span, skip_layer_norm_chunks, x.shape[0], x.size,
        x, skip, bias, gamma, beta, epsilon, centered, out, summed, mean, inv_std,
    )  # fmt: skip


@_compiled
def skip_layer_norm_span(x, skip, bias, gamma, beta, epsilon, centered, out, summed, mean, inv_std, lo, hi):
    wide_vectors()
    width = x.shape[1]
    skip_rows = skip.shape[0]
    one_row = summed.shape[0] == 1
    scale = _F(1.0) / _F(width)
    for i in range(lo, hi):
        s = i % skip_rows
        row = summed[0 if one_row else i]
        total = _F(0.0)
        for j in range(width):
            value = x[i, j] + skip[s, j] + bias[j]
            row[j] = value
            total += value
        mu = total * scale if centered else _F(0.0)
        square = _F(0.0)
        for j in range(width):
            d = row[j] - mu
            square += d * d
        r = _F(1.0) / np.sqrt(square * scale + epsilon)
        for j in range(width):
            out[i, j] = (row[j] - mu) * r * gamma[j] + beta[j]
        mean[i] = mu
        inv_std[i] = r


@_compiled(parallel=True)
def skip_layer_norm_chunks(
    x, skip, bias, gamma, beta, epsilon, centered, out, summed, mean, inv_std, chunks
):
    rows = x.shape[0]
    for c in prange(chunks):
        wide_vectors()
        # A scratch row of its own per part: one shared row would be written by both threads.
        scratch = summed if summed.shape[0] > 1 else np.empty_like(summed)
        skip_layer_norm_span(
            x, skip, bias, gamma, beta, epsilon, centered, out, scratch, mean, inv_std,
            _chunk_start(rows, chunks, c), _chunk_start(rows, chunks, c + 1),
        )  # fmt: skip


# ---------------------------------------------------------------- attention


def masked_softmax_heads(scores, mask):
    """softmax(scores + mask) over the last axis, in place, for scores (B, N, S, T); see
    `scaled_masked_softmax_heads`."""
    scaled_masked_softmax_heads(scores, _F(1.0), mask)


def scaled_masked_softmax_heads(scores, scale, mask):
    """softmax(scale * scores + mask) over the last axis, in place, for scores (B, N, S, T).

    The scale rides here where the QK^T product that wrote the scores takes no alpha (oneDNN's
    matmul without a scales attribute: runtime/kernels/onednn_heads.py).

    `mask` is additive (Bm, Nm, Sm, T), each of Bm, Nm, Sm either 1 (broadcast) or the scores'
    size: attention's padding mask, its attention_bias, or the two summed. Each score row is
    read once from memory; the max, exp and sum passes run over it in L1. The row max is taken
    over `_ordered_bits` keys: LLVM leaves a float max reduction scalar (about 3x slower here)
    but vectorizes an integer one.
    """
    rows = scores.shape[0] * scores.shape[1] * scores.shape[2]
    _split(softmax_span, softmax_chunks, rows, scores.size, scores, _F(scale), mask)


def masked_softmax_rows(scores, mask):
    """`masked_softmax_heads` with a (Bm, Sm, T) mask, the same for every head."""
    masked_softmax_heads(scores, mask.reshape((mask.shape[0], 1, mask.shape[1], mask.shape[2])))


@_compiled
def softmax_span(scores, scale, mask, lo, hi):
    """Rows lo..hi of the scores' (B * N * S) rows."""
    wide_vectors()
    _, heads, seq, _ = scores.shape
    mask_batches, mask_heads, mask_rows = mask.shape[0], mask.shape[1], mask.shape[2]
    for flat in range(lo, hi):
        b = flat // (heads * seq)
        n = (flat // seq) % heads
        s = flat % seq
        row = scores[b, n, s]
        mask_row = mask[b if mask_batches > 1 else 0, n if mask_heads > 1 else 0, s if mask_rows > 1 else 0]
        peak_key = _LOWEST_KEY
        for t in range(row.shape[0]):
            value = row[t] * scale + mask_row[t]
            row[t] = value
            key = _ordered_bits(value)
            peak_key = key if key > peak_key else peak_key
        peak = _float32_from_bits(_ordered_bits_inverse(peak_key))
        norm = _F(0.0)
        for t in range(row.shape[0]):
            e = exp32(row[t] - peak)
            row[t] = e
            norm += e
        inverse = _F(1.0) / norm
        for t in range(row.shape[0]):
            row[t] *= inverse


@_compiled(parallel=True)
def softmax_chunks(scores, scale, mask, chunks):
    rows = scores.shape[0] * scores.shape[1] * scores.shape[2]
    for c in prange(chunks):
        wide_vectors()
        softmax_span(scores, scale, mask, _chunk_start(rows, chunks, c), _chunk_start(rows, chunks, c + 1))


# Attention small enough for `small_attention`: multiply-adds of its two head products, B S T
# (Dq + Dv), at most 2^20. Up to there the one loop beats the head products on a library, whose
# calls cost ~10 µs each at any size (oneDNN's QK^T of 4 heads of 32x32x64: 11 µs). After the
# projection, µs, loop against oneDNN's products: DistilBERT's dim 256, 4 heads, at sequence
# 32 (524,288) 25.5 / 36.2, 40 39.8 / 42.7, 48 (1,179,648) 50.0 / 49.3, 64 70.6 / 63.6; hidden
# 128, 2 heads, at 64 (1,048,576) 38.6 / 40.8, 96 90.3 / 60.3; 12 heads of 64 at 32 (1,572,864)
# 67.9 / 69.3. Fastest of 1000 interleaved calls, one thread, 2-core AMD EPYC (family 26 model
# 2), load ~2.5: `python -m bench.attention_small`.
SMALL_ATTENTION = 65536 * 16


@_compiled
def small_attention(qkv, bias, dq, dk, heads, scale, mask, out):
    """out (B, S, Dv) = softmax(scale (q + bq)(k + bk)^T + mask) (v + bv) per head, straight from
    the (B, S, Dq + Dk + Dv) projection `qkv` (Dq = Dk), in one call: no separate products,
    softmax and merge. For attention of at most `SMALL_ATTENTION` multiply-adds, where the
    products' calls cost more than their arithmetic. `bias` is (Dq + Dk + Dv,), zeros where the
    node has none; `mask` additive (Bm, Nm, Sm, S) as `masked_softmax_heads` takes it, and the
    softmax is that loop's.

    How the loops vectorize: every inner loop runs over a 1-D row slice (indexing the 3-D
    `qkv` with a computed offset left LLVM's copies scalar: 8 µs of 20 at DistilBERT's shape);
    each head's K and V rows (bias added) are copied once into contiguous scratch; QK^T takes
    four keys per pass over q (four dot products sharing q's loads) and PV four weighted value
    rows per pass over the context row, which it otherwise loads and stores once per key. A
    score is the dot product plus the mask, rounded once, as the products' path computes it.
    """
    wide_vectors()
    batch, seq, width = qkv.shape
    head = dq // heads
    head_v = (width - dq - dk) // heads
    mask_batches, mask_heads, mask_rows = mask.shape[0], mask.shape[1], mask.shape[2]
    fours = seq - seq % 4
    q = np.empty(head, np.float32)
    keys = np.empty((seq, head), np.float32)
    values = np.empty((seq, head_v), np.float32)
    scores = np.empty(seq, np.float32)
    context = np.empty(head_v, np.float32)
    for b in range(batch):
        for n in range(heads):
            q_at, k_at, v_at = n * head, dq + n * head, dq + dk + n * head_v
            q_bias, k_bias, v_bias = bias[q_at : q_at + head], bias[k_at : k_at + head], bias[v_at : v_at + head_v]
            for t in range(seq):
                source = qkv[b, t]
                k_source, k_row = source[k_at : k_at + head], keys[t]
                for i in range(head):
                    k_row[i] = k_source[i] + k_bias[i]
                v_source, v_row = source[v_at : v_at + head_v], values[t]
                for i in range(head_v):
                    v_row[i] = v_source[i] + v_bias[i]
            for s in range(seq):
                q_source = qkv[b, s, q_at : q_at + head]
                for i in range(head):
                    q[i] = (q_source[i] + q_bias[i]) * scale
                for t in range(0, fours, 4):
                    k0, k1, k2, k3 = keys[t], keys[t + 1], keys[t + 2], keys[t + 3]
                    d0 = d1 = d2 = d3 = _F(0.0)
                    for i in range(head):
                        qi = q[i]
                        d0 += qi * k0[i]
                        d1 += qi * k1[i]
                        d2 += qi * k2[i]
                        d3 += qi * k3[i]
                    scores[t], scores[t + 1], scores[t + 2], scores[t + 3] = d0, d1, d2, d3
                for t in range(fours, seq):
                    k_row = keys[t]
                    dot = _F(0.0)
                    for i in range(head):
                        dot += q[i] * k_row[i]
                    scores[t] = dot
                mask_row = mask[b if mask_batches > 1 else 0, n if mask_heads > 1 else 0, s if mask_rows > 1 else 0]
                peak_key = _LOWEST_KEY
                for t in range(seq):
                    value = scores[t] + mask_row[t]
                    scores[t] = value
                    key = _ordered_bits(value)
                    peak_key = key if key > peak_key else peak_key
                peak = _float32_from_bits(_ordered_bits_inverse(peak_key))
                norm = _F(0.0)
                for t in range(seq):
                    e = exp32(scores[t] - peak)
                    scores[t] = e
                    norm += e
                inverse = _F(1.0) / norm
                for i in range(head_v):
                    context[i] = _F(0.0)
                for t in range(0, fours, 4):
                    w0, w1 = scores[t] * inverse, scores[t + 1] * inverse
                    w2, w3 = scores[t + 2] * inverse, scores[t + 3] * inverse
                    v0, v1, v2, v3 = values[t], values[t + 1], values[t + 2], values[t + 3]
                    for i in range(head_v):
                        context[i] += w0 * v0[i] + w1 * v1[i] + w2 * v2[i] + w3 * v3[i]
                for t in range(fours, seq):
                    weight = scores[t] * inverse
                    v_row = values[t]
                    for i in range(head_v):
                        context[i] += weight * v_row[i]
                target = out[b, s, n * head_v : (n + 1) * head_v]
                for i in range(head_v):
                    target[i] = context[i]


@_compiled
def add_bias_columns(x, bias):
    """x[:, :n] += bias for x (rows, width) and bias (n,), n <= width: Attention's Q and K biases,
    added in place to those columns of its fresh (B*S, Dq + Dk + Dv) projection (numpy's add on
    that strided view is slower than on the whole projection)."""
    wide_vectors()
    for i in range(x.shape[0]):
        for j in range(bias.shape[0]):
            x[i, j] += bias[j]


@_compiled
def merge_heads(context, bias, out):
    """out (B, S, N*H) = context (B, N, S, H) with its heads side by side, plus bias (N*H,);
    a (0,)-shaped bias adds nothing. Attention's one copy of the context, V's bias riding on it."""
    wide_vectors()
    batch, heads, seq, head = context.shape
    with_bias = bias.shape[0] > 0
    for b in range(batch):
        for s in range(seq):
            for n in range(heads):
                source = context[b, n, s]
                base = n * head
                for h in range(head):
                    value = source[h]
                    if with_bias:
                        value += bias[base + h]
                    out[b, s, base + h] = value


# ---------------------------------------------------------------- convolution epilogue


def conv_epilogue_rows(y, bias, residual, relu):
    """y = relu?(y + bias + residual), in place over the (positions, channels) GEMM output.

    numpy needs a pass per term (three over a 56x56x256 ResNet output: 0.64 ms against 0.2);
    this is one. `bias` is (channels,) and `residual` (positions, channels); a missing one
    arrives as a (0,)-shaped / (0, 0)-shaped array, so there is one compiled signature. The
    clamp keeps NaN (`v < 0` is false for it) as np.maximum(v, 0) does.
    """
    _split(conv_epilogue_span, conv_epilogue_chunks, y.shape[0], y.size, y, bias, residual, relu)


@_compiled
def conv_epilogue_span(y, bias, residual, relu, lo, hi):
    width = y.shape[1]
    with_bias = bias.shape[0] > 0
    with_residual = residual.shape[0] > 0
    for i in range(lo, hi):
        for j in range(width):
            v = y[i, j]
            if with_bias:
                v += bias[j]
            if with_residual:
                v += residual[i, j]
            if relu:
                v = _F(0.0) if v < _F(0.0) else v
            y[i, j] = v


@_compiled(parallel=True)
def conv_epilogue_chunks(y, bias, residual, relu, chunks):
    for c in prange(chunks):
        conv_epilogue_span(
            y,
            bias,
            residual,
            relu,
            _chunk_start(y.shape[0], chunks, c),
            _chunk_start(y.shape[0], chunks, c + 1),
        )


# ---------------------------------------------------------------- pooling


@_compiled
def max_pool_channels_last_2d(
    x, kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left, out
):
    """out (N, OH, OW, C) = the maximum of each window of x (N, H, W, C), one pass.

    numpy takes one strided `maximum` pass per tap over a padded copy (1.1 ms on ResNet-50's
    112x112x64 stem pool); this reads each window's rows of C contiguous values in place.
    Taps outside x are skipped, which is what padding with -inf gives (an all-padding window,
    possible only in ceil_mode's overhang, stays -inf). NaN wins, as in np.maximum.
    """
    batch, height, width, channels = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    for n in range(batch):
        for oh in range(out_h):
            for ow in range(out_w):
                target = out[n, oh, ow]
                for c in range(channels):
                    target[c] = -_INF
                for i in range(kernel_h):
                    h = oh * stride_h - pad_top + i * dilation_h
                    if h < 0 or h >= height:
                        continue
                    for j in range(kernel_w):
                        w = ow * stride_w - pad_left + j * dilation_w
                        if w < 0 or w >= width:
                            continue
                        row = x[n, h, w]
                        for c in range(channels):
                            a = row[c]
                            v = target[c]
                            target[c] = a if (a > v or a != a) else v
