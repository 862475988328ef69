"""float32 products on Intel MKL where it is installed: MatMul, Gemm, FusedGemm, FusedMatMul and
Attention against a constant weight through MKL's packed SGEMM, and their other float32
products (attention's batched ones included) through plain MKL SGEMM. Convolutions stay on
numpy's BLAS: MKL measured no faster there (runtime/kernels/conv_nhwc.py).

Why packing: a model's weights are constants, so the GEMM's B operand can be reordered into the
blocked layout the micro-kernel reads ONCE, at session creation, instead of on every call, as
onnxruntime does (MLAS prepacks constant B). On the 2-core Xeon target MKL's
cblas_sgemm_compute on a packed B beats numpy's OpenBLAS on BERT-base's cold-weight GEMMs by
about a third: (128, 768, 3072) 3.73 -> 2.60 ms, (128, 768, 768) 0.81 -> 0.53 ms.

Why the other products too: with OpenBLAS and MKL taking turns, each library's idle workers
spin beside the other's working ones (see `matmul`); BERT-base got slower, not faster, until
no OpenBLAS GEMM was left in its loop.

MKL comes from the optional `mkl` wheel (`pip install fusionwatch[mkl]`, which `make` installs);
libmkl_rt is found through that wheel's file list (or sys.prefix/lib) and loaded with ctypes on
first use. Where it is missing, the platform is not x86_64, the backend is not numpy or the
dtype is not float32, `pack_constant` answers None, `matmul` None, and the kernels multiply
with numpy as before, to the same results within fp32 tolerance.

Threads: MKL's OpenMP workers would spin for 200 ms after each GEMM (KMP_BLOCKTIME's default),
taking a core from the numpy / numba work between GEMMs (BERT-base: 439 ms a run, against 107
with 0), so KMP_BLOCKTIME is 0 unless the user set it, before the library loads; a session
that measured a 1 ms spin faster uses that for its runs (runtime/kernels/openmp.py).
`set_threads` follows `intra_op_num_threads` like OpenBLAS (runtime/threads.py).

A B packed for one M serves every M (tests/runtime/test_gemm.py checks M = 1 .. 2048) at the
same speed (packing at M = 1, 16 or 128 measured alike), so one buffer per weight.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import onnx_ir as ir

from runtime.kernels import libraries, onednn, onednn_matmul, openmp
from runtime.kernels.native import wheel_library

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_B_MATRIX, _PACKED = 162, 151
_PACK_M = 128  # the M handed to the pack calls; any M works at compute time (see docstring)
_int, _float, _ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
INT_LIMIT = 2**31  # sizes and strides MKL's LP64 interface can take
# Products of at most this many multiply-adds (M*K*N) stay on numpy's BLAS. At that size a call
# into MKL or oneDNN through ctypes (argument checks, data pointers, the call itself) costs more
# than the product: a tiny model's (1, 64) @ (64, 64) took ~19 us packed against ~2 on numpy.
# It is OpenBLAS's own limit for running on the calling thread alone (SMP_THRESHOLD_MIN *
# GEMM_MULTITHREAD_THRESHOLD in its interface/gemm.c), so these calls never wake OpenBLAS's
# workers, whose spinning beside MKL's is why the larger products leave numpy (see `matmul`).
SMALL_PRODUCT = 65536 * 4
# With one thread (`set_threads(1)`, as a session with intra_op_num_threads=1 sets numpy's BLAS
# too) OpenBLAS has no workers to wake or leave spinning, and on its calling thread it beats a
# library call up to three times that size: (16, 128) @ (128, 384) 14.7 us on numpy against 19.7
# on oneDNN, (16, 128) @ (128, 512) 29.1 against 24.8 (AMD EPYC, one thread; the grid is in
# docs/benchmarks.md, issue 31). The limit is then SMALL_PRODUCT times this.
ONE_THREAD_SMALL_FACTOR = 3
_small_factor = 1

_library: ctypes.CDLL | None = None
_load_error: str | None = None
_loaded = False


def _load() -> ctypes.CDLL | None:
    global _library, _load_error, _loaded
    if _loaded:
        return _library
    _loaded = True
    if platform.machine().lower() not in ("x86_64", "amd64"):
        _load_error = f"MKL is x86_64 only; this machine is {platform.machine()}"
        return None
    path = wheel_library("mkl", "libmkl_rt.so")
    if path is None:
        _load_error = "the mkl package is not installed (pip install fusionwatch[mkl])"
        return None
    openmp.load()  # MKL's threads are libiomp5's, shared with oneDNN (runtime/kernels/openmp.py)
    library = ctypes.CDLL(str(path))
    library.cblas_sgemm_pack_get_size.restype = ctypes.c_size_t
    library.cblas_sgemm_pack_get_size.argtypes = [_int, _int, _int, _int]
    library.cblas_sgemm_pack.argtypes = [_int, _int, _int, _int, _int, _int, _float, _ptr, _int, _ptr]
    library.cblas_sgemm_pack.restype = None
    # MKL_INT is a C int: libmkl_rt's default interface is LP64.
    library.cblas_sgemm_compute.argtypes = [*[_int] * 6, _ptr, _int, _ptr, _int, _float, _ptr, _int]
    library.cblas_sgemm_compute.restype = None
    library.cblas_sgemm_batch_strided.argtypes = [
        *[_int] * 6,
        _float,
        _ptr,
        _int,
        _int,
        _ptr,
        _int,
        _int,
        _float,
        _ptr,
        _int,
        _int,
        _int,
    ]
    library.cblas_sgemm_batch_strided.restype = None
    library.MKL_Set_Num_Threads.argtypes = [_int]
    library.MKL_Set_Num_Threads.restype = None
    library.MKL_Get_Max_Threads.restype = _int
    _library = library
    return library


def available() -> bool:
    """True where MKL's packed SGEMM can be used in this process."""
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _load_error


def backend_name() -> str:
    """What products against constant weights run on: "mkl-packed", "onednn" or "numpy"; the
    session's measured choice inside a session (runtime/kernel_choice.py), else MKL where
    installed."""
    library = libraries.chosen("gemm")
    if library == "mkl-packed" and available() or library == "onednn" and onednn.available():
        return library
    if library is None and available():
        return "mkl-packed"
    return "numpy"


def mkl_products() -> bool:
    """Whether float32 products between run-time values (attention's) go to MKL: where it is
    installed, unless the session chose numpy's BLAS, whose spinning workers MKL's would meet."""
    return available() and libraries.chosen("gemm") != "numpy"


def max_threads() -> int:
    """The thread count MKL's next call would use; 0 without MKL."""
    library = _load()
    return 0 if library is None else library.MKL_Get_Max_Threads()


def set_threads(count: int) -> None:
    """MKL's thread count (0 leaves its default, one per core), and the small-product limit that
    goes with the count (`ONE_THREAD_SMALL_FACTOR`); MKL's part is a no-op without MKL."""
    global _small_factor
    if count:
        _small_factor = ONE_THREAD_SMALL_FACTOR if count == 1 else 1
    library = _load()
    if library is not None and count:
        library.MKL_Set_Num_Threads(count)


class PackedWeight:
    """A constant float32 B of shape (K, N), held in MKL's packed layout.

    `trans`: the array given is B^T, (N, K), as Gemm's transB=1 stores it; it is packed
    transposed, so nothing is copied.
    """

    def __init__(self, array: np.ndarray, trans: bool = False) -> None:
        library = _load()
        if library is None:
            raise RuntimeError(f"MKL packed SGEMM is not available: {_load_error}")
        if array.ndim != 2 or array.dtype != np.float32:
            raise ValueError(f"PackedWeight takes a 2-D float32 array, got {array.dtype} {array.shape}")
        source = np.ascontiguousarray(array)
        self.k, self.n = (source.shape[1], source.shape[0]) if trans else source.shape
        self.source_shape = source.shape
        size = library.cblas_sgemm_pack_get_size(_B_MATRIX, _PACK_M, self.n, self.k)
        # Allocated by numpy so that it is freed with this object; MKL wants 64-byte alignment.
        raw = np.empty(size + 64, np.uint8)
        offset = (-raw.ctypes.data) % 64
        self._raw = raw
        self._address = raw.ctypes.data + offset
        library.cblas_sgemm_pack(
            _ROW_MAJOR,
            _B_MATRIX,
            _TRANS if trans else _NO_TRANS,
            _PACK_M,
            self.n,
            self.k,
            1.0,
            source.ctypes.data,
            source.shape[1],
            self._address,
        )

    @property
    def nbytes(self) -> int:
        return self._raw.nbytes


def matmul_packed(
    a: np.ndarray, packed: PackedWeight | onednn_matmul.MatMulWeight, out: np.ndarray | None = None
) -> np.ndarray:
    """a @ B for float32 `a` of shape (..., K); the leading dimensions are flattened into M.
    B is MKL's packed weight or oneDNN's reordered one, whichever the session chose."""
    if isinstance(packed, onednn_matmul.MatMulWeight):
        return packed.matmul(a, out)
    if a.dtype != np.float32 or a.ndim < 1 or a.shape[-1] != packed.k:
        raise ValueError(f"matmul_packed: A {a.dtype} {a.shape} does not meet a packed B of K = {packed.k}")
    a = np.ascontiguousarray(a)
    rows = a.size // packed.k if packed.k else 0
    shape = (*a.shape[:-1], packed.n)
    if out is None:
        out = np.empty(shape, np.float32)
    if rows == 0 or packed.n == 0:
        return out
    if packed.k == 0:
        out[...] = 0
        return out
    _library.cblas_sgemm_compute(
        _ROW_MAJOR,
        _NO_TRANS,
        _PACKED,
        rows,
        packed.n,
        packed.k,
        a.ctypes.data,
        packed.k,
        packed._address,
        packed.n,
        0.0,
        out.ctypes.data,
        packed.n,
    )
    return out


def product(xp, a, b):
    """a @ b: on MKL where gemm.matmul takes the operands (numpy backend, float32, not a small
    product), else numpy's. float16 products are computed in float32 and rounded once: numpy's
    own float16 matmul also sums in float32, but in a loop without BLAS (0.43 GFLOP/s, a
    12-layer float16 BERT-base minutes a run), and only the order of the sums differs."""
    if xp is np and a.dtype == np.float16 and b.dtype == np.float16:
        return np.asarray(product(xp, a.astype(np.float32), b.astype(np.float32))).astype(np.float16)
    if xp is np and a.size * b.shape[-1] > SMALL_PRODUCT * _small_factor:
        y = matmul(a, b)
        if y is not None:
            return y
    return xp.matmul(a, b)


def _blas_operand(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(contiguous array, transposed?) that BLAS reads `x` from: `x` itself or its transpose
    where one is C-contiguous, else a contiguous copy (an unfused graph's Transpose hands
    MatMul a strided view; numpy would copy it too, or loop without BLAS)."""
    if x.flags.c_contiguous:
        return x, False
    swapped = x.swapaxes(-1, -2)
    if swapped.flags.c_contiguous:
        return swapped, True
    return np.ascontiguousarray(x), False


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b for float32 operands of rank >= 2 on MKL, batch dimensions broadcast as numpy
    does; None otherwise (vectors, other dtypes, no MKL), for the caller to use numpy. An operand that is the last-two-axes transpose
    of a C-contiguous array (k.transpose(0, 1, 3, 2) in attention, Gemm's transB) is read in
    place; any other strided one is copied first.

    Why: OpenBLAS's workers spin-wait for ~0.1 s after each call (its THREAD_TIMEOUT, fixed when
    numpy loads it), and while they spin, MKL's threads on the constant-weight GEMMs share the
    cores with them: BERT-base went 124 -> 167 ms with packed weights until the attention
    products also moved to MKL, and no OpenBLAS call is left in the loop.
    """
    if a.dtype != np.float32 or b.dtype != np.float32 or not mkl_products():
        return None
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
        flat = matmul(a.reshape(-1, a.shape[-1]), b)  # (..., K) @ (K, N): one GEMM of all rows
        return None if flat is None else flat.reshape(*a.shape[:-1], b.shape[-1])
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        return None
    if a.shape[:-2] != b.shape[:-2]:
        # Broadcast batches (Conv's (G, M/G, K) weight against (N, G, K, P) columns): the shared
        # operand is copied once per batch, a small cost beside the products it feeds.
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return None
        a = np.broadcast_to(a, (*batch, *a.shape[-2:]))
        b = np.broadcast_to(b, (*batch, *b.shape[-2:]))
    (a_data, trans_a), (b_data, trans_b) = _blas_operand(a), _blas_operand(b)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = a.size // (m * k) if m * k else 0
    if max(m * k, k * n, m * n, batch) >= INT_LIMIT:
        return None
    out = np.empty((*a.shape[:-1], n), np.float32)
    if out.size == 0:
        return out
    if k == 0 or batch == 0:
        out[...] = 0
        return out
    _library.cblas_sgemm_batch_strided(
        _ROW_MAJOR,
        _TRANS if trans_a else _NO_TRANS,
        _TRANS if trans_b else _NO_TRANS,
        m,
        n,
        k,
        1.0,
        a_data.ctypes.data,
        a_data.shape[-1],
        m * k,
        b_data.ctypes.data,
        b_data.shape[-1],
        k * n,
        0.0,
        out.ctypes.data,
        n,
        m * n,
        batch,
    )
    return out


def batch_strided(count, m, n, k, alpha, a, b, c, trans_b=False) -> None:
    """C_i = alpha A_i B_i (B_i transposed if asked) for i < count: float32, row-major, one MKL
    call. a, b, c are (address, leading dimension, step from one matrix to the next), counted in
    float32 elements; steps smaller than a matrix are fine for A and B (attention's heads
    interleave by rows), MKL refuses them for C only. The caller has checked `available()` and
    that every size and stride is below INT_LIMIT."""
    (a_at, lda, a_step), (b_at, ldb, b_step), (c_at, ldc, c_step) = a, b, c
    _library.cblas_sgemm_batch_strided(
        _ROW_MAJOR, _NO_TRANS, _TRANS if trans_b else _NO_TRANS, m, n, k, alpha, a_at, lda, a_step,
        b_at, ldb, b_step, 0.0, c_at, ldc, c_step, count,
    )


def applies(packed: PackedWeight | onednn_matmul.MatMulWeight | None, a, b) -> bool:
    """Whether `a @ b` may run as `matmul_packed(a, packed)`: B is still the constant that was
    packed (same shape; graph inputs are never packed), A is float32 of rank >= 2 and has
    the same K, and the product is not small (SMALL_PRODUCT). Even a single row of a larger
    product runs packed: OpenBLAS is faster on its own there (0.25 against 0.34 ms at
    (1, 768, 3072)), but such a call leaves OpenBLAS's workers spinning beside MKL's (see
    `matmul`). A oneDNN weight stands aside in a process forked after oneDNN ran, where GNU
    OpenMP's threads are gone (runtime/kernels/onednn.py, on forks): numpy multiplies there."""
    return (
        packed is not None
        and a.size * packed.n > SMALL_PRODUCT * _small_factor
        and (not isinstance(packed, onednn_matmul.MatMulWeight) or onednn.available())
        and b.shape == packed.source_shape
        and a.dtype == np.float32
        and a.ndim >= 2
        and a.shape[-1] == packed.k
        and a.size // packed.k * packed.n < INT_LIMIT
    )


def pack_constant(
    value: ir.Value | None, xp, trans: bool = False
) -> PackedWeight | onednn_matmul.MatMulWeight | None:
    """A kernel's constant 2-D float32 B input prepared once for the library `backend_name()`
    names (MKL's packed layout, oneDNN's reordered one), or None to use numpy.

    None also for an initializer that is a graph input: a feed may replace it at run time.
    """
    if value is None or value.const_value is None or value.is_graph_input() or xp is not np:
        return None
    library = backend_name()
    if value.dtype != ir.DataType.FLOAT or library == "numpy":
        return None
    array = value.const_value.numpy()
    if array.ndim != 2 or 0 in array.shape:
        return None
    if library == "onednn":
        return onednn_matmul.MatMulWeight(array, trans=trans)
    return PackedWeight(array, trans=trans)
