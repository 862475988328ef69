"""The activation family against ONNX's backend node test cases, and against onnxruntime for
the pre-13 softmax semantics and for inputs the suite doesn't try."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from runtime.kernels import activation
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    one_node_model,
    run_kernel,
)

test_node_case = node_case_test(activation.KERNELS)


# ---- what the conformance suite doesn't reach, against onnxruntime ------------------------------

RNG = np.random.default_rng(1)
FLOATS = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 4
EXTREMES = np.array([-1e4, -100.0, -30.0, -1e-8, 0.0, 1e-8, 30.0, 100.0, 1e4], dtype=np.float32)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 2, -1, -3])
def test_softmax_family_flattens_at_axis_before_opset_13(op_type, axis):
    attributes = {} if axis is None else {"axis": axis}
    assert_same_as_onnxruntime(op_type, [FLOATS], 11, **attributes)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -2])
def test_softmax_family_single_axis_from_opset_13(op_type, axis):
    assert_same_as_onnxruntime(op_type, [FLOATS], 13, axis=axis)


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 3), (11, 3), (11, None)])
def test_softmax_over_the_last_axis_takes_the_compiled_loop_and_matches_onnxruntime(opset, axis):
    # Contiguous float32 over the last axis runs compiled.masked_softmax_rows; rows of extreme
    # spread check its exp cut-off (0 below -86.5) against onnxruntime's.
    x = np.concatenate([FLOATS.reshape(-1, 5), np.tile(EXTREMES[:5], (3, 1)) * [[1], [0.01], [-1]]])
    x = x.astype(np.float32).reshape(3, 3, 3, 5)
    attributes = {} if axis is None else {"axis": axis}
    assert_same_as_onnxruntime("Softmax", [x], opset, **attributes)


def test_compiled_softmax_keeps_the_numpy_forms_nan_and_inf_rows():
    x = np.float32([[1, np.inf, 0], [-np.inf, -np.inf, -np.inf], [np.nan, 1, 2], [0, -1e30, 3]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf in the numpy reference
        (fast,) = run_kernel(one_node_model("Softmax", [x], 13), [x])
        (slow,) = run_kernel(one_node_model("Softmax", [x.astype(np.float64)], 13), [x.astype(np.float64)])
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert np.isnan(fast[:3]).all() and not np.isnan(fast[3]).any()


def test_hardmax_picks_the_first_of_tied_maxima():
    x = np.array([[1, 3, 3], [2, 2, 2]], dtype=np.float32)
    (y,) = run_kernel(one_node_model("Hardmax", [x], 13), [x])
    np.testing.assert_array_equal(y, [[0, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    assert_same_as_onnxruntime("Gelu", [FLOATS], 20, approximate=approximate)


@pytest.mark.parametrize(
    "op_type,opset",
    [("Sigmoid", 13), ("Softplus", 22), ("Mish", 22), ("Elu", 22), ("Selu", 22), ("Celu", 12), ("Gelu", 20)],
)
def test_extreme_inputs_stay_finite_and_quiet(op_type, opset):
    model = one_node_model(op_type, [EXTREMES], opset)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning would mean exp met a huge argument
        (ours,) = run_kernel(model, [EXTREMES])
    assert np.isfinite(ours).all()
    assert_same_as_onnxruntime(op_type, [EXTREMES], opset)


@pytest.mark.parametrize(
    "op_type,attributes",
    [
        ("LeakyRelu", {"alpha": 0.2}),
        ("ThresholdedRelu", {"alpha": 0.5}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("HardSwish", {}),
        ("Softsign", {}),
        ("Shrink", {"bias": 0.5, "lambd": 1.5}),
        ("Elu", {"alpha": 0.5}),
        ("Celu", {"alpha": 2.0}),
    ],
)
def test_attributes(op_type, attributes):
    assert_same_as_onnxruntime(op_type, [FLOATS], 22 if op_type != "Shrink" else 9, **attributes)


def test_prelu_slope_broadcasts_per_channel():
    slope = np.array([0.1, 0.2, 0.3], dtype=np.float32).reshape(3, 1, 1)
    assert_same_as_onnxruntime("PRelu", [FLOATS, slope], 16)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op_type,opset", [("Gelu", 20), ("Sigmoid", 13), ("LeakyRelu", 16), ("Softmax", 13)])
def test_16_bit_floats_keep_their_type_and_round_once(op_type, opset, dtype):
    x = FLOATS.astype(dtype)
    (narrow,) = run_kernel(one_node_model(op_type, [x], opset), [x])
    wide = x.astype(np.float32)
    (reference,) = run_kernel(one_node_model(op_type, [wide], opset), [wide])
    assert narrow.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(narrow, reference.astype(dtype))
