"""Fused contrib ops as single CUDA launches, for the CuPy backend (runtime/backends/cuda.py).

On CuPy every kernel's array-API path is a chain of small launches (SkipLayerNormalization's
is ten), and at BERT's sizes each costs more to launch than to run, so the GPU sat launch-bound
and a fused op was hardly cheaper than the subgraph it replaced. Here each fused op is one
launch (Attention: its three cuBLAS products, one launch splitting the heads, one for the
masked softmax and a copy merging them), so fusion shows in our GPU timings as it does in onnxruntime's.

The contrib kernels call in through a branch such as

    if self.on_cuda and cuda_fused.skip_norm_fits(x, skip, gamma, beta, bias):
        return cuda_fused.skip_layer_norm(...)

and keep their array-API path for everything a `*_fits` refuses (other dtypes, layouts, mask
kinds), which also raises their errors; the CPU never reaches this module. Semantics are those
of the CPU kernels beside it (contrib_normalization.py, contrib_activation.py,
contrib_attention.py, activation.py's Gelu): the same order of additions, statistics in
float32 with the variance taken about the mean, the same mask values.

The raw kernels take float32 (rows index memory by hand, so C-contiguous); the Gelus are
ElementwiseKernels that take float32 and float16, computing in float32 and rounding once.
CuPy is imported on first use, and each kernel is compiled once (CuPy caches the binaries
on disk as well).
"""

from __future__ import annotations

import functools
import math

import numpy as np

MAX_WIDTH = 8192  # a normalized row lives in shared memory: 32 KB of the 48 KB a block may use by default
_F32 = (np.dtype(np.float32),)
_GELU_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))

# Flags of the normalization kernels (keep in step with _SOURCE).
_HAS_SKIP, _HAS_BIAS, _HAS_BETA, _CENTERED, _WANT_SUM, _WANT_STATS = 1, 2, 4, 8, 16, 32
# Embedding lookups the kernel found out of range (bit per ids tensor).
_BAD_WORD, _BAD_POSITION, _BAD_SEGMENT = 1, 2, 4
# How the softmax kernel reads a raw attention mask (keep in step with _SOURCE).
_MASK_NONE, _MASK_LENGTHS, _MASK_END_START, _MASK_2D, _MASK_3D = 0, 1, 2, 3, 4

_SOURCE = r"""
#define FW_HAS_SKIP 1
#define FW_HAS_BIAS 2
#define FW_HAS_BETA 4
#define FW_CENTERED 8
#define FW_WANT_SUM 16
#define FW_WANT_STATS 32
#define FW_FLT_LOWEST (-3.402823466e+38f)

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The sum over the block, in every thread; blockDim.x a multiple of 32. The first barrier lets
// a second call reuse `scratch` after every warp has read the first call's values.
__device__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? scratch[lane] : 0.0f);
}

// row (in shared memory, each thread holding its own columns) normalized into out[0, width):
// (row - mean) / sqrt(var + eps) * gamma (+ beta), as the CPU loop (compiled.skip_layer_norm_rows)
// computes it: float32 statistics, the variance about the mean; mean 0 when not centered (RMS).
__device__ void normalize_row(const float* row, float total, int width, float epsilon, int flags,
                              const float* __restrict__ gamma, const float* __restrict__ beta,
                              float* __restrict__ out, float* scratch, float* mean_out, float* inv_std_out) {
    const float scale = 1.0f / (float)width;
    const float mu = (flags & FW_CENTERED) ? block_sum(total, scratch) * scale : 0.0f;
    float square = 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const float d = row[j] - mu;
        square += d * d;
    }
    const float r = 1.0f / sqrtf(block_sum(square, scratch) * scale + epsilon);
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float y = (row[j] - mu) * r * gamma[j];
        if (flags & FW_HAS_BETA) y += beta[j];
        out[j] = y;
    }
    if ((flags & FW_WANT_STATS) && threadIdx.x == 0) {
        *mean_out = mu;
        *inv_std_out = r;
    }
}

// One block per row of x (rows, width): out = normalize(x (+ skip) (+ bias)) * gamma (+ beta).
// skip has skip_rows rows, repeated over x's (a (S, H) skip for every batch).
extern "C" __global__ void skip_layer_norm_f32(
        const float* __restrict__ x, const float* __restrict__ skip, const float* __restrict__ bias,
        const float* __restrict__ gamma, const float* __restrict__ beta,
        float* __restrict__ out, float* __restrict__ summed, float* __restrict__ mean, float* __restrict__ inv_std,
        const int width, const int skip_rows, const float epsilon, const int flags) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const long long i = blockIdx.x;
    const float* x_row = x + i * width;
    const float* skip_row = skip + (i % skip_rows) * (long long)width;
    float total = 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float v = x_row[j];
        if (flags & FW_HAS_SKIP) v += skip_row[j];
        if (flags & FW_HAS_BIAS) v += bias[j];
        row[j] = v;
        total += v;
        if (flags & FW_WANT_SUM) summed[i * width + j] = v;
    }
    normalize_row(row, total, width, epsilon, flags, gamma, beta, out + i * width, scratch, mean + i, inv_std + i);
}

// One block per token (b, s): word[input_ids] + position[position_ids or s] (+ segment[segment_ids]),
// layer-normalized. position_rows: 0 without position_ids, 1 for (1, S) ids, else (B, S) ids.
// An id out of range sets its bit in *bad (the caller raises) and reads row 0 instead.
extern "C" __global__ void embed_layer_norm_f32(
        const int* __restrict__ input_ids, const int* __restrict__ segment_ids, const int* __restrict__ position_ids,
        const float* __restrict__ word, const float* __restrict__ position, const float* __restrict__ segment,
        const float* __restrict__ gamma, const float* __restrict__ beta,
        float* __restrict__ out, float* __restrict__ summed, int* __restrict__ bad,
        const int seq, const int width, const int words, const int positions, const int segments,
        const int position_rows, const int has_segment, const float epsilon, const int flags) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const long long i = blockIdx.x;
    const int s = (int)(i % seq);
    int w = input_ids[i];
    int p = position_rows == 0 ? s : position_ids[position_rows == 1 ? s : i];
    int g = has_segment ? segment_ids[i] : 0;
    if (w < 0 || w >= words) { if (threadIdx.x == 0) atomicOr(bad, 1); w = 0; }
    if (p < 0 || p >= positions) { if (threadIdx.x == 0) atomicOr(bad, 2); p = 0; }
    if (has_segment && (g < 0 || g >= segments)) { if (threadIdx.x == 0) atomicOr(bad, 4); g = 0; }
    const float* w_row = word + (long long)w * width;
    const float* p_row = position + (long long)p * width;
    const float* g_row = segment + (long long)g * width;
    float total = 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float v = w_row[j] + p_row[j];
        if (has_segment) v += g_row[j];
        row[j] = v;
        total += v;
        if (flags & FW_WANT_SUM) summed[i * width + j] = v;
    }
    normalize_row(row, total, width, epsilon, flags, gamma, beta, out + i * width, scratch, nullptr, nullptr);
}

// The packed (B*S, Dq + Dk + Dv) projection (+ bias) split into heads: q (B, N, S, Hq) times
// scale, k (B, N, kv_len, Hk) and v (B, N, kv_len, Hv) at rows past..past+S (present's layout).
extern "C" __global__ void split_qkv_f32(
        const float* __restrict__ qkv, const float* __restrict__ bias,
        float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
        const long long count, const int seq, const int heads, const int dq, const int dk, const int dv,
        const int kv_len, const int past, const float scale, const int has_bias) {
    const long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= count) return;
    const int width = dq + dk + dv;
    int c = (int)(index % width);
    const long long r = index / width;
    const long long b = r / seq;
    const int s = (int)(r % seq);
    float value = qkv[index];
    if (has_bias) value += bias[c];
    if (c < dq) {
        const int size = dq / heads, n = c / size, h = c % size;
        q[((b * heads + n) * seq + s) * size + h] = value * scale;
    } else if (c < dq + dk) {
        c -= dq;
        const int size = dk / heads, n = c / size, h = c % size;
        k[((b * heads + n) * kv_len + past + s) * size + h] = value;
    } else {
        c -= dq + dk;
        const int size = dv / heads, n = c / size, h = c % size;
        v[((b * heads + n) * kv_len + past + s) * size + h] = value;
    }
}

// softmax(scores + mask + add1 + add2) in place over the last axis of scores (B, N, S, T), one
// warp per row. The mask is attention's raw mask_index read as contrib_attention.keep_mask
// reads it (mask_kind: 0 none, 1 key lengths (B), 2 end then start (2B), 3 (B, T), 4 (B, S, T));
// a padded-out key gets `filter`, a future key under `causal` the lowest float, overriding.
// add1/add2 are additive (B|1, N|1, S|1, T) tensors given by their element steps (0: broadcast).
extern "C" __global__ void masked_softmax_f32(
        float* __restrict__ scores, const long long rows, const int heads, const int seq, const int total,
        const int* __restrict__ mask, const int mask_kind, const int batch, const int past,
        const float filter, const int causal,
        const float* __restrict__ add1, const long long a1_b, const long long a1_n, const long long a1_s,
        const float* __restrict__ add2, const long long a2_b, const long long a2_n, const long long a2_s,
        const int adds) {
    const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    const int lane = threadIdx.x;
    const int s = (int)(r % seq);
    const long long bn = r / seq;
    const long long n = bn % heads, b = bn / heads;
    float* row = scores + r * total;
    const float* row1 = add1 + b * a1_b + n * a1_n + s * a1_s;
    const float* row2 = add2 + b * a2_b + n * a2_n + s * a2_s;
    int lo = 0, hi = total;
    const int* keep_row = nullptr;
    if (mask_kind == 1) {
        hi = mask[b];
    } else if (mask_kind == 2) {
        hi = mask[b];
        lo = mask[batch + b];
    } else if (mask_kind == 3) {
        keep_row = mask + b * total;
    } else if (mask_kind == 4) {
        keep_row = mask + (b * seq + s) * total;
    }
    const int last = past + s;  // the newest key this query may see under `causal`
    float best = __int_as_float((int)0xff800000u);  // -inf
    for (int j = lane; j < total; j += 32) {
        float v = row[j];
        if (mask_kind != 0 || causal) {
            const bool keep = keep_row != nullptr ? keep_row[j] > 0 : (j >= lo && j < hi);
            float m = keep ? 0.0f : filter;
            if (causal && j > last) m = FW_FLT_LOWEST;
            v += m;
        }
        if (adds & 1) v += row1[j];
        if (adds & 2) v += row2[j];
        row[j] = v;
        best = fmaxf(best, v);
    }
    best = warp_max(best);
    float sum = 0.0f;
    for (int j = lane; j < total; j += 32) {
        const float e = expf(row[j] - best);
        row[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    for (int j = lane; j < total; j += 32) row[j] = row[j] / sum;
}
"""


@functools.cache
def _module():
    import cupy

    return cupy.RawModule(code=_SOURCE, options=("--std=c++17",))


def _kernel(name: str):
    return _module().get_function(name)


# ---------------------------------------------------------------- what the kernels take


def _on_device(arrays, dtypes, contiguous=True) -> bool:
    import cupy

    return all(
        isinstance(a, cupy.ndarray)
        and a.dtype in dtypes
        and a.size > 0
        and (a.flags.c_contiguous or not contiguous)
        for a in arrays
    )


def accepts(*arrays) -> bool:
    """CuPy float32 arrays, C-contiguous and non-empty: what the raw kernels index by hand."""
    return _on_device(arrays, _F32)


def gelu_accepts(x, bias=None) -> bool:
    """A float32 or float16 CuPy tensor (any layout) and, if given, a (W,) bias of its dtype."""
    if bias is None:
        return _on_device([x], _GELU_DTYPES, contiguous=False)
    return (
        _on_device([x, bias], _GELU_DTYPES, contiguous=False)
        and bias.dtype == x.dtype
        and x.ndim >= 1
        and bias.shape == (x.shape[-1],)
    )


def _threads(width: int) -> int:
    """Threads per row-block: a warp multiple, up to 256 (3 columns each at BERT-base's 768)."""
    return min(256, (width + 31) // 32 * 32)


def _i32(value) -> np.int32:
    return np.int32(value)


# ---------------------------------------------------------------- normalization


def skip_norm_fits(x, skip, gamma, beta, bias) -> bool:
    """3-D float32 x with a (B, S, H), (1, S, H) or (S, H) skip and (H,) gamma/beta/bias."""
    params = [p for p in (gamma, beta, bias) if p is not None]
    if not accepts(x, skip, *params) or x.ndim != 3 or x.shape[-1] > MAX_WIDTH:
        return False
    width = x.shape[-1]
    return skip.shape in (x.shape, (1, *x.shape[1:]), x.shape[1:]) and all(p.shape == (width,) for p in params)


def _normalize_rows(x, skip, gamma, beta, bias, epsilon, centered, want_stats, want_sum):
    """out, mean, inv_std (rows,) or None, summed or None, for x as (rows, width)."""
    import cupy

    width = x.shape[-1]
    rows = x.size // width
    out = cupy.empty(x.shape, np.float32)
    summed = cupy.empty(x.shape, np.float32) if want_sum else out  # `out` is only a placeholder pointer
    mean = cupy.empty(rows, np.float32) if want_stats else out
    inv_std = cupy.empty(rows, np.float32) if want_stats else out
    flags = (
        (_HAS_SKIP if skip is not None else 0)
        | (_HAS_BIAS if bias is not None else 0)
        | (_HAS_BETA if beta is not None else 0)
        | (_CENTERED if centered else 0)
        | (_WANT_SUM if want_sum else 0)
        | (_WANT_STATS if want_stats else 0)
    )
    skip_rows = rows if skip is None else skip.size // width
    _kernel("skip_layer_norm_f32")(
        (rows,),
        (_threads(width),),
        (
            x, x if skip is None else skip, gamma if bias is None else bias, gamma,
            gamma if beta is None else beta, out, summed, mean, inv_std,
            _i32(width), _i32(skip_rows), np.float32(epsilon), _i32(flags),
        ),
        shared_mem=width * 4,
    )
    return out, (mean if want_stats else None), (inv_std if want_stats else None), (summed if want_sum else None)


def skip_layer_norm(x, skip, gamma, beta, bias, epsilon, centered, want_stats, want_sum):
    """SkipLayerNormalization / SkipSimplifiedLayerNormalization in one launch, with the CPU
    kernel's outputs: (out,) or, when any optional output is wanted, (out, mean, inv_std,
    sum or None), mean and inv_std (B, S, 1) float32 (mean 0 for the simplified form)."""
    want_stats = want_stats or want_sum  # the CPU kernel returns all three together
    out, mean, inv_std, summed = _normalize_rows(x, skip, gamma, beta, bias, epsilon, centered, want_stats, want_sum)
    if not want_stats:
        return (out,)
    lead = (*x.shape[:-1], 1)
    return out, mean.reshape(lead), inv_std.reshape(lead), summed


def rms_norm_fits(x, scale, axis) -> bool:
    """float32 x normalized over [axis, rank) with a scale of exactly that shape."""
    if not accepts(x, scale):
        return False
    axis = axis + x.ndim if axis < 0 else axis
    return 0 <= axis < x.ndim and scale.shape == x.shape[axis:] and scale.size <= MAX_WIDTH


def rms_norm(x, scale, axis, epsilon):
    """SimplifiedLayerNormalization: (y, inv_std) with inv_std shaped lead + (1,) * (rank - axis)."""
    axis = axis + x.ndim if axis < 0 else axis
    rows = x.reshape(-1, scale.size)
    y, _, inv_std, _ = _normalize_rows(rows, None, scale.reshape(-1), None, None, epsilon, False, True, False)
    return y.reshape(x.shape), inv_std.reshape(*x.shape[:axis], *([1] * (x.ndim - axis)))


def layer_norm_fits(x, scale, bias, axis) -> bool:
    """float32 x normalized over [axis, rank) with scale (and bias) of exactly that shape."""
    params = [p for p in (scale, bias) if p is not None]
    if not accepts(x, *params):
        return False
    axis = axis + x.ndim if axis < 0 else axis
    return 0 <= axis < x.ndim and all(p.shape == x.shape[axis:] for p in params) and scale.size <= MAX_WIDTH


def layer_norm(x, scale, bias, axis, epsilon, want_stats):
    """ONNX LayerNormalization (float32 stash): (y,) or (y, mean, inv_std), the statistics shaped
    lead + (1,) * (rank - axis) as the CPU kernel returns them."""
    axis = axis + x.ndim if axis < 0 else axis
    width = scale.size
    rows = x.reshape(-1, width)
    beta = None if bias is None else bias.reshape(-1)
    y, mean, inv_std, _ = _normalize_rows(rows, None, scale.reshape(-1), beta, None, epsilon, True, want_stats, False)
    y = y.reshape(x.shape)
    if not want_stats:
        return (y,)
    stats = (*x.shape[:axis], *([1] * (x.ndim - axis)))
    return y, mean.reshape(stats), inv_std.reshape(stats)


def embed_fits(input_ids, segment_ids, word, position, segment, gamma, beta, position_ids) -> bool:
    """int32 (B, S) ids, (1|B, S) position_ids or none (then S within the position table), float32
    (rows, H) tables and (H,) gamma/beta."""
    import cupy

    ids = [i for i in (input_ids, segment_ids if segment is not None else None, position_ids) if i is not None]
    tables = [t for t in (word, position, segment if segment_ids is not None else None) if t is not None]
    if not all(isinstance(i, cupy.ndarray) and i.dtype == np.int32 and i.flags.c_contiguous for i in ids):
        return False
    if not accepts(word, position, gamma, beta, *tables) or input_ids.ndim != 2 or input_ids.size == 0:
        return False
    width = word.shape[-1] if word.ndim == 2 else -1
    batch, seq = input_ids.shape
    if position_ids is None:
        positions_fit = seq <= position.shape[0]
    else:
        positions_fit = position_ids.shape in ((batch, seq), (1, seq))
    return (
        0 < width <= MAX_WIDTH
        and all(t.ndim == 2 and t.shape[1] == width for t in tables)
        and gamma.shape == beta.shape == (width,)
        and (segment_ids is None or segment is None or segment_ids.shape == input_ids.shape)
        and positions_fit
    )


def embed_layer_norm(input_ids, segment_ids, word, position, segment, gamma, beta, position_ids, epsilon, want_sum):
    """EmbedLayerNormalization's (out, sum or None), or None where an id is out of range (the
    caller's own lookups then raise the error naming it). Reads one int back to say which:
    the only wait on the device, at the model's first op."""
    import cupy

    batch, seq = input_ids.shape
    width = word.shape[1]
    has_segment = segment_ids is not None and segment is not None
    out = cupy.empty((batch, seq, width), np.float32)
    summed = cupy.empty_like(out) if want_sum else out
    bad = cupy.zeros(1, np.int32)
    position_rows = 0 if position_ids is None else (1 if position_ids.shape[0] == 1 else batch)
    _kernel("embed_layer_norm_f32")(
        (batch * seq,),
        (_threads(width),),
        (
            input_ids, segment_ids if has_segment else input_ids,
            input_ids if position_ids is None else position_ids,
            word, position, segment if has_segment else word, gamma, beta, out, summed, bad,
            _i32(seq), _i32(width), _i32(word.shape[0]), _i32(position.shape[0]),
            _i32(segment.shape[0] if has_segment else 0), _i32(position_rows), _i32(has_segment),
            np.float32(epsilon), _i32(_HAS_BETA | _CENTERED | (_WANT_SUM if want_sum else 0)),
        ),
        shared_mem=width * 4,
    )
    if int(bad.get()[0]):
        return None
    return out, (summed if want_sum else None)


# ---------------------------------------------------------------- Gelus


@functools.cache
def _gelu_kernels():
    import cupy

    def gelu(name, formula, bias=False):
        params = "T x, T b" if bias else "T x"
        value = "float v = (float)x + (float)b;" if bias else "float v = (float)x;"
        return cupy.ElementwiseKernel(params, "T y", f"{value} y = (T)({formula});", f"fusionwatch_{name}")

    sqrt_half = 1.0 / math.sqrt(2.0)
    c = math.sqrt(2.0 / math.pi)
    erf = f"0.5f * v * (1.0f + erff(v * {sqrt_half!r}f))"
    # sqrt(2/pi) (v + 0.044715 v^3) = v (c + c*0.044715 v^2), as contrib_activation._tanh_gelu has it
    tanh = f"0.5f * v * (1.0f + tanhf(v * ({c!r}f + {c * 0.044715!r}f * v * v)))"
    return {
        "erf": gelu("gelu", erf),
        "erf_bias": gelu("bias_gelu", erf, bias=True),
        "tanh": gelu("fast_gelu", tanh),
        "tanh_bias": gelu("bias_fast_gelu", tanh, bias=True),
        # x / (1 + exp(-alpha x)): exp overflows to inf for very negative alpha x, and x / inf = 0.
        "quick": cupy.ElementwiseKernel(
            "T x, float32 alpha", "T y", "float v = (float)x; y = (T)(v / (1.0f + expf(-alpha * v)));",
            "fusionwatch_quick_gelu",
        ),
    }


def gelu(x, bias=None, tanh=False):
    """Gelu / BiasGelu (erf) or FastGelu (tanh), with an optional (W,) bias over the last axis."""
    import cupy

    kernels = _gelu_kernels()
    out = cupy.empty(x.shape, x.dtype)
    if bias is None:
        return kernels["tanh" if tanh else "erf"](x, out)
    return kernels["tanh_bias" if tanh else "erf_bias"](x, bias, out)


def quick_gelu(x, alpha):
    import cupy

    return _gelu_kernels()["quick"](x, np.float32(alpha), cupy.empty(x.shape, x.dtype))


# ---------------------------------------------------------------- attention


def _mask_kind(mask, batch, seq, total):
    """How masked_softmax_f32 reads this raw mask_index, or None for one it doesn't (which the
    array path takes, raising for a malformed one). Follows _keep_mask's order of cases."""
    if mask is None:
        return _MASK_NONE
    import cupy

    if not isinstance(mask, cupy.ndarray) or mask.dtype != np.int32 or not mask.flags.c_contiguous:
        return None
    if mask.ndim == 1:
        return {batch: _MASK_LENGTHS, 2 * batch: _MASK_END_START}.get(mask.shape[0])
    if mask.ndim == 2:
        if mask.shape == (batch, total):
            return _MASK_2D
        if mask.shape[1] == 1 and mask.shape[0] in (1, batch):
            return _MASK_NONE  # a (B|1, 1) dummy: masks nothing, as in ORT
        return None
    if mask.ndim == 3 and mask.shape == (batch, seq, total):
        return _MASK_3D
    return None


def _additive_steps(add, scores_shape):
    """Element steps (b, n, s) of an additive (.., T) tensor broadcast to scores (B, N, S, T), 0
    where it broadcasts; None where the softmax kernel can't read it that way."""
    if add is None:
        return (0, 0, 0)
    if not accepts(add) or add.ndim > 4 or add.shape[-1] != scores_shape[3]:
        return None
    shape = (1,) * (4 - add.ndim) + add.shape
    if any(m not in (1, n) for m, n in zip(shape[:3], scores_shape[:3], strict=True)):
        return None
    total = shape[3]
    steps = (shape[1] * shape[2] * total, shape[2] * total, total)
    return tuple(0 if m == 1 else step for m, step in zip(shape[:3], steps, strict=True))


def _softmax_launch(scores, mask, mask_kind, past, filter_value, causal, adds):
    batch, heads, seq, total = scores.shape
    rows = batch * heads * seq
    args = []
    flags = 0
    for bit, (add, steps) in enumerate(adds):
        if add is not None:
            flags |= 1 << bit
        args += [scores if add is None else add, *(np.int64(step) for step in steps)]
    rows_per_block = 4
    _kernel("masked_softmax_f32")(
        ((rows + rows_per_block - 1) // rows_per_block,),
        (32, rows_per_block),
        (
            scores, np.int64(rows), _i32(heads), _i32(seq), _i32(total),
            scores if mask is None else mask, _i32(mask_kind), _i32(batch), _i32(past),
            np.float32(filter_value), _i32(causal), *args, _i32(flags),
        ),
    )


def softmax_fits(scores, additive_mask, attention_bias) -> bool:
    """float32 (B, N, S, T) scores and additive terms that broadcast over them by the leading axes."""
    return (
        accepts(scores)
        and scores.ndim == 4
        and _additive_steps(additive_mask, scores.shape) is not None
        and _additive_steps(attention_bias, scores.shape) is not None
    )


def masked_softmax(scores, additive_mask, attention_bias):
    """softmax(scores + additive_mask + attention_bias) in place, in one launch."""
    adds = [(a, _additive_steps(a, scores.shape)) for a in (additive_mask, attention_bias)]
    _softmax_launch(scores, None, _MASK_NONE, 0, 0.0, 0, adds)
    return scores


def attention_fits(qkv, bias, mask_index, past, attention_bias, heads, sizes) -> bool:
    """Attention's common cases: float32, a raw mask _mask_kind reads, a (B|1, N|1, S, T)
    attention_bias, past (2, B, N, P, H) with equal K and V sizes."""
    if not accepts(qkv, *[a for a in (bias, past) if a is not None]) or qkv.ndim != 3:
        return False
    batch, seq, width = qkv.shape
    dq, dk, dv = sizes
    if bias is not None and bias.shape != (width,):
        return False
    past_len = 0
    if past is not None:
        if past.ndim != 5 or past.shape[:3] != (2, batch, heads) or dk != dv or past.shape[4] != dk // heads:
            return False
        past_len = past.shape[3]
    total = past_len + seq
    return (
        _mask_kind(mask_index, batch, seq, total) is not None
        and _additive_steps(attention_bias, (batch, heads, seq, total)) is not None
    )


def attention(qkv, bias, mask_index, past, attention_bias, heads, sizes, scale, *, unidirectional,
              mask_filter_value, want_present):
    """Attention from its packed projection qkv (B, S, Dq + Dk + Dv): one launch splits the heads
    (bias added, Q scaled, K and V written into present where there is one), cuBLAS forms the
    scores, one launch masks and softmaxes them, cuBLAS the context, one copy merges the heads.
    Returns (output,) or (output, present) as the CPU kernel does."""
    import cupy

    batch, seq, width = qkv.shape
    dq, dk, dv = sizes
    past_len = 0 if past is None else past.shape[3]
    total = past_len + seq
    q = cupy.empty((batch, heads, seq, dq // heads), np.float32)
    present = None
    if past is not None or want_present:
        present = cupy.empty((2, batch, heads, total, dk // heads), np.float32)
        if past is not None:
            present[:, :, :, :past_len] = past
        k, v = present[0], present[1]
    else:
        k = cupy.empty((batch, heads, total, dk // heads), np.float32)
        v = cupy.empty((batch, heads, total, dv // heads), np.float32)
    count = qkv.size
    threads = 256
    _kernel("split_qkv_f32")(
        ((count + threads - 1) // threads,),
        (threads,),
        (
            qkv, qkv if bias is None else bias, q, k, v, np.int64(count), _i32(seq), _i32(heads),
            _i32(dq), _i32(dk), _i32(dv), _i32(total), _i32(past_len), np.float32(scale), _i32(bias is not None),
        ),
    )
    scores = cupy.matmul(q, k.transpose(0, 1, 3, 2))  # (B, N, S, T)
    kind = _mask_kind(mask_index, batch, seq, total)
    adds = [(attention_bias, _additive_steps(attention_bias, scores.shape)), (None, (0, 0, 0))]
    causal = bool(unidirectional) and seq > 1
    _softmax_launch(scores, None if kind == _MASK_NONE else mask_index, kind, past_len, mask_filter_value, causal, adds)
    context = cupy.matmul(scores, v)  # (B, N, S, Hv)
    output = context.transpose(0, 2, 1, 3).reshape(batch, seq, dv)
    return (output, present) if want_present else (output,)
