"""GeluFusion, FastGeluFusion, QuickGeluFusion, BiasGeluFusion and GeluApproximation.

Each positive case checks the exact op histogram after the extended level and that
onnxruntime, with its own graph optimizations off, computes the same outputs from the
original and the optimized model (fp32: rtol 1e-3, atol 1e-4).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from optimizer import optimize
from tests.models import patterns
from tests.oracle import MODELS, assert_same_outputs, fixture_feeds

# max |tanh-GELU(x) - erf-GELU(x)| over a dense grid of [-10, 10] is 4.73e-4 (at |x| ≈ 2.70);
# FastGelu against the exact GELU therefore needs atol 5e-4, just above that bound.
APPROXIMATION_ATOL = 5e-4


def spread_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Float inputs spread over [-4, 4]-ish (σ 2.5), where the GELU variants differ most."""
    return {name: np.asarray(value * 2.5, value.dtype) for name, value in fixture_feeds(model).items()}


def messages(report, rule):
    return [miss.message for miss in report.explain(rule)]


# --- GeluFusion ---------------------------------------------------------------------------


@pytest.mark.parametrize("half", ["last", "first", "inside"])
@pytest.mark.parametrize("scale", ["div", "mul"])
@pytest.mark.parametrize("commute", [False, True])
def test_erf_gelu_variants_fuse_to_contrib_gelu(half, scale, commute):
    model = patterns.erf_gelu(half=half, scale=scale, commute=commute)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.Gelu": 1}
    assert result.report.rules["GeluFusion"].fired == 1
    [gelu] = list(result.model.graph)
    assert [v.name for v in gelu.inputs] == ["x"] and gelu.outputs[0].name == "y"
    assert_same_outputs(model, result, spread_feeds(model))


@pytest.mark.parametrize(("opset", "gelu"), [(14, "com.microsoft.Gelu"), (19, "com.microsoft.Gelu"), (20, "Gelu"), (23, "Gelu")])
def test_erf_gelu_emits_the_gelu_its_opset_has(opset, gelu):
    # As ONNX Runtime's GeluFusion (gelu_opset20.onnx): ONNX Gelu where the opset has it.
    model = patterns.erf_gelu(opset=opset)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {gelu: 1}
    assert result.report.fusions == {gelu: 1}
    assert_same_outputs(model, result, spread_feeds(model))


@pytest.mark.parametrize("opset", [14, 20])
@pytest.mark.parametrize("commute", [False, True])
def test_erf_gelu_after_bias_add_becomes_bias_gelu(opset, commute):
    model = patterns.erf_gelu(bias=True, opset=opset, commute=commute)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.BiasGelu": 1}
    assert result.report.rules["GeluFusion"].fired == 1
    assert result.report.rules["BiasGeluFusion"].fired == 1
    assert_same_outputs(model, result, spread_feeds(model))


@pytest.mark.parametrize("square", ["nested", "square"])
@pytest.mark.parametrize("commute", [False, True])
@pytest.mark.parametrize("casts", [False, True])
def test_factored_tanh_gelu_fuses_to_fast_gelu(square, commute, casts):
    # ONNX Runtime's fast_gelu.onnx and fast_gelu3_with_casts.onnx: the Tanh argument factored
    # as (√(2/π)·x)·(1 + 0.044715·x²), x reaching it through float→float Casts.
    model = patterns.factored_tanh_gelu(square=square, commute=commute, casts=casts)
    result = optimize(model, level="extended")
    assert result.report.fusions == {"com.microsoft.FastGelu": 1}
    assert result.report.ops_after == ({"Cast": 1, "com.microsoft.FastGelu": 1} if casts else {"com.microsoft.FastGelu": 1})
    assert_same_outputs(model, result, spread_feeds(model))


def test_factored_tanh_gelu_with_a_wrong_coefficient_is_a_near_miss():
    report = optimize(patterns.factored_tanh_gelu(coefficient=0.05), level="extended").report
    assert "com.microsoft.FastGelu" not in report.ops_after
    assert messages(report, "FastGeluFusion") == [
        "FastGeluFusion at /act/Tanh: quadratic coefficient is 0.05, expected 0.044715"
    ]


def test_wrong_divisor_is_a_near_miss_that_names_both_values():
    model = patterns.erf_gelu(divisor=1.5)
    report = optimize(model, level="extended").report
    assert "com.microsoft.Gelu" not in report.ops_after and report.ops_after["Erf"] == 1
    assert messages(report, "GeluFusion") == ["GeluFusion at /mlp/Erf: divisor is 1.5, expected √2 ≈ 1.4142"]


def test_wrong_multiplier_is_a_near_miss():
    report = optimize(patterns.erf_gelu(scale="mul", divisor=2.0), level="extended").report
    assert messages(report, "GeluFusion") == ["GeluFusion at /mlp/Erf: multiplier is 0.5, expected 1/√2 ≈ 0.7071"]


def test_wrong_one_is_a_near_miss():
    report = optimize(patterns.erf_gelu(one=2.0), level="extended").report
    assert messages(report, "GeluFusion") == ["GeluFusion at /mlp/Erf: Add '/mlp/Add_1' adds 2, expected 1"]


def test_graph_output_in_the_middle_blocks_gelu_and_says_which():
    model = patterns.erf_gelu(extra_outputs=["/mlp/bracket"])
    result = optimize(model, level="extended")
    assert "com.microsoft.Gelu" not in result.report.ops_after
    assert messages(result.report, "GeluFusion") == [
        "GeluFusion at /mlp/Erf: intermediate value '/mlp/bracket' is a graph output"
    ]
    assert_same_outputs(model, result, spread_feeds(model))


def test_second_consumer_in_the_middle_blocks_gelu_and_names_it():
    model = patterns.erf_gelu(extra_consumer="/mlp/erf")
    result = optimize(model, level="extended")
    assert result.report.ops_after["Erf"] == 1
    assert messages(result.report, "GeluFusion") == [
        "GeluFusion at /mlp/Erf: intermediate value '/mlp/erf' also feeds Neg '/other/Neg'"
    ]
    assert_same_outputs(model, result, spread_feeds(model))


# --- FastGeluFusion -----------------------------------------------------------------------


@pytest.mark.parametrize("cube", ["pow", "square_first", "square_last"])
@pytest.mark.parametrize("half", ["first", "last"])
@pytest.mark.parametrize("commute", [False, True])
def test_tanh_gelu_variants_fuse_to_fast_gelu(cube, half, commute):
    model = patterns.tanh_gelu(cube=cube, half=half, commute=commute)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FastGelu": 1}
    [fast_gelu] = list(result.model.graph)
    assert [v.name for v in fast_gelu.inputs] == ["x"]
    assert_same_outputs(model, result, spread_feeds(model))


def test_tanh_gelu_after_bias_add_becomes_fast_gelu_with_bias():
    model = patterns.tanh_gelu(bias=True)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FastGelu": 1}
    [fast_gelu] = list(result.model.graph)
    assert [v.name for v in fast_gelu.inputs] == ["x", "/mlp/b"]
    assert_same_outputs(model, result, spread_feeds(model))


def test_wrong_cubic_coefficient_is_a_near_miss():
    report = optimize(patterns.tanh_gelu(coefficient=0.05), level="extended").report
    assert report.ops_after["Tanh"] == 1
    assert messages(report, "FastGeluFusion") == [
        "FastGeluFusion at /act/Tanh: cubic coefficient is 0.05, expected 0.044715"
    ]


def test_wrong_tanh_multiplier_is_a_near_miss():
    report = optimize(patterns.tanh_gelu(multiplier=0.7), level="extended").report
    assert messages(report, "FastGeluFusion") == [
        "FastGeluFusion at /act/Tanh: multiplier is 0.7, expected √(2/π) ≈ 0.79788"
    ]


# --- QuickGeluFusion ----------------------------------------------------------------------


@pytest.mark.parametrize("commute", [False, True])
@pytest.mark.parametrize("alpha", [1.702, None])
def test_x_times_sigmoid_of_scaled_x_fuses_to_quick_gelu(alpha, commute):
    model = patterns.quick_gelu(alpha=alpha, commute=commute)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.QuickGelu": 1}
    [quick] = list(result.model.graph)
    # SiLU (x * Sigmoid(x)) is QuickGelu with alpha 1, as ONNX Runtime fuses it.
    assert quick.attributes["alpha"].value == pytest.approx(1.0 if alpha is None else alpha)
    assert_same_outputs(model, result, spread_feeds(model))


def test_vector_alpha_is_a_near_miss():
    report = optimize(patterns.quick_gelu(alpha_shape=(16,)), level="extended").report
    assert report.ops_after["Sigmoid"] == 1
    assert messages(report, "QuickGeluFusion") == [
        "QuickGeluFusion at /act/Sigmoid: Mul '/act/Mul' scales by 16 values; QuickGelu's alpha is one number"
    ]


def test_sigmoid_gate_is_a_near_miss_that_says_why():
    report = optimize(patterns.sigmoid_gate(), level="extended").report
    assert report.ops_after == {"Mul": 1, "Sigmoid": 1}
    assert [m.step for m in report.explain("QuickGeluFusion")] == ["gate"]


# --- BiasGeluFusion -----------------------------------------------------------------------


@pytest.mark.parametrize(("gelu_domain", "opset"), [("com.microsoft", 14), ("com.microsoft", 20), ("", 20)])
@pytest.mark.parametrize("bias_side", [0, 1])
def test_bias_gelu_fuses_both_gelu_domains(gelu_domain, opset, bias_side):
    model = patterns.add_then_gelu(gelu_domain=gelu_domain, opset=opset, bias_side=bias_side)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.BiasGelu": 1}
    [bias_gelu] = list(result.model.graph)
    assert [v.name for v in bias_gelu.inputs] == ["x", "/mlp/b"]
    assert_same_outputs(model, result, spread_feeds(model))


def test_ort_1_20_regression_bias_gelu_matches_onnx_gelu():
    """ONNX Runtime 1.20's BiasGeluFusion matched only com.microsoft.Gelu, so an opset-20
    model whose GELU is the standard ONNX Gelu (what PyTorch's dynamo exporter writes) kept
    its Add + Gelu. Ours must fuse it."""
    model = patterns.add_then_gelu(gelu_domain="", opset=20)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.BiasGelu": 1}
    assert result.report.fusions == {"com.microsoft.BiasGelu": 1}
    assert result.report.rules["BiasGeluFusion"].fired == 1
    assert_same_outputs(model, result, spread_feeds(model))


def test_onnx_tanh_gelu_after_add_becomes_fast_gelu_with_bias():
    model = patterns.add_then_gelu(gelu_domain="", opset=20, approximate="tanh")
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"com.microsoft.FastGelu": 1}
    assert_same_outputs(model, result, spread_feeds(model))


def test_bias_of_rank_two_is_a_near_miss():
    report = optimize(patterns.add_then_gelu(bias_shape=(4, 16)), level="extended").report
    assert report.ops_after == {"Add": 1, "Gelu": 1}
    assert messages(report, "BiasGeluFusion") == [
        "BiasGeluFusion at /mlp/Gelu: bias '/mlp/b' has rank 2, so Add '/mlp/Add' has no 1-D bias input"
    ]


def test_bias_add_output_that_is_a_graph_output_blocks_bias_gelu():
    model = patterns.add_then_gelu(extra_outputs=["/mlp/Add_output_0"])
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"Add": 1, "Gelu": 1}
    assert messages(result.report, "BiasGeluFusion") == [
        "BiasGeluFusion at /mlp/Gelu: intermediate value '/mlp/Add_output_0' is a graph output"
    ]
    assert_same_outputs(model, result, spread_feeds(model))


@pytest.mark.parametrize("gelu_domain", ["", "com.microsoft"])
def test_matmul_add_gemm_fusion_does_not_swallow_the_bias_add(gelu_domain):
    model = patterns.matmul_add_gelu(gelu_domain=gelu_domain)
    result = optimize(model, level="extended")
    assert result.report.ops_after == {"MatMul": 1, "com.microsoft.BiasGelu": 1}
    assert_same_outputs(model, result, spread_feeds(model))


# --- GeluApproximation (opt-in) -----------------------------------------------------------


def test_gelu_approximation_is_off_by_default():
    report = optimize(patterns.gelu_alone(), level="extended").report
    assert report.ops_after == {"com.microsoft.Gelu": 1}
    assert "GeluApproximation" not in report.rules


@pytest.mark.parametrize(
    ("builder", "inputs"),
    [
        (lambda: patterns.gelu_alone(gelu_domain="com.microsoft"), ["x"]),
        (lambda: patterns.gelu_alone(gelu_domain="", opset=20), ["x"]),
        (lambda: patterns.gelu_alone(bias=True), ["x", "/mlp/b"]),
        (lambda: patterns.erf_gelu(bias=True), ["x", "/mlp/b"]),
        (lambda: patterns.add_then_gelu(gelu_domain="", opset=20), ["x", "/mlp/b"]),
    ],
)
def test_gelu_approximation_turns_exact_gelu_into_fast_gelu(builder, inputs):
    model = builder()
    result = optimize(model, level="extended", enable_gelu_approximation=True)
    assert result.report.ops_after == {"com.microsoft.FastGelu": 1}
    [fast_gelu] = list(result.model.graph)
    assert [v.name for v in fast_gelu.inputs] == inputs
    # The approximation is visible (inputs reach |x| ≈ 2.7 where it is worst) and bounded.
    largest = assert_same_outputs(model, result, spread_feeds(model), atol=APPROXIMATION_ATOL)
    assert largest > 1e-5


# --- exported fixtures --------------------------------------------------------------------

# Exact counts at level extended, measured with this module's rules; they equal what
# onnxruntime 1.32's own extended level produces for these op types.
FIXTURE_COUNTS = {
    "bert_torchscript_opset14.onnx": {"com.microsoft.Gelu": 0, "com.microsoft.BiasGelu": 2, "com.microsoft.FastGelu": 0, "Erf": 0},
    "bert_eager_torchscript_opset14.onnx": {"com.microsoft.Gelu": 0, "com.microsoft.BiasGelu": 2, "com.microsoft.FastGelu": 0, "Erf": 0},
    "bert_dynamo_opset20.onnx": {"Gelu": 0, "com.microsoft.BiasGelu": 2, "com.microsoft.FastGelu": 0},
    # Static shapes: the FFN MatMul+Add is a Gemm candidate too, and must still become BiasGelu
    # (onnxruntime 1.32's extended level turns it into Gemm and leaves a plain Gelu here).
    "bert_static_torchscript_opset14.onnx": {"com.microsoft.Gelu": 0, "com.microsoft.BiasGelu": 2, "com.microsoft.FastGelu": 0, "Erf": 0, "Gemm": 0},
    "bert_static_dynamo_opset20.onnx": {"Gelu": 0, "com.microsoft.BiasGelu": 2, "com.microsoft.FastGelu": 0, "Gemm": 0},
    "bert_pinned_dynamo_opset20.onnx": {"Gelu": 0, "com.microsoft.BiasGelu": 2, "com.microsoft.FastGelu": 0, "Gemm": 0},
    # GPT-2's MLP bias is inside a Gemm followed by a Reshape, so FastGelu has no bias to take.
    "gpt2_torchscript_opset14.onnx": {"com.microsoft.FastGelu": 2, "com.microsoft.BiasGelu": 0, "Tanh": 0},
    "gpt2_dynamo_opset20.onnx": {"com.microsoft.FastGelu": 2, "com.microsoft.BiasGelu": 0, "Tanh": 0},
}


def _fixture(name: str) -> onnx.ModelProto:
    return onnx.load(MODELS / name)


@pytest.mark.parametrize("name", sorted(FIXTURE_COUNTS))
def test_exported_fixture_gelu_counts(name):
    model = _fixture(name)
    result = optimize(model, level="extended")
    counts = {op: result.report.ops_after.get(op, 0) for op in FIXTURE_COUNTS[name]}
    assert counts == FIXTURE_COUNTS[name]
    assert_same_outputs(model, result)


@pytest.mark.parametrize("name", ["bert_torchscript_opset14.onnx", "bert_dynamo_opset20.onnx"])
def test_exported_bert_with_gelu_approximation_has_fast_gelu_with_bias(name):
    model = _fixture(name)
    result = optimize(model, level="extended", enable_gelu_approximation=True)
    ops = result.report.ops_after
    assert (ops.get("com.microsoft.FastGelu", 0), ops.get("com.microsoft.BiasGelu", 0)) == (2, 0)
    fast_gelus = [n for n in result.model.graph if n.op_type == "FastGelu"]
    assert all(len(n.inputs) == 2 for n in fast_gelus)
    # LayerNorm and the residual stream shrink the per-GELU error; the erf/tanh bound still applies.
    assert_same_outputs(model, result, atol=APPROXIMATION_ATOL)
