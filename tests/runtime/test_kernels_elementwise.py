"""The elementwise family against ONNX's backend node test cases."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pytest

from runtime.kernels import elementwise
from runtime.kernels.base import UnsupportedOp
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    one_node_model,
    run_kernel,
)

test_node_case = node_case_test(elementwise.KERNELS)


# ---- what the conformance suite doesn't reach, against onnxruntime ------------------------------

RNG = np.random.default_rng(0)
FLOATS = RNG.standard_normal((3, 4, 5)).astype(np.float32) * 3


@pytest.mark.parametrize("attributes", [{"min": -1.0, "max": 2.0}, {"max": 0.5}, {}])
def test_clip_bounds_as_attributes_before_opset_11(attributes):
    assert_same_as_onnxruntime("Clip", [FLOATS], 6, **attributes)


def test_clip_integer_with_only_upper_bound_input():
    x = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    assert_same_as_onnxruntime("Clip", [x, None, np.array(2, np.int32)], 13)


def test_integer_division_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, -1], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 4], dtype=np.int32)
    model = one_node_model("Div", [a, b], 14)
    np.testing.assert_array_equal(run_kernel(model, [a, b])[0], [3, -3, -3, 3, 0, 0])
    assert_same_as_onnxruntime("Div", [a, b], 14)


def test_pow_keeps_float_base_type_with_integer_exponent():
    assert_same_as_onnxruntime("Pow", [FLOATS, np.array([2], dtype=np.int64)], 15)


SPECIAL_FLOATS = np.array([0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 3e12, -7e-30], np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "exponent",
    [np.array(2, np.float32), np.array([3.0], np.float32), np.array(3, np.int64), np.array(2.0, np.float64)],
    ids=["2.0", "[3.0]", "int 3", "double 2.0"],
)
def test_pow_by_two_or_three_is_multiplied_out_like_onnxruntime(exponent, dtype):
    # These take the multiplied-out path; inf, NaN, signed zeros and overflow must match pow's.
    base = np.concatenate([SPECIAL_FLOATS, FLOATS.ravel()]).astype(dtype)
    assert_same_as_onnxruntime("Pow", [base, exponent], 15)
    (ours,) = run_kernel(one_node_model("Pow", [base, exponent], 15), [base, exponent])
    np.testing.assert_array_equal(np.signbit(ours[:2]), np.signbit(np.power(base[:2], exponent)))


@pytest.mark.parametrize(
    "base, exponent",
    [
        (FLOATS.astype(np.float16), np.array(3, np.float32)),  # float16: np.power, one rounding
        (FLOATS[0, 0, :1], np.array([[2.0]], np.float32)),  # the exponent has more dims
        (np.arange(-3, 4, dtype=np.int32), np.array(3, np.int32)),  # integers keep np.power
        (np.abs(FLOATS), np.array(2.5, np.float32)),
    ],
    ids=["float16", "wider exponent", "int32", "2.5"],
)
def test_pow_other_cases_take_np_power(base, exponent):
    assert_same_as_onnxruntime("Pow", [base, exponent], 15)


@pytest.mark.parametrize("to", [onnx.TensorProto.INT32, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL])
def test_cast_float_to_integer_truncates(to):
    x = np.array([-2.9, -0.5, 0.0, 0.7, 3.99, 250.5], dtype=np.float32)
    if to == onnx.TensorProto.UINT8:
        x = np.abs(x)  # negative floats to unsigned are undefined
    assert_same_as_onnxruntime("Cast", [x], 13, to=to)


def test_cast_strings_both_ways():
    numbers = np.array([1.5, -2.0, 1e-5, 1e8], dtype=np.float32)
    strings = run_kernel(one_node_model("Cast", [numbers], 13, to=onnx.TensorProto.STRING), [numbers])[0]
    assert strings.dtype == object
    texts = np.array(["3.14", "-1e-5", "+INF", "-inf", "NaN"], dtype=object)
    assert_same_as_onnxruntime("Cast", [texts], 13, to=onnx.TensorProto.FLOAT)
    back = run_kernel(one_node_model("Cast", [strings], 13, to=onnx.TensorProto.FLOAT), [strings])[0]
    np.testing.assert_array_equal(back, numbers)


@pytest.mark.parametrize("x", [np.array([True, False]), np.array([np.inf, -np.inf, np.nan, 0.25], np.float32),
                               np.array([-3, 7], np.int64)], ids=["bool", "special_floats", "int64"])
def test_cast_to_string_spells_as_onnxruntime_does(x):
    """Booleans as "1"/"0" (numpy's "True" reads back as no number: onnxruntime's
    cast_back_to_back_non_const_mixed_types_origin.onnx casts bool -> string -> int8), the special
    floats as the spec's reserved literals."""
    assert_same_as_onnxruntime("Cast", [x], 19, to=onnx.TensorProto.STRING)


def test_cast_opset_1_names_the_type_as_a_string():
    x = np.array([1.7, -1.7], dtype=np.float32)
    model = one_node_model("Cast", [x], 1, to="INT64")
    (y,) = run_kernel(model, [x])
    assert y.dtype == np.int64 and y.tolist() == [1, -1]


def test_cast_to_an_undefined_type_is_declined():
    x = np.zeros(2, np.float32)
    with pytest.raises(UnsupportedOp, match="Cast node .* attribute 'to'=0"):
        run_kernel(one_node_model("Cast", [x], 13, to=0), [x])


@pytest.mark.parametrize("op_type", ["Sum", "Mean", "Max", "Min"])
def test_variadic_ops_with_one_and_three_inputs(op_type):
    assert_same_as_onnxruntime(op_type, [FLOATS], 13)
    assert_same_as_onnxruntime(op_type, [FLOATS, FLOATS[:, :1, :], FLOATS[0, 0]], 13)


def test_erf_matches_math_erf_to_double_precision():
    x = np.concatenate([np.linspace(-10, 10, 4001), [0.0, -0.0, 1e-300, -1e-12, np.inf, -np.inf, np.nan]])
    model = one_node_model("Erf", [x], 13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value noise at any x
        (y,) = run_kernel(model, [x])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(y, expected, rtol=1e-14, atol=1e-300, equal_nan=True)
    assert np.signbit(y[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()


def test_erf_float32_is_within_a_few_ulp_and_never_past_one():
    x = np.linspace(-6, 6, 200001, dtype=np.float32)
    (y,) = run_kernel(one_node_model("Erf", [x], 13), [x])
    expected = np.array([math.erf(v) for v in x.tolist()])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=0, atol=5e-7)
    assert np.abs(y).max() <= 1.0


def test_erf_float32_against_onnxruntime():
    assert_same_as_onnxruntime("Erf", [FLOATS], 13)


def test_erf_float32_compiled_and_numpy_paths_agree_on_special_values():
    # A contiguous float32 input takes the compiled loop, a strided view the numpy form.
    values = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 4.5, -4.5, 1e-30, 0.5, -2.0])
    contiguous = np.repeat(values, 2)
    strided = contiguous[::2]
    assert not strided.flags.c_contiguous
    (fast,) = run_kernel(one_node_model("Erf", [contiguous], 13), [contiguous])
    (slow,) = run_kernel(one_node_model("Erf", [strided], 13), [strided])
    np.testing.assert_allclose(fast[::2], slow, rtol=0, atol=5e-7, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(fast[::2]), np.isnan(values))
    np.testing.assert_array_equal(np.signbit(fast[::2]), np.signbit(values))
    assert fast.dtype == np.float32 and np.abs(fast[~np.isnan(fast)]).max() <= 1.0


def test_kernels_never_write_into_their_inputs():
    a, b = FLOATS.copy(), FLOATS[0].copy()
    for op_type, inputs, opset in [
        ("Mean", [a, b, a], 13),
        ("Clip", [a, np.array(-1, np.float32), np.array(1, np.float32)], 13),
        ("Cast", [a], 13),
    ]:
        extra = {"to": onnx.TensorProto.FLOAT16} if op_type == "Cast" else {}
        run_kernel(one_node_model(op_type, inputs, opset, **extra), inputs)
    np.testing.assert_array_equal(a, FLOATS)
    np.testing.assert_array_equal(b, FLOATS[0])


# Where's copy-and-write path: one side a single value, the condition and the other side of the
# result's shape (the attention fusion's NaN guard). The backend node cases have none of these.
WHERE_VALUES = np.where(RNG.random((2, 3, 8)) < 0.2, np.float32(np.nan), FLOATS.reshape(2, 3, 10)[..., :8])


@pytest.mark.parametrize(
    ("single", "single_on"),
    [(np.array(0.0, np.float32), "x"), (np.array([7.0], np.float32), "y"), (np.ones((1, 1, 1), np.float32), "x")],
)
def test_where_with_a_single_value_on_either_side(single, single_on):
    condition = np.isnan(WHERE_VALUES)
    inputs = [condition, single, WHERE_VALUES] if single_on == "x" else [condition, WHERE_VALUES, single]
    got = run_kernel(one_node_model("Where", inputs, 16), inputs)[0]
    want = np.where(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # NaNs where numpy has them, none where it wrote the value
    assert not np.shares_memory(got, WHERE_VALUES)
    assert_same_as_onnxruntime("Where", inputs, 16)


def test_where_single_value_with_more_dimensions_broadcasts_as_numpy_does():
    condition = np.array([True, False, True])
    inputs = [condition, np.full((1, 1), 5, np.int64), np.arange(3, dtype=np.int64)]
    got = run_kernel(one_node_model("Where", inputs, 16), inputs)[0]
    np.testing.assert_array_equal(got, [[5, 1, 5]])
