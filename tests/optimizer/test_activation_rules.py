"""GemmActivationFusion, ConvActivationFusion, MatMulScaleFusion and MatmulTransposeFusion.

Positive cases check the exact op histogram after the extended level, the attributes
ONNX Runtime's contrib ops read, and that onnxruntime (graph optimizations off) computes
the same outputs from the original and the optimized model (rtol 1e-3, atol 1e-4).
"""

from __future__ import annotations

import pytest

from optimizer import optimize
from tests.models import patterns
from tests.optimizer.test_gelu_rules import messages, spread_feeds
from tests.oracle import assert_same_outputs


def _only_node(result):
    [node] = list(result.model.graph)
    return node


def _attributes(node):
    return {name: a.value for name, a in node.attributes.items()}


# --- GemmActivationFusion -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("activation", "attrs", "expected"),
    [
        ("Relu", {}, {}),
        ("Sigmoid", {}, {}),
        ("Tanh", {}, {}),
        ("Softplus", {}, {}),
        ("Softsign", {}, {}),
        ("LeakyRelu", {"alpha": 0.2}, {"activation_alpha": 0.2}),
        ("LeakyRelu", {}, {"activation_alpha": 0.01}),  # the ONNX default, written out
        ("Elu", {"alpha": 0.5}, {"activation_alpha": 0.5}),
        ("ThresholdedRelu", {"alpha": 0.3}, {"activation_alpha": 0.3}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {"activation_alpha": 0.3, "activation_beta": 0.4}),
        ("Selu", {}, {"activation_alpha": 1.6732632, "activation_gamma": 1.0507010}),
    ],
)
def test_gemm_then_activation_becomes_fused_gemm(activation, attrs, expected):
    model = patterns.gemm_activation(activation, attrs=attrs)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FusedGemm": 1}
    fused = _only_node(result)
    got = _attributes(fused)
    assert got.pop("activation") == activation
    assert (got.pop("alpha"), got.pop("beta"), got.pop("transB")) == (0.5, 2.0, 1)
    assert got == pytest.approx(expected)
    assert [v.name for v in fused.inputs] == ["a", "/fc/W", "/fc/C"]
    assert_same_outputs(model, result, spread_feeds(model))


def test_gemm_with_a_second_reader_keeps_its_activation_and_says_why():
    model = patterns.gemm_activation("Relu", extra_consumer=True)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"Gemm": 1, "Neg": 1, "Relu": 1}
    assert messages(result.report, "GemmActivationFusion") == [
        "GemmActivationFusion at /fc/Gemm: intermediate value '/fc/gemm' also feeds Neg '/other/Neg'"
    ]
    assert_same_outputs(model, result, spread_feeds(model))


def test_gemm_before_an_activation_fused_gemm_cannot_run_is_left_alone():
    report = optimize(patterns.gemm_activation("Softmax", attrs={"axis": 1}), level="extended").report
    assert report.ops_after == {"Gemm": 1, "Softmax": 1}
    assert [m.message for m in report.explain("GemmActivationFusion")] == [
        "GemmActivationFusion at /fc/Gemm: output of Gemm '/fc/Gemm' feeds Softmax '/fc/Softmax', no activation FusedGemm takes"
    ]


# --- ConvActivationFusion -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("activation", "kwargs", "params"),
    [
        ("Relu", {}, None),
        ("Sigmoid", {}, None),
        ("Tanh", {}, None),
        ("LeakyRelu", {"attrs": {"alpha": 0.1}}, [0.1]),
        ("LeakyRelu", {}, [0.01]),
        ("HardSigmoid", {"attrs": {"alpha": 0.25, "beta": 0.6}}, [0.25, 0.6]),
        ("HardSigmoid", {}, [0.2, 0.5]),
        ("Clip", {"clip": (0.0, 6.0)}, [0.0, 6.0]),
        ("Clip", {"clip": (-1.0, 1.0), "opset": 10}, [-1.0, 1.0]),
        ("Clip", {"clip": (0.0, None)}, [0.0, 3.4028234663852886e38]),
        ("Clip", {"clip": (None, 2.0)}, [-3.4028234663852886e38, 2.0]),
    ],
)
def test_conv_then_activation_becomes_fused_conv(activation, kwargs, params):
    model = patterns.conv_activation(activation, **kwargs)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FusedConv": 1}
    fused = _only_node(result)
    got = _attributes(fused)
    assert got["activation"] == activation
    assert list(got["pads"]) == [1, 1, 1, 1]
    if params is None:
        assert "activation_params" not in got
    else:
        assert got["activation_params"] == pytest.approx(params)
    assert_same_outputs(model, result, spread_feeds(model))


def test_clip_with_a_runtime_bound_is_a_near_miss():
    model = patterns.conv_activation("Clip", clip=(0.0, None), clip_dynamic=True)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"Clip": 1, "Conv": 1}
    assert messages(result.report, "ConvActivationFusion") == [
        "ConvActivationFusion at /conv/Conv: Clip '/conv/Clip' has a max that is not a constant ('clip_max')"
    ]
    assert_same_outputs(model, result, spread_feeds(model))


# --- MatMulScaleFusion --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "alpha"),
    [
        ({"where": "after"}, 0.125),
        ({"where": "after", "commute": True}, 0.125),
        ({"where": "after", "op": "Div", "scale": 8.0}, 0.125),
        ({"where": "before"}, 0.125),
        ({"where": "before", "op": "Div", "scale": 4.0}, 0.25),
        ({"where": "both", "scale": 0.5}, 0.25),
        ({"where": "after", "scale_shape": (1, 1)}, 0.125),  # one element, no broadcast past rank 3
    ],
)
def test_scalar_scale_folds_into_fused_matmul_alpha(kwargs, alpha):
    model = patterns.matmul_scale(**kwargs)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FusedMatMul": 1}
    fused = _only_node(result)
    assert fused.attributes["alpha"].value == pytest.approx(alpha)
    assert [v.name for v in fused.inputs] == ["x", "/attn/W"]
    assert_same_outputs(model, result, spread_feeds(model))


def test_shared_leading_scale_is_kept_for_its_other_reader():
    model = patterns.matmul_scale(where="before", shared_scale=True)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"Mul": 1, "Neg": 1, "com.microsoft.FusedMatMul": 1}
    [fused] = [n for n in result.model.graph if n.op_type == "FusedMatMul"]
    assert fused.inputs[0].name == "x"
    assert_same_outputs(model, result, spread_feeds(model))


@pytest.mark.parametrize("scale_shape", [(16,), (1, 1, 1, 1)])
def test_vector_or_rank_raising_scale_is_not_folded(scale_shape):
    model = patterns.matmul_scale(where="after", scale_shape=scale_shape)
    report = optimize(model, level="extended").report
    assert report.ops_after == {"MatMul": 1, "Mul": 1}


# --- MatmulTransposeFusion ----------------------------------------------------------------


@pytest.mark.parametrize(("side", "flags"), [("a", (1, 0)), ("b", (0, 1)), ("both", (1, 1))])
def test_last_two_axes_transpose_folds_into_fused_matmul(side, flags):
    model = patterns.matmul_transpose(side=side)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FusedMatMul": 1}
    fused = _only_node(result)
    got = _attributes(fused)
    assert (got["transA"], got["transB"], got["alpha"]) == (*flags, 1.0)
    assert_same_outputs(model, result, spread_feeds(model))


def test_transpose_and_scale_merge_into_one_fused_matmul():
    model = patterns.matmul_transpose(side="b", scale_after=0.5)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FusedMatMul": 1}
    got = _attributes(_only_node(result))
    assert (got["transA"], got["transB"], got["alpha"]) == (0, 1, 0.5)
    assert_same_outputs(model, result, spread_feeds(model))


def test_shared_transpose_is_kept_for_its_other_reader():
    model = patterns.matmul_transpose(side="a", shared=True)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"Neg": 1, "Transpose": 1, "com.microsoft.FusedMatMul": 1}
    assert_same_outputs(model, result, spread_feeds(model))


def test_transpose_that_also_moves_batch_axes_is_a_near_miss():
    model = patterns.matmul_transpose(side="b", perm=[1, 2, 0])
    report = optimize(model, level="extended").report
    assert report.ops_after == {"MatMul": 1, "Transpose": 1}
    assert messages(report, "MatmulTransposeFusion") == [
        "MatmulTransposeFusion at /mm/MatMul: Transpose '/mm/Transpose_b' has perm [1, 2, 0]; "
        "only a swap of the last two axes folds into FusedMatMul"
    ]


def test_head_split_transpose_is_a_near_miss_that_says_so():
    model = patterns.matmul_transpose(side="a", perm=[1, 0, 2])
    report = optimize(model, level="extended").report
    assert report.ops_after == {"MatMul": 1, "Transpose": 1}
    assert [m.reason for m in report.explain("MatmulTransposeFusion")] == [
        "Transpose '/mm/Transpose_a' has perm [1, 0, 2], which keeps the matrix axes in place: not a transpose of them"
    ]

