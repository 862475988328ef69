"""Honouring `intra_op_num_threads`: our kernels' threads are numpy's BLAS threads, MKL's
where products against constant weights run on it (runtime/kernels/gemm.py), oneDNN's
OpenMP workers where convolutions run on it (runtime/kernels/onednn.py), and the compiled row
loops' parts on those same workers (runtime/kernels/row_threads.py).

threadpoolctl applies the limit to the BLAS numpy loaded, at once; MKL, loaded by us through
ctypes, gets the same count through its own MKL_Set_Num_Threads. The limit is process-wide:
the last session created with a non-zero value wins. OpenMP's is the creating thread's, which
is the thread that runs the session in the usual case.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits

from runtime.kernels import gemm, onednn, row_threads


def limit_blas_threads(count: int) -> None:
    """Limit BLAS and MKL to `count` threads (0 leaves the libraries' defaults)."""
    if count:
        threadpool_limits(limits=count, user_api="blas")
        gemm.set_threads(count)
        # numba's first set_num_threads starts its omp pool on libiomp5, which sets OpenMP's count
        # back to one per core; oneDNN's must come after it, or a one-thread session's products
        # run on two, and on a loaded machine wait for a second core (docs/benchmarks.md, issue 31).
        row_threads.set_threads(count)
        onednn.set_threads(count)
