"""service/domain/kernel_changes.py: which kernels moved most between two measurements."""

from __future__ import annotations

from service.domain.kernel_changes import KernelChange, kernel_changes


def test_the_largest_moves_come_first_and_a_kernel_on_one_side_ranks_by_its_whole_time():
    before = [{"op": "MatMul", "ms": 1.0}, {"op": "LayerNormalization", "ms": 0.05}, {"op": "Add", "ms": 0.08},
              {"op": "Add", "ms": 0.04}]
    after = [{"op": "MatMul", "ms": 1.04}, {"op": "SkipLayerNormalization", "ms": 0.27}, {"op": "Add", "ms": 0.05},
             {"op": "Where", "ms": "n/a"}]
    changes = kernel_changes(before, after, limit=3)
    assert changes == [KernelChange("SkipLayerNormalization", None, 0.27), KernelChange("Add", 0.08 + 0.04, 0.05),
                       KernelChange("LayerNormalization", 0.05, None)]
    assert changes[0].describe() == "SkipLayerNormalization – → 0.270 ms"
    assert kernel_changes([], [], limit=8) == []
