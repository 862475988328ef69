"""AttentionFusion on today's BERT/GPT-2 exports and on small hand-built attention blocks.

onnxruntime (all graph optimizations off) is the oracle: the fused com.microsoft.Attention
must reproduce the original graph's outputs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx_ir.passes.common import RemoveUnusedNodesPass, ShapeInferencePass

from optimizer import optimize
from optimizer.driver import apply_rule
from optimizer.fusions.attention_fusion import AttentionFusion
from optimizer.report import RuleStats
from tests.models import patterns
from tests.oracle import MODELS, assert_same_outputs, fixture_feeds

TRANSFORMER_FIXTURES = [
    "bert_torchscript_opset14.onnx",  # SDPA: Q and Kᵀ each scaled by sqrt(1/sqrt(d)), NaN guard
    "bert_eager_torchscript_opset14.onnx",  # eager: Q·Kᵀ scaled once, finfo.min mask
    "bert_dynamo_opset20.onnx",  # dynamo SDPA: Kᵀ through a 3-D reshape + transpose
    "gpt2_torchscript_opset14.onnx",  # Conv1D as Reshape -> Gemm -> Reshape, then Split; causal mask
    "gpt2_dynamo_opset20.onnx",  # as above, the block output flattened to [B*S, hidden]
    "bert_static_torchscript_opset14.onnx",  # batch 1, seq 16: reshape targets are constants
    "bert_static_dynamo_opset20.onnx",  # batch 1, seq 16, every intermediate shape stored
]
LAYERS = 2


def _padded_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Padding at the end of both rows, different lengths: the fused mask must follow each row."""
    feeds = fixture_feeds(model, batch=2, seq=16)
    feeds["attention_mask"][0, 13:] = 0  # fixture_feeds pads the last row from position 12
    return feeds


def _attention_only(model: onnx.ModelProto | str) -> tuple[ir.Model, int, list]:
    """Run AttentionFusion alone, as the driver would, so other helpers' rules don't matter."""
    ir_model = ir.from_proto(onnx.load(model) if isinstance(model, str) else model)
    ShapeInferencePass(strict_mode=False)(ir_model)
    near_misses: list = []
    fired = apply_rule(AttentionFusion(), ir_model.graph, RuleStats(), near_misses)
    ir_model.graph.sort()
    return ir_model, fired, near_misses


# --- the exported fixtures -----------------------------------------------------------------


@pytest.mark.parametrize("name", TRANSFORMER_FIXTURES)
def test_extended_level_fuses_one_attention_per_layer(name):
    report = optimize(str(MODELS / name), "extended").report
    assert report.ops_after.get("com.microsoft.Attention") == LAYERS
    assert report.rules["AttentionFusion"].fired == LAYERS
    assert "Softmax" not in report.ops_after
    assert [m for m in report.near_misses if m.rule == "AttentionFusion"] == []


@pytest.mark.parametrize("name", TRANSFORMER_FIXTURES)
def test_fused_fixture_matches_original_in_onnxruntime(name):
    model, fired, near_misses = _attention_only(str(MODELS / name))
    assert fired == LAYERS and near_misses == []
    ops = Counter(n.op_type for n in model.graph)
    assert ops["Attention"] == LAYERS and ops["Softmax"] == 0
    # Q, K, V projections and the probs@V MatMul are absorbed; only the output projection stays.
    attention = [n for n in model.graph if n.op_type == "Attention"]
    assert all(len(n.inputs) == 6 and n.inputs[5] is not None for n in attention)  # mask kept as bias
    original = onnx.load(MODELS / name)
    assert_same_outputs(original, model, _padded_feeds(original))


def test_fused_fixture_at_extended_level_matches_original():
    path = MODELS / "bert_torchscript_opset14.onnx"
    result = optimize(str(path), "extended")
    original = onnx.load(path)
    assert_same_outputs(original, result, _padded_feeds(original))


# --- small blocks ----------------------------------------------------------------------------


def _small_feeds():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((patterns.ATTN_BATCH, patterns.ATTN_SEQ, patterns.ATTN_HIDDEN)).astype(np.float32)
    return {"x": x, "keep": patterns.attention_keep_mask()}


@pytest.mark.parametrize("scale", ["qk", "split"])
@pytest.mark.parametrize("qkv", ["separate", "packed"])
@pytest.mark.parametrize("mask", [True, False])
def test_small_block_fuses_and_matches(scale, qkv, mask):
    original = patterns.self_attention(scale=scale, qkv=qkv, mask=mask)
    model, fired, near_misses = _attention_only(original)
    assert (fired, near_misses) == (1, [])
    ops = Counter(n.op_type for n in model.graph)
    assert ops == Counter({"Attention": 1, "Where": 1} if mask else {"Attention": 1})
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert attention.attributes["num_heads"].value == patterns.ATTN_HEADS
    assert attention.attributes["scale"].value == pytest.approx(0.5)  # 1/sqrt(head size 4)
    feeds = _small_feeds() if mask else {"x": _small_feeds()["x"]}
    assert_same_outputs(original, model, feeds)


def test_key_row_mask_is_repeated_for_every_query():
    # A [B, 1, 1, key] mask, broadcast over the queries: the most common BERT mask (ORT's
    # attention_mask_no_cast.onnx). attention_bias needs one row per query, so the fused graph
    # expands it over the sequence read from the block input.
    original = patterns.self_attention(mask_form="key_row")
    model, fired, near_misses = _attention_only(original)
    assert (fired, near_misses) == (1, [])
    ops = Counter(n.op_type for n in model.graph)
    assert ops == Counter({"Attention": 1, "Where": 1, "Expand": 1, "Shape": 1, "Gather": 1, "Concat": 1})
    x = _small_feeds()["x"]
    assert_same_outputs(original, model, {"x": x, "keep": patterns.attention_keep_mask(rows=1)})


def test_heads_transformed_after_the_projection_fuse_as_multi_head_attention():
    # Llama's rotary embedding sits between Q's projection and the product, so no packed
    # projection exists: the block over the heads becomes MultiHeadAttention.
    original = patterns.self_attention(heads_form=True)
    model, fired, near_misses = _attention_only(original)
    assert (fired, near_misses) == (1, [])
    ops = Counter(n.op_type for n in model.graph)
    assert ops["MultiHeadAttention"] == 1 and "Softmax" not in ops and "MatMul" in ops  # the projections stay
    rot = np.random.default_rng(4).standard_normal((1, 1, patterns.ATTN_SEQ, patterns.ATTN_HIDDEN // patterns.ATTN_HEADS))
    assert_same_outputs(original, model, {**_small_feeds(), "rot": rot.astype(np.float32)})


def test_masked_fill_becomes_an_additive_bias():
    # DistilBERT writes scores.masked_fill(mask, finfo.min): a Where in front of Softmax.
    original = patterns.self_attention(mask_form="fill")
    model, fired, near_misses = _attention_only(original)
    assert (fired, near_misses) == (1, [])
    assert Counter(n.op_type for n in model.graph) == Counter({"Attention": 1, "Where": 1})
    assert_same_outputs(original, model, _small_feeds())


def test_masked_fill_too_small_to_absorb_the_scores_is_a_near_miss():
    # Where(keep, scores, -10000) gives a fully masked row uniform weights; as a bias, -10000 + scores
    # would give it softmax(scores). Only a fill that swallows the score (finfo.min, -inf) is exact.
    original = patterns.self_attention(mask_form="fill")
    fill = next(t for t in original.graph.initializer if t.name == "fill")
    fill.CopyFrom(onnx.numpy_helper.from_array(np.array(-10000.0, np.float32), "fill"))
    _, fired, near_misses = _attention_only(original)
    assert fired == 0
    (miss,) = near_misses
    assert miss.step == "mask" and "does not absorb a score added to it" in miss.reason


@pytest.mark.parametrize("batch_padding", [False, True])
def test_raw_padding_mask_becomes_mask_index(batch_padding):
    # (1 - attention_mask[:, None, None, :]) * -10000 is what onnxruntime passes as the 2-D
    # mask_index (ORT's attention_int32_mask.onnx): the int64 mask is cast to int32, the
    # Unsqueeze/Cast/Sub/Mul path goes, and -10000 becomes mask_filter_value.
    original = patterns.self_attention(mask_form="raw")
    model, fired, near_misses = _attention_only(original)
    assert (fired, near_misses) == (1, [])
    RemoveUnusedNodesPass()(model)  # the old mask path is left unread, as the driver's last step removes it
    assert Counter(n.op_type for n in model.graph) == Counter({"Attention": 1, "Cast": 1})
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert attention.inputs[3].producer().op_type == "Cast"
    assert attention.attributes["mask_filter_value"].value == pytest.approx(-10000.0)
    mask = np.ones((patterns.ATTN_BATCH, patterns.ATTN_SEQ), np.int64)
    if batch_padding:
        mask[-1, -2:] = 0
    assert_same_outputs(original, model, {"x": _small_feeds()["x"], "attention_mask": mask})


def test_packed_projection_is_reused_without_a_new_weight():
    model, fired, _ = _attention_only(patterns.self_attention(qkv="packed"))
    attention = next(n for n in model.graph if n.op_type == "Attention")
    assert fired == 1 and attention.inputs[1].name == "w_qkv" and attention.inputs[2].name == "b_qkv"


def test_intermediate_graph_output_blocks_fusion_with_boundary_reason():
    original = patterns.self_attention(extra_outputs=("probs",))
    report = optimize(original, "extended").report
    assert "com.microsoft.Attention" not in report.ops_after
    misses = [m for m in report.near_misses if m.rule == "AttentionFusion"]
    assert len(misses) == 1
    assert misses[0].anchor == "/attn/Softmax" and misses[0].step == "boundary"
    assert misses[0].reason == "intermediate value 'probs' is a graph output"


def test_custom_op_in_mask_path_is_reported_as_barrier():
    report = optimize(patterns.self_attention(custom_mask_op=True), "extended").report
    assert "com.microsoft.Attention" not in report.ops_after
    (miss,) = [m for m in report.near_misses if m.rule == "AttentionFusion"]
    assert miss.anchor == "/attn/Softmax" and miss.step == "mask"
    assert miss.reason == "mask path contains custom op my.MaskOp '/mask/MaskOp' (custom op, a fusion barrier); its shape is unknown"
    assert miss.barrier == "my.MaskOp"


def test_cross_attention_is_a_near_miss():
    """K and V read another tensor than Q: there is no packed-QKV form."""
    original = patterns.self_attention(mask=False)
    graph = original.graph
    graph.input.append(onnx.helper.make_tensor_value_info("memory", onnx.TensorProto.FLOAT, [2, 4, 8]))
    for node in graph.node:
        if node.name in ("/attn/k/MatMul", "/attn/v/MatMul"):
            node.input[0] = "memory"
    _, fired, near_misses = _attention_only(original)
    assert fired == 0
    (miss,) = near_misses
    assert miss.reason == "K projection reads 'memory', not the same input as Q ('x'): cross-attention has no packed-QKV fused form"


def test_projection_from_a_gather_is_a_near_miss():
    original = patterns.self_attention(mask=False)
    graph = original.graph
    graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((4, 2, 4, 8), np.float32), "table"))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(0, np.int64), "row"))
    graph.node.insert(0, onnx.helper.make_node("Gather", ["table", "row"], ["q_gathered"], name="/attn/q/Gather"))
    for node in graph.node:
        if node.name == "/attn/q/Reshape":
            node.input[0] = "q_gathered"
    _, fired, near_misses = _attention_only(original)
    assert fired == 0
    (miss,) = near_misses
    # ... and why the heads form (MultiHeadAttention on Q, K, V already in heads) does not apply either
    assert miss.reason == (
        "Q projection is not MatMul+Add (or Gemm) on the block input (found Gather '/attn/q/Gather'); as heads for "
        "MultiHeadAttention: Kᵀ does not come from K [batch, heads, keys, head_size] through Transpose/Reshape"
    )


def test_packed_weight_is_built_from_the_weights_even_while_they_are_graph_inputs():
    """Shape inference hands onnx the graph with every initializer as a graph input (onnx-ir's
    call_onnx_api); serializing then builds a small packed weight. It must read the projection
    weights' tensors, not ask whether their values are still constants (ONNX Runtime's
    attention_mask_no_cast.onnx, hidden size 8, crashed so after a later rule fired)."""
    original = patterns.self_attention(qkv="separate", mask=False)
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in original.graph.initializer}
    weights = [initializers[name] for name in ("w_q", "w_k", "w_v")]
    model, fired, _ = _attention_only(original)
    assert fired == 1
    for value in list(model.graph.initializers.values()):
        model.graph.inputs.append(value)
    proto = ir.serde.serialize_model(model)
    attention = next(n for n in proto.graph.node if n.op_type == "Attention")
    packed = next(t for t in proto.graph.initializer if t.name == attention.input[1])
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(packed), np.concatenate(weights, axis=1))


def test_shape_helpers_read_outside_the_block_stay_and_so_do_the_helpers_feeding_them():
    from onnx import TensorProto, helper, numpy_helper

    from optimizer.fusions.attention_layout import dead_helpers
    from optimizer.model_io import load_model

    # Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) is the block; a Range outside it
    # also reads the Gather, which must then stay, and with it the Shape and index feeding it.
    nodes = [
        helper.make_node("Constant", [], ["index"], name="index", value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Constant", [], ["rest"], name="rest", value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "index"], ["batch"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch_1d"], name="unsqueeze"),
        helper.make_node("Concat", ["batch_1d", "rest"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
        helper.make_node("Range", ["start", "batch", "step"], ["positions"], name="range"),
    ]
    graph = helper.make_graph(
        nodes, "helpers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("positions", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (("axes", [0]), ("start", 0), ("step", 1))],
    )
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    reshape = next(node for node in model.graph if node.name == "reshape")
    assert sorted(node.name for node in dead_helpers([reshape])) == ["concat", "rest", "unsqueeze"]
