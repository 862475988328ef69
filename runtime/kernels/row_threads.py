"""Whether the compiled row loops (runtime/kernels/compiled.py) split their rows across threads.

The fused elementwise and normalization kernels between a transformer's products (BiasGelu,
SkipLayerNorm, the attention softmax) run on one thread unless they can share the products'
worker pool. A second pool beside it costs more than it saves: numba's own workers and the
BLAS's workers each spin after their parallel regions and steal the other's cores (BERT-base
went 121 -> 199 ms with numba's default pool beside OpenBLAS). Where Intel OpenMP is loaded
(runtime/kernels/openmp.py), numba's `omp` threading layer binds its GOMP_parallel calls to
that same libiomp5, so the rows run on the workers MKL and oneDNN use, waking and waiting as
the session's measured wait says. Only then are the loops split; elsewhere they stay on one thread.

The count follows `intra_op_num_threads` (`set_threads`, from runtime/threads.py), for the
calling thread as OpenMP's does. Small tensors stay on one thread: a parallel region costs a
few microseconds with spinning workers and tens with sleeping ones.
"""

from __future__ import annotations

import os

import numba

from runtime.kernels import libraries, openmp

# Below this many elements a loop stays on one thread: SkipLayerNorm on 1x128x768 (98,304)
# takes ~40 us alone, about what waking a sleeping worker costs.
MIN_ELEMENTS = 65_536

_threads = 0  # 0: not set by a session; the process's default (numba's, one per core)
_enabled: bool | None = None


def enabled() -> bool:
    """Whether the loops may split: libiomp5 loaded globally and numba's threading layer left to
    us (NUMBA_THREADING_LAYER unset) or set to `omp`; decided once per process."""
    global _enabled
    if _enabled is None:
        chosen = os.environ.get("NUMBA_THREADING_LAYER", "")
        _enabled = openmp.available() and chosen in ("", "omp")
        if _enabled:
            # Read by numba when it launches its first parallel loop; libiomp5 is already loaded
            # with global symbols, so the omp layer's GOMP_* calls resolve to it.
            numba.config.THREADING_LAYER = "omp"
    return _enabled


def set_threads(count: int) -> None:
    """The calling thread's thread count for the row loops (0 leaves the default)."""
    global _threads
    if count:
        _threads = count
        if enabled():
            numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))


def chunks(rows: int, elements: int) -> int:
    """How many parts a loop over `rows` rows (`elements` in all) runs in: 1 means one thread.

    Only while the session's workers spin between calls (its measured wait): a sleeping worker's
    virtual CPU halts, and waking it cost more than its part saved (BiasGelu and SkipLayerNorm on
    BERT-base shapes ran slower split than on one thread, workers sleeping, in
    `python -m bench.fused_kernels --threads 2` before this rule)."""
    if rows < 2 or elements < MIN_ELEMENTS or libraries.chosen("wait") != "spin" or not enabled():
        return 1
    threads = _threads or numba.config.NUMBA_NUM_THREADS
    return max(1, min(threads, numba.config.NUMBA_NUM_THREADS, rows))
