"""Honouring `intra_op_num_threads`: our kernels' threads are numpy's BLAS threads, and MKL's
where products against constant weights run on it (runtime/kernels/gemm.py).

threadpoolctl applies the limit to the BLAS numpy loaded, at once; MKL, loaded by us through
ctypes, gets the same count through its own MKL_Set_Num_Threads. The limit is process-wide:
the last session created with a non-zero value wins.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits

from runtime.kernels import gemm


def limit_blas_threads(count: int) -> None:
    """Limit BLAS and MKL to `count` threads (0 leaves the libraries' defaults)."""
    if count:
        threadpool_limits(limits=count, user_api="blas")
        gemm.set_threads(count)
