"""The pool family against ONNX's backend node test cases."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import pool
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test

test_node_case = node_case_test(pool.KERNELS)


# ---------------------------------------------------------------- against onnxruntime
# Window geometry (ceil_mode overhang, SAME pads, dilations, count_include_pad divisors) is
# where pooling kernels go wrong; each config below stresses one of those against onnxruntime.

POOL_CONFIGS = {
    "resnet_3x3_s2_p1": ((2, 8, 16, 16), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "ceil_mode_overhang": ((1, 3, 10, 9), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "ceil_mode_with_pads": (
        (1, 3, 11, 11),
        dict(kernel_shape=[3, 2], strides=[3, 2], pads=[1, 0, 1, 1], ceil_mode=1),
    ),
    "same_upper": ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    "same_lower": ((1, 2, 7, 8), dict(kernel_shape=[2, 4], strides=[1, 3], auto_pad="SAME_LOWER")),
    "dilated": ((1, 2, 12, 12), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 1, 1])),
    "pool1d": ((2, 4, 20), dict(kernel_shape=[4], strides=[3], pads=[1, 2])),
    "pool3d": ((1, 2, 6, 7, 8), dict(kernel_shape=[2, 3, 3], strides=[2, 2, 1], pads=[0, 1, 1, 1, 0, 1])),
}


@pytest.mark.parametrize("name", list(POOL_CONFIGS))
def test_max_pool_with_indices_matches_onnxruntime(name):
    shape, attributes = POOL_CONFIGS[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert_same_as_onnxruntime("MaxPool", [x], opset=12, outputs=2, **attributes)


def test_max_pool_column_major_indices_match_onnxruntime():
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32)
    assert_same_as_onnxruntime(
        "MaxPool", [x], opset=12, outputs=2, kernel_shape=[2, 3], strides=[2, 2], storage_order=1
    )


def test_max_pool_int8_pads_with_the_type_minimum():
    x = np.random.default_rng(2).integers(-128, 127, (1, 2, 6, 6)).astype(np.int8)
    assert_same_as_onnxruntime("MaxPool", [x], opset=12, kernel_shape=[3, 3], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("name", [n for n in POOL_CONFIGS if n != "dilated"])
@pytest.mark.parametrize("include_pad", [0, 1], ids=["exclude_pad", "include_pad"])
def test_average_pool_matches_onnxruntime(name, include_pad):
    shape, attributes = POOL_CONFIGS[name]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    assert_same_as_onnxruntime("AveragePool", [x], opset=17, count_include_pad=include_pad, **attributes)


def test_lp_pool_matches_onnxruntime():
    x = np.random.default_rng(4).standard_normal((1, 3, 9, 9)).astype(np.float32)
    assert_same_as_onnxruntime(
        "LpPool", [x], opset=11, p=3, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
    )


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools_match_onnxruntime(op_type):
    x = np.random.default_rng(5).standard_normal((2, 5, 7, 7)).astype(np.float32)
    assert_same_as_onnxruntime(op_type, [x], 17)
