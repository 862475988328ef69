"""bench.attention_small: both paths run at every shape and agree; the row names the one the kernel takes."""

from __future__ import annotations

import pytest

from bench import attention_small
from runtime import threads
from runtime.kernels import compiled, gemm, onednn


@pytest.mark.skipif(not onednn.available(), reason=f"oneDNN is not loadable here: {onednn.unavailable_reason()}")
def test_each_row_times_both_paths_and_names_the_one_taken(monkeypatch):
    monkeypatch.setattr(attention_small, "SHAPES", [(16, 128, 2), (32, 256, 4), (64, 256, 4)])
    # One thread is the benchmark's process-wide setting; not this test worker's.
    monkeypatch.setattr(threads, "limit_blas_threads", lambda count: None)
    monkeypatch.setattr(gemm, "set_threads", lambda count: None)
    rows = attention_small.measure("onednn", calls=2)  # it also checks the two paths' outputs agree
    assert [row["macs"] for row in rows] == [65_536, 524_288, 2_097_152]
    assert [row["takes"] for row in rows] == ["loop", "loop", "products"]
    assert all(row["loop_us"] > 0 and row["products_us"] > 0 for row in rows)
    assert compiled.SMALL_ATTENTION == 2**20  # the patch inside `measure` is undone
