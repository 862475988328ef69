"""The canary: a fixed matrix product every job times next to its model, so a job that ran in a slow
moment of a shared machine can be recognized and its timings discounted (`service.domain.timing`).

A 128×128 float32 product on one thread: small enough to cost a few milliseconds, big enough to
need the same caches, memory bandwidth and core the model's kernels do. The inputs are fixed so
every job on every machine times the same work.
"""

from __future__ import annotations

import time

import numpy as np
from threadpoolctl import threadpool_limits

SIZE = 128
REPEATS = 15
INNER = 20  # products per timed repeat: one product is too short for the clock


def time_canary(repeats: int = REPEATS) -> float:
    """Median milliseconds of INNER products, over `repeats` timed repeats (one untimed first)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    b = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    out = np.empty_like(a)
    samples = []
    with threadpool_limits(limits=1):
        np.matmul(a, b, out=out)
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(INNER):
                np.matmul(a, b, out=out)
            samples.append((time.perf_counter() - start) * 1000)
    return float(np.median(samples))
