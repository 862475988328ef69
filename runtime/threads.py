"""Honouring `intra_op_num_threads`: our kernels' threads are numpy's BLAS threads.

threadpoolctl applies the limit to the BLAS numpy loaded, at once. The limit is
process-wide: the last session created with a non-zero value wins.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def limit_blas_threads(count: int) -> None:
    """Limit BLAS to `count` threads (0 leaves the library's default)."""
    if count:
        threadpool_limits(limits=count, user_api="blas")
