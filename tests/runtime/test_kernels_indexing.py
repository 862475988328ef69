"""The indexing family against ONNX's backend node test cases."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import indexing
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test

test_node_case = node_case_test(indexing.KERNELS)


# ---------------------------------------------------------------- against onnxruntime

I64 = np.int64


@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_breaks_ties_by_lower_index_like_onnxruntime(largest):
    x = np.array([[3, 1, 3, 2, 1, 3, 2], [0, 0, 0, 0, 0, 0, 0]], np.float32)
    assert_same_as_onnxruntime("TopK", [x, np.array([4], I64)], opset=11, outputs=2, largest=largest)


def test_top_k_on_uint8_largest_does_not_overflow():
    x = np.array([[0, 255, 7, 255, 1]], np.uint8)
    assert_same_as_onnxruntime("TopK", [x, np.array([3], I64)], opset=11, outputs=2)


def test_gather_nd_with_batch_dims_matches_onnxruntime():
    data = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    indices = np.array([[[1, -1], [0, 2]], [[2, 3], [-3, 0]]], I64)  # per batch: two (dim1, dim2) pairs
    assert_same_as_onnxruntime("GatherND", [data, indices], opset=13, batch_dims=1)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_with_repeated_indices_matches_onnxruntime(reduction):
    data = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    indices = (
        np.array([[0, -1, 1], [2, 2, 2]], I64)
        if reduction != "none"
        else np.array([[0, -1, 1], [2, 3, 0]], I64)
    )
    updates = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    assert_same_as_onnxruntime(
        "ScatterElements", [data, indices, updates], opset=18, axis=1, reduction=reduction
    )


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_matches_onnxruntime(reduction):
    data = np.random.default_rng(3).standard_normal((4, 3, 2)).astype(np.float32)
    indices = np.array([[1], [3]], I64) if reduction == "none" else np.array([[1], [1], [3]], I64)
    updates = np.random.default_rng(4).standard_normal((len(indices), 3, 2)).astype(np.float32)
    assert_same_as_onnxruntime("ScatterND", [data, indices, updates], opset=18, reduction=reduction)


def test_scatter_does_not_write_into_data():
    data = np.zeros((2, 2), np.float32)
    assert_same_as_onnxruntime(
        "ScatterND", [data, np.array([[0, 1]], I64), np.array([5.0], np.float32)], opset=16
    )
    assert not data.any()


def test_one_hot_negative_indices_and_axis_match_onnxruntime():
    indices = np.array([[0, -1], [2, 5]], I64)
    assert_same_as_onnxruntime(
        "OneHot",
        [indices, np.array(4, I64), np.array([0.5, 2.0], np.float32)],
        opset=11,
        axis=1,
    )
