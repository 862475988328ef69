"""Does oneDNN's second thread work? One convolution and one product on oneDNN, called back to
back with the one-thread pass a model runs between them, with the OpenMP workers sleeping at once
or spinning 1 ms between calls (runtime/kernels/openmp.py). Not a test.

    .venv/bin/python -m bench.openmp_wait

For each, the fastest and median call and the share of calls that beat three quarters of the
one-thread time (taken first, on one thread): a call that slow had its second thread working.
A worker that sleeps between calls must be woken for every call; where that takes as long as
the call (a loaded machine, or a quiet VM whose idle virtual CPU sits halted), the calling
thread does the work alone. The 1-minute load average is printed with each line.
"""

from __future__ import annotations

import os

import numpy as np

from bench.gemm_micro import call_times_ms
from runtime.kernels import compiled, libraries, onednn, onednn_conv, onednn_matmul, openmp
from runtime.threads import limit_blas_threads

CALLS = 300


def _convolution():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 256, 3, 3), dtype=np.float32)
    primitive = onednn_conv.ConvPrimitive(
        (1, 14, 14, 256), weight, True, group=1, strides=[1, 1], dilations=[1, 1], begin=[1, 1], end=[1, 1],
        out=[14, 14],
    )  # fmt: skip
    x = rng.standard_normal((1, 14, 14, 256), dtype=np.float32)
    bias = np.zeros(256, np.float32)

    def call():
        y = primitive(x, bias)
        compiled.conv_epilogue_rows(y.reshape(-1, 256), bias, np.empty((0, 0), np.float32), True)

    return "conv 3x3 256->256 @14x14", call


def _product():
    rng = np.random.default_rng(0)
    weight = onednn_matmul.MatMulWeight(rng.standard_normal((768, 3072), dtype=np.float32))
    a = rng.standard_normal((128, 768), dtype=np.float32)
    bias = rng.standard_normal(3072, dtype=np.float32)
    after = np.empty((128, 3072), np.float32)
    return "matmul 128x768x3072", lambda: compiled.bias_gelu_rows(weight.matmul(a), bias, after)


def _times(call, calls: int) -> np.ndarray:
    return np.array(call_times_ms(call, calls))


def main() -> None:
    if not onednn.available() or not openmp.settable():
        raise SystemExit(
            f"needs oneDNN and Intel OpenMP with KMP_BLOCKTIME unset: {onednn.unavailable_reason() or 'see openmp.py'}"
        )
    for make in (_convolution, _product):
        # oneDNN plans a primitive's threads when it is created: one built per thread count.
        limit_blas_threads(1)
        name, call = make()
        alone = _times(call, 50).min()
        limit_blas_threads(2)
        name, call = make()
        print(f"{name}: one thread, fastest {alone:.3f} ms (load average {os.getloadavg()[0]:.2f})")
        for wait in ("sleep", "spin", "sleep", "spin"):
            with libraries.using({"wait": wait}):
                times = _times(call, CALLS)
            both = np.mean(times < 0.75 * alone) * 100
            print(f"  two threads, workers {wait:5s}: fastest {times.min():.3f}, median {np.median(times):.3f} ms;"
                  f" {both:3.0f}% of calls had both threads working (load average {os.getloadavg()[0]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
