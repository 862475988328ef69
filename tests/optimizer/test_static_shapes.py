"""Static shapes (batch 1, sequence 16): the common deployment case, and where fusions compete.

With every dimension known, MatMulAddFusion can turn each rank-3 projection/FFN MatMul+Add into
Reshape -> Gemm -> Reshape. ONNX Runtime 1.31 ran it before the fusions that anchor on those
Adds (BiasGelu, SkipLayerNorm, Attention) and so lost them; onnxruntime 1.32's own extended
level still does on these fixtures (12 Gemm, no Attention, no BiasGelu). Our levels.py runs
MatMulAddFusion after them; these tests hold it there.

The pinned fixture is a dynamic export whose inputs were fixed to [1, 16] afterwards: its
shape arithmetic is still in the graph, so the first shape inference names the batch unk__0
beside a static 1, and only re-inference after constant folding proves the two equal.
"""

from __future__ import annotations

import onnx
import pytest

from optimizer import optimize
from optimizer.driver import apply_rule
from optimizer.fusions.attention_fusion import AttentionFusion
from optimizer.model_io import load_model
from optimizer.report import RuleStats
from optimizer.shape_inference import infer_shapes
from tests.oracle import MODELS, assert_same_outputs, fixture_feeds

STATIC_BERT = ["bert_static_torchscript_opset14.onnx", "bert_static_dynamo_opset20.onnx", "bert_pinned_dynamo_opset20.onnx"]
LAYERS = 2
# Per layer: Q, K, V, attention output, FFN in, FFN out.
PROJECTIONS = 6 * LAYERS
POOLER_GEMMS = 1  # BertPooler's dense layer, a Gemm in every export


def _padded_feeds(model: onnx.ModelProto):
    feeds = fixture_feeds(model)
    assert feeds["input_ids"].shape == (1, 16)
    feeds["attention_mask"][0, 11:] = 0  # masking is exercised in the fused Attention too
    return feeds


@pytest.mark.parametrize("name", STATIC_BERT)
def test_ort_1_31_regression_matmul_add_does_not_swallow_fusion_adds(name):
    model = onnx.load(MODELS / name)
    feeds = _padded_feeds(model)

    basic = optimize(model, "basic")
    assert basic.report.rules["MatMulAddFusion"].fired == PROJECTIONS
    assert basic.report.ops_after["Gemm"] == PROJECTIONS + POOLER_GEMMS
    assert basic.report.ops_after["MatMul"] == 2 * LAYERS  # only Q·Kᵀ and probs·V stay MatMul
    assert_same_outputs(model, basic, feeds)

    extended = optimize(model, "extended")
    ops = extended.report.ops_after
    fused = {op: ops.get(f"com.microsoft.{op}", 0) for op in ("BiasGelu", "SkipLayerNormalization", "Attention")}
    assert fused == {"BiasGelu": 2, "SkipLayerNormalization": 4, "Attention": 2}
    assert extended.report.rules["MatMulAddFusion"].fired == 0
    assert "Gemm" not in ops  # the pooler's Gemm became FusedGemm with its Tanh
    assert ops["com.microsoft.FusedGemm"] == POOLER_GEMMS
    # MatMul left per layer: the attention output and FFN output projections (their Adds are
    # SkipLayerNormalization's bias) and the FFN input projection (its Add is BiasGelu's bias).
    assert ops["MatMul"] == 3 * LAYERS
    # What is left unfused answers only "nothing to fold here": the per-layer MatMuls that have
    # no constant scale and no transposed input, the Casts that convert (the mask's).
    left = {(m.rule, m.step) for m in extended.report.near_misses if m.rule != "ReshapeFusion"}
    assert left <= {("MatMulScaleFusion", "scale"), ("MatmulTransposeFusion", "transpose"), ("CastElimination", "type")}
    assert_same_outputs(model, extended, feeds)


@pytest.mark.parametrize("name", STATIC_BERT)
def test_fusions_that_anchor_on_the_adds_are_what_keeps_them_from_gemm(name):
    """With those fusions off, the same Adds do become Gemm at the extended level: the counts
    above come from the order in levels.py, not from MatMulAddFusion refusing them."""
    disabled = ["AttentionFusion", "SkipLayerNormFusion", "BiasGeluFusion", "EmbedLayerNormFusion"]
    result = optimize(onnx.load(MODELS / name), "extended", disabled=disabled)
    assert result.report.rules["MatMulAddFusion"].fired == PROJECTIONS


def test_pinned_fixture_shapes_are_refined_after_constant_folding():
    model = load_model(MODELS / "bert_pinned_dynamo_opset20.onnx")
    infer_shapes(model)
    layer_norm = next(n for n in model.graph if n.op_type == "LayerNormalization").outputs[0]
    batch = layer_norm.shape[0]
    assert not isinstance(batch, int), "inference alone cannot see through the position-id Slice"

    result = optimize(MODELS / "bert_pinned_dynamo_opset20.onnx", "basic")
    layer_norms = [n.outputs[0] for n in result.model.graph if n.op_type == "LayerNormalization"]
    assert len(layer_norms) == 2 * LAYERS + 1
    assert {tuple(v.shape) for v in layer_norms} == {(1, 16, 64)}


def test_pinned_fixture_before_refinement_shows_the_static_batch_mismatch():
    """What the extended level saw without re-inference: one shape inference, no folding first.
    AttentionFusion alone still refuses (the probe's batch 2 for unk__0 meets a folded-in 1),
    rather than trusting a batch it cannot prove."""
    model = load_model(MODELS / "bert_pinned_dynamo_opset20.onnx")
    infer_shapes(model)
    misses: list = []
    assert apply_rule(AttentionFusion(), model.graph, RuleStats(), misses) == 0
    assert {m.reason for m in misses} == {
        "Q path: does not put batch and sequence on axes 0 and 2 (probe shape [1, 8, 16, 16])"
    }


def _relu_with_stale_value_info() -> onnx.ModelProto:
    """x [1, 16] -> Relu -> y -> Neg -> z, where y's stored value_info still says [batch, 16]."""
    helper, TensorProto = onnx.helper, onnx.TensorProto
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
        "stale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("refine, expected", [(False, ("batch", 16)), (True, (1, 16))])
def test_refining_inference_replaces_symbolic_dims_it_can_prove(refine, expected):
    model = load_model(_relu_with_stale_value_info())
    infer_shapes(model, refine=refine)
    y = next(n for n in model.graph if n.op_type == "Relu").outputs[0]
    assert tuple(d if isinstance(d, int) else str(d) for d in y.shape) == expected
