"""The reduction family against ONNX's backend node test cases, and against onnxruntime for
the attribute-axes opsets the suite no longer covers."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import reduction
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    one_node_model,
    run_kernel,
)

test_node_case = node_case_test(reduction.KERNELS)


# ---- what the conformance suite doesn't reach, against onnxruntime ------------------------------

RNG = np.random.default_rng(2)
FLOATS = RNG.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)
REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
]  # fmt: skip


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([1], 0), ([0, -1], 1), ([-2], 0)])
def test_axes_as_attribute_at_opset_11(op_type, axes, keepdims):
    attributes = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
    assert_same_as_onnxruntime(op_type, [FLOATS], 11, **attributes)


@pytest.mark.parametrize("op_type", REDUCE_OPS)
def test_axes_as_input_at_opset_18(op_type):
    assert_same_as_onnxruntime(op_type, [FLOATS, np.array([0, 2], dtype=np.int64)], 18, keepdims=0)


def test_reduce_sum_axes_input_arrives_at_opset_13():
    axes = np.array([1], dtype=np.int64)
    assert_same_as_onnxruntime("ReduceSum", [FLOATS, axes], 13)
    assert_same_as_onnxruntime("ReduceSum", [FLOATS], 13, noop_with_empty_axes=1)


def test_integer_sums_keep_their_type():
    x = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    for op_type in ("ReduceSum", "ReduceProd", "ReduceSumSquare", "ReduceMean"):
        (y,) = run_kernel(one_node_model(op_type, [x % 7 + 1], 11, axes=[2]), [x % 7 + 1])
        assert y.dtype == np.int32, op_type
    assert_same_as_onnxruntime("ReduceSum", [x], 11, axes=[0, 2], keepdims=0)


def test_log_sum_exp_of_large_and_infinite_values():
    x = np.array([[1000.0, 1000.0, -np.inf], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    (y,) = run_kernel(one_node_model("ReduceLogSumExp", [x], 13, axes=[1], keepdims=0), [x])
    np.testing.assert_allclose(y, [1000.0 + np.log(2.0), -np.inf], rtol=1e-6)


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extremes_with_ties_at_opset_12(op_type, last):
    x = np.array([[[1, 5, 5], [0, 0, 2]], [[3, 3, 3], [7, 1, 7]]], dtype=np.float32)
    assert_same_as_onnxruntime(op_type, [x], 12, axis=-1, keepdims=0, select_last_index=last)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_on_a_middle_axis(exclusive, reverse):
    assert_same_as_onnxruntime(
        "CumSum", [FLOATS, np.array(1, np.int64)], 14, exclusive=exclusive, reverse=reverse
    )
