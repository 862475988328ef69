"""The compiled row loops split across the products' OpenMP workers (runtime/kernels/row_threads.py).

A loop run in parts must give the same bits as the one-thread loop: each row is computed by the
same code whichever thread runs it. The parts are forced here (the `_chunks` functions with a
part count) on row counts that do not divide evenly, so the split is tested on any machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from runtime.kernels import compiled, libraries, openmp, row_threads

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)


def normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("parts", [2, 3, 7])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_activation_in_parts_is_bitwise_the_one_thread_loop(with_bias, fast, parts):
    x, bias = normal(7, 96) * 4, normal(96) if with_bias else np.zeros(0, np.float32)
    one, split = np.empty_like(x), np.empty_like(x)
    compiled.gelu_span(x, bias, fast, one, 0, 7)
    compiled.gelu_chunks(x, bias, fast, split, parts)
    np.testing.assert_array_equal(split, one)


@pytest.mark.parametrize("sum_is_output", [False, True])
@pytest.mark.parametrize("parts", [2, 3])
def test_skip_layer_norm_in_parts_is_bitwise_and_each_part_has_its_own_scratch_row(parts, sum_is_output):
    rows, width = 9, 64
    x, skip, bias, gamma, beta = normal(rows, width), normal(3, width), normal(width), normal(width), normal(width)
    results = []
    for run in ("one", "split"):
        out = np.empty_like(x)
        summed = np.empty_like(x) if sum_is_output else np.empty((1, width), np.float32)
        mean, inv_std = np.empty(rows, np.float32), np.empty(rows, np.float32)
        args = (x, skip, bias, gamma, beta, np.float32(1e-5), True, out, summed, mean, inv_std)
        if run == "one":
            compiled.skip_layer_norm_span(*args, 0, rows)
        else:
            compiled.skip_layer_norm_chunks(*args, parts)
        results.append((out, mean, inv_std, summed if sum_is_output else None))
    for one, split in zip(*results, strict=True):
        if one is not None:
            np.testing.assert_array_equal(split, one)


@pytest.mark.parametrize("mask_shape", [(1, 1, 1, 16), (2, 1, 5, 16), (2, 3, 5, 16)])
def test_softmax_in_parts_is_bitwise_the_one_thread_loop(mask_shape):
    scores = normal(2, 3, 5, 16)
    mask = np.where(RNG.random(mask_shape) < 0.2, np.float32(-10000), np.float32(0)).astype(np.float32)
    one, split = scores.copy(), scores.copy()
    compiled.softmax_span(one, np.float32(0.125), mask, 0, 30)
    compiled.softmax_chunks(split, np.float32(0.125), mask, 4)
    np.testing.assert_array_equal(split, one)
    np.testing.assert_allclose(split.sum(-1), 1, rtol=1e-5)


@pytest.mark.parametrize("relu", [False, True])
def test_conv_epilogue_in_parts_is_bitwise_the_one_thread_loop(relu):
    y, bias, residual = normal(11, 32), normal(32), normal(11, 32)
    y[0, 0] = np.nan  # the clamp keeps NaN, split or not
    one, split = y.copy(), y.copy()
    compiled.conv_epilogue_span(one, bias, residual, relu, 0, 11)
    compiled.conv_epilogue_chunks(split, bias, residual, relu, 3)
    np.testing.assert_array_equal(split, one)


def test_small_loops_and_single_rows_stay_on_one_thread():
    assert row_threads.chunks(rows=128, elements=row_threads.MIN_ELEMENTS - 1) == 1
    assert row_threads.chunks(rows=1, elements=10 * row_threads.MIN_ELEMENTS) == 1


@pytest.mark.skipif(not openmp.available(), reason="needs Intel OpenMP (the mkl extra) to share its workers")
def test_a_large_loop_splits_into_the_sessions_thread_count(monkeypatch):
    monkeypatch.setattr(row_threads, "_threads", 0)
    monkeypatch.setattr(row_threads, "_enabled", None)
    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    big = row_threads.MIN_ELEMENTS * 4
    monkeypatch.setattr(row_threads, "_threads", 2)
    assert row_threads.chunks(rows=128, elements=big) == 1  # outside a session: no measured wait
    with libraries.using({"wait": "sleep"}):
        assert row_threads.chunks(rows=128, elements=big) == 1  # waking a halted worker costs more
    with libraries.using({"wait": "spin"}):
        assert row_threads.chunks(rows=128, elements=big) == min(2, numba.config.NUMBA_NUM_THREADS)
        monkeypatch.setattr(row_threads, "_threads", 1)
        assert row_threads.chunks(rows=128, elements=big) == 1  # intra_op_num_threads=1: one thread


def test_another_numba_threading_layer_keeps_the_loops_on_one_thread(monkeypatch):
    """numba's own pools would compete with the products' workers (see row_threads)."""
    monkeypatch.setattr(row_threads, "_enabled", None)
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "workqueue")
    try:
        assert not row_threads.enabled()
        assert row_threads.chunks(rows=128, elements=row_threads.MIN_ELEMENTS * 4) == 1
    finally:
        monkeypatch.setattr(row_threads, "_enabled", None)


@pytest.mark.skipif(
    not openmp.available() or not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="needs Intel OpenMP (the mkl extra), glibc's LD_DEBUG and two cores",
)
def test_the_split_loops_run_on_intel_openmps_workers_not_a_second_pool(tmp_path):
    """The reason the loops may split at all: numba's omp layer must bind its GOMP_parallel to
    the libiomp5 MKL and oneDNN use, not to a libgomp pool of its own."""
    script = (
        "import numpy as np, numba\n"
        "from runtime.kernels import compiled, row_threads\n"
        "from runtime.kernels import libraries\n"
        "row_threads.set_threads(2)\n"
        "x = np.ones((256, 1024), np.float32)\n"
        "out = np.empty_like(x)\n"
        "with libraries.using({'wait': 'spin'}):\n"
        "    assert row_threads.chunks(256, x.size) > 1 or numba.config.NUMBA_NUM_THREADS == 1\n"
        "    compiled.bias_gelu_rows(x, np.zeros(1024, np.float32), out)\n"
        "print(numba.threading_layer())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    env.update(PYTHONPATH=str(ROOT), LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(tmp_path / "ld"))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "omp"
    bindings = "".join(path.read_text() for path in tmp_path.glob("ld*"))
    gomp = [line for line in bindings.splitlines() if "omppool" in line and "`GOMP_parallel'" in line]
    assert gomp, "numba's omp layer never bound GOMP_parallel"
    assert all("libiomp5" in line for line in gomp), gomp
