"""float32 products against a constant weight on oneDNN's matmul primitive, the weight reordered
once into the blocked layout oneDNN's kernel reads (as MKL's packed SGEMM and onnxruntime's
MLAS prepacking do).

Why a second GEMM library beside MKL (runtime/kernels/gemm.py): MKL takes its AVX-512 paths on
Intel processors only; on an AMD EPYC (Zen 4, AVX-512) its packed SGEMM measured slower than
numpy's OpenBLAS and well below onnxruntime's MLAS (issue 14: 155 / 162 / 214 GFLOP/s at
(128, 768, 3072)). oneDNN dispatches on the instruction set, not the vendor, so on that CPU it
runs its AVX-512 brgemm kernels. Which library a session uses is measured, not assumed
(runtime/kernel_choice.py).

A primitive is fixed to its M (the rows of A); a weight keeps one primitive, and one reordered
copy of itself, per M it has met, which for a static-shape model is one.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from runtime.kernels import onednn
from runtime.kernels.onednn_call import PreparedCall


class MatMulWeight:
    """A constant float32 B (K, N), or its transpose (N, K) with `trans`, for `a @ B` on oneDNN."""

    library = "onednn"

    def __init__(self, array: np.ndarray, trans: bool = False) -> None:
        if not onednn.available():
            raise RuntimeError(f"oneDNN is not available: {onednn.unavailable_reason()}")
        if array.ndim != 2 or array.dtype != np.float32:
            raise ValueError(f"MatMulWeight takes a 2-D float32 array, got {array.dtype} {array.shape}")
        self._source = np.ascontiguousarray(array)
        self.source_shape = self._source.shape
        self.k, self.n = (self.source_shape[1], self.source_shape[0]) if trans else self.source_shape
        self._trans = trans
        self._by_rows: dict[int, _Primitive] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return sum(primitive.nbytes for primitive in self._by_rows.values())

    def matmul(self, a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """a @ B for float32 `a` of shape (..., K); the leading dimensions are flattened into M."""
        if a.dtype != np.float32 or a.ndim < 1 or a.shape[-1] != self.k:
            raise ValueError(f"MatMulWeight: A {a.dtype} {a.shape} does not meet a B of K = {self.k}")
        a = np.ascontiguousarray(a)
        rows = a.size // self.k if self.k else 0
        if out is None:
            out = np.empty((*a.shape[:-1], self.n), np.float32)
        if rows == 0 or self.n == 0:
            return out
        if self.k == 0:
            out[...] = 0
            return out
        primitive = self._by_rows.get(rows)
        if primitive is None:
            with self._lock:
                primitive = self._by_rows.get(rows) or _Primitive(rows, self._source, self._trans)
                self._by_rows[rows] = primitive
        primitive(a, out)
        return out


class _Primitive:
    """oneDNN's matmul for one M, with the weight in the layout it chose."""

    def __init__(self, rows: int, source: np.ndarray, trans: bool) -> None:
        library = onednn.library()
        k, n = (source.shape[1], source.shape[0]) if trans else source.shape
        src = onednn.memory_desc([rows, k], [k, 1])
        dst = onednn.memory_desc([rows, n], [n, 1])
        user_weight = onednn.memory_desc([k, n], [1, k] if trans else [n, 1])
        any_weight = onednn.memory_desc([k, n])
        primitive_desc = onednn.Handle("dnnl_primitive_desc_destroy")
        onednn.check(
            library.dnnl_matmul_primitive_desc_create(
                ctypes.byref(primitive_desc.pointer),
                onednn.engine(),
                src.pointer,
                any_weight.pointer,
                None,
                dst.pointer,
                None,
            ),
            "matmul_primitive_desc_create",
        )
        self._primitive = onednn.create_primitive(primitive_desc)
        self._weight_buffer, self._weight = onednn.reordered_weight(primitive_desc, user_weight, source)
        self._primitive_desc = primitive_desc
        self._src = onednn.memory(src.pointer)
        self._dst = onednn.memory(dst.pointer)
        args = onednn.prepared_args(
            [(onednn.ARG_SRC, self._src), (onednn.ARG_WEIGHTS, self._weight), (onednn.ARG_DST, self._dst)]
        )
        self._call = PreparedCall(self._primitive, self._src, self._dst, args)

    @property
    def nbytes(self) -> int:
        return self._weight_buffer.nbytes

    @property
    def implementation(self) -> str:
        """oneDNN's name for its kernel, e.g. "brg:avx512_core"."""
        return onednn.implementation(self._primitive_desc)

    def __call__(self, a: np.ndarray, out: np.ndarray) -> None:
        self._call(a, out)
