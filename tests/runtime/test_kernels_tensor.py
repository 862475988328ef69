"""The tensor family against ONNX's backend node test cases."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import tensor
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test, one_node_model, run_kernel

test_node_case = node_case_test(tensor.KERNELS)


# ---------------------------------------------------------------- against onnxruntime

I64 = np.int64


@pytest.mark.parametrize(
    "starts, ends, axes, steps",
    [
        ([-1, 10], [-100, -1], [1, 2], [-2, 1]),  # negative step running off the front
        ([5, 0], [0, 2**62], [-1, 0], [-1, 3]),  # huge end, negative axis
        ([2], [2], [1], [1]),  # empty result
    ],
    ids=["negative_step", "clamped", "empty"],
)
def test_slice_matches_onnxruntime(starts, ends, axes, steps):
    x = np.arange(4 * 6 * 7, dtype=np.float32).reshape(4, 6, 7)
    inputs = [x, np.array(starts, I64), np.array(ends, I64), np.array(axes, I64), np.array(steps, I64)]
    assert_same_as_onnxruntime("Slice", inputs, opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_with_negative_pads_matches_onnxruntime(mode):
    x = np.random.default_rng(0).standard_normal((2, 5, 6)).astype(np.float32)
    pads = np.array([0, 2, -1, 1, -2, 3], I64)
    inputs = [x, pads, np.array(1.5, np.float32)] if mode == "constant" else [x, pads]
    assert_same_as_onnxruntime("Pad", inputs, opset=19, mode=mode)


def test_pad_with_axes_matches_onnxruntime():
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    inputs = [x, np.array([1, 2, 0, 3], I64), None, np.array([-1, 1], I64)]
    assert_same_as_onnxruntime("Pad", inputs, opset=18, mode="constant")


def test_split_num_outputs_with_a_short_last_part_matches_onnxruntime():
    x = np.arange(2 * 11, dtype=np.float32).reshape(2, 11)
    assert_same_as_onnxruntime("Split", [x], opset=18, outputs=3, axis=1, num_outputs=3)


def test_reshape_keeps_zero_dims_and_allowzero_empties_them():
    x = np.zeros((3, 0, 4), np.float32)
    assert_same_as_onnxruntime("Reshape", [x, np.array([0, 4, -1], I64)], opset=14)
    assert_same_as_onnxruntime("Reshape", [x, np.array([3, 0, 4], I64)], opset=14, allowzero=1)


def test_shape_start_end_match_onnxruntime():
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert_same_as_onnxruntime("Shape", [x], opset=15, start=-3, end=-1)


def test_views_never_let_a_kernel_write_into_its_input():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    kept = x.copy()
    (y,) = run_kernel(one_node_model("Transpose", [x], 17, perm=[2, 0, 1]), [x])
    assert np.shares_memory(x, y)  # a view, by design: no copy for a Transpose
    np.testing.assert_array_equal(x, kept)
