"""The linalg family against ONNX's backend node test cases."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import linalg
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test, one_node_model, run_kernel

test_node_case = node_case_test(linalg.KERNELS)


# ---------------------------------------------------------------- against onnxruntime

RNG = np.random.default_rng(0)


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_matmul_broadcasts_batches_like_onnxruntime():
    assert_same_as_onnxruntime("MatMul", [_normal(2, 1, 4, 8), _normal(3, 8, 5)], opset=13)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_matches_onnxruntime(trans_a, trans_b):
    a = _normal(6, 4) if trans_a else _normal(4, 6)
    b = _normal(5, 6) if trans_b else _normal(6, 5)
    assert_same_as_onnxruntime(
        "Gemm", [a, b, _normal(1, 5)], opset=13, alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b
    )


@pytest.mark.parametrize("shapes", [((2, 3, 16, 64), (64, 48)), ((2, 3, 16, 64), (2, 3, 64, 16)), ((64,), (64, 8)),
                                    ((64,), (64,))], ids=["weight", "batched", "vector", "dot"])
def test_float16_matmul_is_the_product_rounded_once(shapes):
    # The exact product rounded to float16 is the best any float16 MatMul can give; summing in
    # float32 in another order may land one unit in the last place away, never more.
    rng = np.random.default_rng(16)
    a, b = (rng.standard_normal(shape).astype(np.float16) for shape in shapes)
    (got,) = run_kernel(one_node_model("MatMul", [a, b], 13), [a, b])
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert np.asarray(got).dtype == np.float16 and np.shape(got) == exact.shape
    ulps = np.abs(np.asarray(got, np.float64) - exact) / np.spacing(np.abs(exact.astype(np.float16)))
    assert ulps.max() <= 1.0
    assert_same_as_onnxruntime("MatMul", [a, b], opset=13, rtol=2e-3, atol=2e-3)


def test_float16_gemm_is_the_product_rounded_once():
    rng = np.random.default_rng(17)
    a, b, c = (rng.standard_normal(shape).astype(np.float16) for shape in ((8, 64), (32, 64), (32,)))
    (got,) = run_kernel(one_node_model("Gemm", [a, b, c], 13, transB=1), [a, b, c])
    exact = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float16).astype(np.float64) + c
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2e-3, atol=2e-3)


def test_gemm_without_c_matches_onnxruntime():
    assert_same_as_onnxruntime("Gemm", [_normal(3, 4), _normal(4, 2), None], opset=13, alpha=3.0)


def test_gemm_does_not_write_into_c():
    c = _normal(3, 2)
    kept = c.copy()
    assert_same_as_onnxruntime("Gemm", [_normal(3, 4), _normal(4, 2), c], opset=13, beta=0.5)
    np.testing.assert_array_equal(c, kept)


def test_einsum_attention_scores_match_onnxruntime():
    q, k = _normal(2, 4, 16, 8), _normal(2, 4, 16, 8)
    assert_same_as_onnxruntime("Einsum", [q, k], opset=12, equation="bhqd, bhkd -> bhqk")


def test_matmul_integer_with_per_column_zero_point_matches_onnxruntime():
    a = RNG.integers(0, 255, (4, 6)).astype(np.uint8)
    b = RNG.integers(-128, 127, (6, 3)).astype(np.int8)
    assert_same_as_onnxruntime(
        "MatMulInteger",
        [a, b, np.array(7, np.uint8), RNG.integers(-5, 5, (3,)).astype(np.int8)],
        opset=10,
    )


def test_matmul_integer_per_row_a_zero_point_subtracts_row_by_row():
    # onnxruntime only accepts a scalar A zero point, so the spec's per-row form is checked by hand.
    a = RNG.integers(0, 255, (4, 6)).astype(np.uint8)
    b = RNG.integers(-128, 127, (6, 3)).astype(np.int8)
    a_zero = RNG.integers(0, 255, (4,)).astype(np.uint8)
    (y,) = run_kernel(one_node_model("MatMulInteger", [a, b, a_zero], 10), [a, b, a_zero])
    expected = (a.astype(np.int64) - a_zero.astype(np.int64)[:, None]) @ b.astype(np.int64)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected)


def test_matmul_integer_is_exact_at_the_extremes_of_its_types():
    # Accumulated in float64 on BLAS: exact while the sums stay under 2**53, far past any K here.
    a = np.full((3, 4096), 255, np.uint8)
    b = np.full((4096, 2), -128, np.int8)
    a_zero, b_zero = np.array(0, np.uint8), np.array(127, np.int8)
    (y,) = run_kernel(one_node_model("MatMulInteger", [a, b, a_zero, b_zero], 10), [a, b, a_zero, b_zero])
    expected = a.astype(np.int64) @ (b.astype(np.int64) - 127)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected)


def test_matmul_integer_shifts_a_constant_weight_once_with_the_same_result():
    from onnx import TensorProto, helper, numpy_helper

    from runtime import InferenceSession

    rng = np.random.default_rng(9)
    b = rng.integers(-128, 128, (8, 5)).astype(np.int8)
    b_zero = rng.integers(-3, 3, (5,)).astype(np.int8)  # per column
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "", "b_zero"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [3, 5])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(b_zero, "b_zero")])
    session = InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    [kernel] = [step.kernel for step in session.plan.steps]
    assert kernel.shifted_b is not None  # bound at plan time
    for _ in range(2):  # the kept operand is read, never written
        a = rng.integers(0, 256, (3, 8)).astype(np.uint8)
        (y,) = session.run(None, {"a": a})
        np.testing.assert_array_equal(y, a.astype(np.int64) @ (b.astype(np.int64) - b_zero.astype(np.int64)))
