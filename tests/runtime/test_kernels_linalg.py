"""The linalg family against ONNX's backend node test cases."""

from __future__ import annotations

import pytest

from runtime.kernels import linalg
from runtime.kernels.base import UnsupportedOp
from tests.runtime.node_cases import assert_matches, node_cases, run_case

CASES = list(node_cases(linalg.KERNELS))


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_node_case(case):
    try:
        results = run_case(case)
    except UnsupportedOp as declined:
        pytest.skip(f"declined: {declined}")
    assert len(results) == len(case.outputs)
    for actual, expected in zip(results, case.outputs, strict=True):
        assert_matches(case.name, actual, expected, case.rtol, case.atol)


# ---------------------------------------------------------------- against onnxruntime

import numpy as np  # noqa: E402

from tests.runtime.test_kernels_conv import assert_kernel_matches_onnxruntime  # noqa: E402

RNG = np.random.default_rng(0)


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_matmul_broadcasts_batches_like_onnxruntime():
    assert_kernel_matches_onnxruntime("MatMul", [_normal(2, 1, 4, 8), _normal(3, 8, 5)], opset=13)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_matches_onnxruntime(trans_a, trans_b):
    a = _normal(6, 4) if trans_a else _normal(4, 6)
    b = _normal(5, 6) if trans_b else _normal(6, 5)
    assert_kernel_matches_onnxruntime(
        "Gemm", [a, b, _normal(1, 5)], opset=13, alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b
    )


def test_gemm_without_c_matches_onnxruntime():
    assert_kernel_matches_onnxruntime("Gemm", [_normal(3, 4), _normal(4, 2), None], opset=13, alpha=3.0)


def test_gemm_does_not_write_into_c():
    c = _normal(3, 2)
    kept = c.copy()
    assert_kernel_matches_onnxruntime("Gemm", [_normal(3, 4), _normal(4, 2), c], opset=13, beta=0.5)
    np.testing.assert_array_equal(c, kept)


def test_einsum_attention_scores_match_onnxruntime():
    q, k = _normal(2, 4, 16, 8), _normal(2, 4, 16, 8)
    assert_kernel_matches_onnxruntime("Einsum", [q, k], opset=12, equation="bhqd, bhkd -> bhqk")


def test_matmul_integer_with_per_column_zero_point_matches_onnxruntime():
    a = RNG.integers(0, 255, (4, 6)).astype(np.uint8)
    b = RNG.integers(-128, 127, (6, 3)).astype(np.int8)
    assert_kernel_matches_onnxruntime(
        "MatMulInteger",
        [a, b, np.array(7, np.uint8), RNG.integers(-5, 5, (3,)).astype(np.int8)],
        opset=10,
        output_dtypes=[np.int32],
    )


def test_matmul_integer_per_row_a_zero_point_subtracts_row_by_row():
    # onnxruntime only accepts a scalar A zero point, so the spec's per-row form is checked by hand.
    from onnx import helper

    from tests.runtime.test_kernels_conv import run_with_kernel

    a = RNG.integers(0, 255, (4, 6)).astype(np.uint8)
    b = RNG.integers(-128, 127, (6, 3)).astype(np.int8)
    a_zero = RNG.integers(0, 255, (4,)).astype(np.uint8)
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zero"], ["y"])
    model = helper.make_model(
        helper.make_graph([node], "g", [], []), opset_imports=[helper.make_opsetid("", 10)]
    )
    (y,) = run_with_kernel(model, [a, b, a_zero])
    expected = (a.astype(np.int64) - a_zero.astype(np.int64)[:, None]) @ b.astype(np.int64)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected)
