"""Attention's two per-head products on oneDNN's matmul, every operand read or written where it
lies: Q, K and V as head-strided views of their (B, L, N*H) projections, the context straight
into its (B, S, N*Hv) output, so no head is copied out and none merged back.

Why oneDNN here: where the session's kernel race chose oneDNN for the products against weights
(runtime/kernel_choice.py), these small products (12 heads of 128x128x64 at BERT-base shapes)
measured some 10% faster on oneDNN than on MKL's batch-strided SGEMM on the 2-core AMD EPYC
(fastest of 300 at load average ~4.4: QK^T 0.136-0.157 against 0.155-0.176 ms, PV 0.135-0.150
against 0.155-0.174; `python -m bench.attention_micro --products`), and the PV product writes the
merged context itself, which MKL's batch call cannot (its C matrices may not interleave). Both
libraries share one OpenMP pool (runtime/kernels/openmp.py), so this adds no second set of workers.

A primitive is fixed to its shapes and strides; a kernel keeps one pair per geometry it has met
(`HeadProductsCache`), which for a static-shape model is one.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from runtime.kernels import onednn


class StridedBatchMatMul:
    """C = A @ B over leading batch dimensions, each operand given by its dims and element strides."""

    def __init__(self, a: tuple[list[int], list[int]], b: tuple[list[int], list[int]], c: tuple[list[int], list[int]]):
        library = onednn.library()
        self._descs = [onednn.memory_desc(dims, strides) for dims, strides in (a, b, c)]
        primitive_desc = onednn.Handle("dnnl_primitive_desc_destroy")
        a_desc, b_desc, c_desc = (desc.pointer for desc in self._descs)
        onednn.check(
            library.dnnl_matmul_primitive_desc_create(
                ctypes.byref(primitive_desc.pointer), onednn.engine(), a_desc, b_desc, None, c_desc, None
            ),
            "matmul_primitive_desc_create",
        )
        self._primitive = onednn.create_primitive(primitive_desc)
        self._primitive_desc = primitive_desc
        self._memories = [onednn.memory(desc.pointer) for desc in self._descs]

    @property
    def implementation(self) -> str:
        return onednn.implementation(self._primitive_desc)

    def __call__(self, a_address: int, b_address: int, c_address: int) -> None:
        library = onednn.library()
        a, b, c = self._memories
        with onednn.STREAM_LOCK:
            library.dnnl_memory_set_data_handle(a.pointer, a_address)
            library.dnnl_memory_set_data_handle(b.pointer, b_address)
            library.dnnl_memory_set_data_handle(c.pointer, c_address)
            onednn.execute(self._primitive, [(onednn.ARG_SRC, a), (onednn.ARG_WEIGHTS, b), (onednn.ARG_DST, c)])


def _elements(array: np.ndarray) -> list[int]:
    return [stride // array.itemsize for stride in array.strides]


def head_products(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int):
    """(QK^T, PV) primitives for (B, S, N*H) q and (B, T, N*H) k, (B, T, N*Hv) v float32 views
    whose last axis is contiguous: QK^T writes contiguous (B, N, S, T) scores, PV reads them and
    writes the context as a C-contiguous (B, S, N*Hv)."""
    batch, seq, width_q = q.shape
    total, width_v = k.shape[1], v.shape[2]
    head, head_v = width_q // heads, width_v // heads
    (q_batch, q_row, _), (k_batch, k_row, _), (v_batch, v_row, _) = _elements(q), _elements(k), _elements(v)
    scores = ([batch, heads, seq, total], [heads * seq * total, seq * total, total, 1])
    qk = StridedBatchMatMul(
        ([batch, heads, seq, head], [q_batch, head, q_row, 1]),
        ([batch, heads, head, total], [k_batch, head, 1, k_row]),  # K^T: K's rows read as columns
        scores,
    )
    pv = StridedBatchMatMul(
        scores,
        ([batch, heads, total, head_v], [v_batch, head_v, v_row, 1]),
        ([batch, heads, seq, head_v], [seq * width_v, head_v, width_v, 1]),  # heads side by side
    )
    return qk, pv


class HeadProductsCache:
    """A kernel's `head_products`, one pair per geometry (shapes, strides, heads)."""

    def __init__(self) -> None:
        self._pairs: dict[tuple, tuple[StridedBatchMatMul, StridedBatchMatMul]] = {}
        self._lock = threading.Lock()

    def get(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int):
        key = (q.shape, q.strides, k.shape, k.strides, v.shape, v.strides, heads)
        pair = self._pairs.get(key)
        if pair is None:
            with self._lock:
                pair = self._pairs.get(key) or head_products(q, k, v, heads)
                self._pairs[key] = pair
        return pair
