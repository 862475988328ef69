"""Honouring `intra_op_num_threads`: our kernels' threads are numpy's BLAS threads.

With threadpoolctl installed the limit is applied to the loaded BLAS at once. Without it,
the only lever is the environment variables BLAS reads when it starts, which are too late
for this process (numpy is loaded) but reach child processes; we set them and say so.
The limit is process-wide: the last session created with a non-zero value wins.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("fusionwatch.runtime")

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def limit_blas_threads(count: int) -> bool:
    """Limit BLAS to `count` threads (0: leave as is). True when applied to this process."""
    if count == 0:
        return True
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        for variable in THREAD_ENV_VARS:
            os.environ[variable] = str(count)
        log.warning(
            "intra_op_num_threads=%d not applied to this process: threadpoolctl is not installed "
            "(set %s before starting Python instead); child processes will inherit it",
            count,
            "/".join(THREAD_ENV_VARS),
        )
        return False
    threadpool_limits(limits=count, user_api="blas")
    return True
