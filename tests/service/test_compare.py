"""Mark-all comparison: a fusion made wrong on purpose is found at its own tensor and named by its rule,
on our engine and on onnxruntime; nothing diverges with the real rules; memory stays within the budget.

Tolerances are the project's fp32 defaults (rtol 1e-3, atol 1e-4).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from service.adapters.engines.compare import plan_chunks
from service.adapters.engines.compare_native import compare_native, unfused_sizes
from service.adapters.engines.compare_onnxruntime import (
    compare_onnxruntime,
    compare_onnxruntime_files,
    write_graphs,
)
from service.adapters.engines.feeds import LEFT_PADDED, RIGHT_PADDED, SYNTHESIZED, synthesized_feed_sets
from service.domain.tolerances import Tolerances
from tests.oracle import ATOL, MODELS, RTOL  # the float32 tolerances
from tests.service.wrong_fusions import (
    WRONG_EPSILON,
    AttentionWithoutGuard,
    SkipLayerNormWrongEpsilon,
    swap_rule,
)

BERT = MODELS / "bert_torchscript_opset14.onnx"
LLAMA = MODELS / "llama_torchscript_opset14.onnx"
SEQ = 16
TOLERANCES = Tolerances(RTOL, ATOL)
# The first residual + LayerNorm of the encoder, which SkipLayerNormFusion (ours) and LayerNormFusion
# (onnxruntime's, which leaves the Add) replace: the first tensor a wrong epsilon changes.
FIRST_SKIP_LAYER_NORM = "/model/encoder/layer.0/attention/output/LayerNorm/Add_1_output_0"


@pytest.fixture(scope="module")
def bert_feeds():
    return synthesized_feed_sets(onnx.load(BERT), SEQ)


def test_padded_feed_sets_mask_the_first_and_last_quarter():
    sets = synthesized_feed_sets(onnx.load(LLAMA), SEQ)
    assert list(sets) == [SYNTHESIZED, LEFT_PADDED, RIGHT_PADDED]
    assert sets[SYNTHESIZED]["attention_mask"].shape == (1, SEQ)
    left, right = sets[LEFT_PADDED]["attention_mask"], sets[RIGHT_PADDED]["attention_mask"]
    assert left.shape == right.shape == (2, SEQ)
    assert left[0].tolist() == [0] * 4 + [1] * 12 and left[1].all()
    assert right[1].tolist() == [1] * 12 + [0] * 4 and right[0].all()
    resnet = synthesized_feed_sets(onnx.load(MODELS / "resnet_tiny_opset17.onnx"), SEQ)
    assert list(resnet) == [SYNTHESIZED]  # no attention mask, nothing to pad


def test_real_rules_leave_every_surviving_tensor_within_tolerance(bert_feeds):
    for comparison in compare_native(BERT, "extended", bert_feeds, TOLERANCES):
        assert comparison.status == "compared" and comparison.ok
        assert comparison.diverging == 0 and comparison.first is None
        assert comparison.tensors == 61  # of the unfused graph's node outputs, those the fused graph still has (CastElimination removes 5 no-op Casts)
        assert {row.rule for row in comparison.rows} >= {"SkipLayerNormFusion", "AttentionFusion", "BiasGeluFusion"}


def test_wrong_constant_is_found_at_its_tensor_on_our_engine(monkeypatch, bert_feeds):
    swap_rule(monkeypatch, SkipLayerNormWrongEpsilon())
    comparison = compare_native(BERT, "extended", {SYNTHESIZED: bert_feeds[SYNTHESIZED]}, TOLERANCES)[0]
    first = comparison.first
    assert not comparison.ok and comparison.status == "compared"
    assert first.tensor == FIRST_SKIP_LAYER_NORM
    assert (first.rule, first.op, first.fused_op) == (
        "SkipLayerNormFusion", "com.microsoft.SkipLayerNormalization", "com.microsoft.SkipLayerNormalization"
    )
    assert (first.reference_node, first.reference_op) == ("/model/encoder/layer.0/attention/output/LayerNorm/Add_1", "Add")
    assert first.max_abs > 0.1 and first.nonfinite is None
    # Every tensor from there on carries it; none before it diverges.
    rows = [row.tensor for row in comparison.rows]
    assert all(not row.diverges for row in comparison.rows[: rows.index(FIRST_SKIP_LAYER_NORM)])
    assert comparison.diverging == 14


def _wrong_epsilon_in_onnxruntime_graph(path, tensor: str) -> None:
    """onnxruntime's own fusion made wrong on purpose: the LayerNormalization it fused for `tensor`
    gets epsilon 0.5, as a rule variant with a wrong constant would have written it."""
    model = onnx.load(str(path), load_external_data=False)
    [node] = [n for n in model.graph.node if tensor in n.output]
    assert node.op_type == "LayerNormalization"
    for attribute in node.attribute:
        if attribute.name == "epsilon":
            attribute.f = WRONG_EPSILON
    onnx.save(model, str(path))


def test_wrong_constant_is_found_at_its_tensor_on_onnxruntime(tmp_path, bert_feeds):
    feeds = {SYNTHESIZED: bert_feeds[SYNTHESIZED]}
    unfused, optimized = write_graphs(BERT, "extended", tmp_path)
    [clean] = compare_onnxruntime_files(unfused, optimized, "extended", feeds, TOLERANCES)
    assert clean.ok and clean.diverging == 0 and clean.tensors > 100
    _wrong_epsilon_in_onnxruntime_graph(optimized, FIRST_SKIP_LAYER_NORM)
    [comparison] = compare_onnxruntime_files(
        unfused, optimized, "extended", feeds, TOLERANCES, sizes=unfused_sizes(BERT, feeds)
    )
    first = comparison.first
    assert not comparison.ok
    assert first.tensor == FIRST_SKIP_LAYER_NORM
    assert (first.rule, first.op, first.fused_op) == ("LayerNormFusion", "LayerNormalization", "LayerNormalization")
    assert first.max_abs > 0.1


def test_nan_from_a_fusion_is_a_mismatch_whatever_the_tolerance(monkeypatch):
    sets = synthesized_feed_sets(onnx.load(LLAMA), SEQ)
    for comparison in compare_native(LLAMA, "extended", sets, TOLERANCES):
        assert comparison.ok and comparison.diverging == 0, comparison.feed_set
    swap_rule(monkeypatch, AttentionWithoutGuard())
    found = {c.feed_set: c for c in compare_native(LLAMA, "extended", sets, Tolerances(rtol=1e9, atol=1e9))}
    assert found[SYNTHESIZED].ok and found[RIGHT_PADDED].ok  # no row is fully masked there
    left = found[LEFT_PADDED]
    assert not left.ok and left.new_nonfinite
    assert left.first.tensor == "/model/layers.0/self_attn/Reshape_8_output_0"
    assert left.first.nonfinite == "NaN"
    # AttentionFusion's MultiHeadAttention, taken on by GroupQueryAttentionFusion
    assert (left.first.op, left.first.rule) == ("com.microsoft.GroupQueryAttention", "GroupQueryAttentionFusion")
    assert "AttentionFusion" in left.first.node


def test_chunks_change_memory_not_the_answer(monkeypatch, bert_feeds):
    swap_rule(monkeypatch, SkipLayerNormWrongEpsilon())
    feeds = {SYNTHESIZED: bert_feeds[SYNTHESIZED]}
    whole = compare_native(BERT, "extended", feeds, TOLERANCES)[0]
    # 64 KiB per side: one BERT fixture hidden state is 4 KiB, so the 66 tensors take many runs.
    chunked = compare_native(BERT, "extended", feeds, TOLERANCES, budget_bytes=128 * 2**10)[0]
    assert chunked.status == "compared"
    assert (chunked.first, chunked.diverging, chunked.tensors) == (whole.first, whole.diverging, whole.tensors)


def test_a_model_too_large_to_compare_is_marked_and_its_outputs_still_checked(bert_feeds):
    feeds = {SYNTHESIZED: bert_feeds[SYNTHESIZED]}
    comparison = compare_native(BERT, "extended", feeds, TOLERANCES, budget_bytes=4096)[0]
    assert comparison.status == "too-large"
    assert "alone holds" in comparison.reason and "budget" in comparison.reason
    assert comparison.ok and comparison.tensors == 2  # last_hidden_state and pooler_output
    on_onnxruntime = compare_onnxruntime(BERT, "extended", feeds, TOLERANCES, budget_bytes=4096,
                                         sizes=unfused_sizes(BERT, feeds))[0]
    assert on_onnxruntime.status == "too-large" and on_onnxruntime.ok


def test_chunk_plan_bounds_each_side_and_the_number_of_runs():
    sizes = {f"t{i}": 100 for i in range(10)}
    assert plan_chunks(list(sizes), sizes, budget_bytes=600) == [[f"t{i}" for i in range(j, j + 3)] for j in (0, 3, 6)] + [["t9"]]
    assert "need 100 runs" in plan_chunks([f"t{i}" for i in range(100)], {f"t{i}": 100 for i in range(100)}, 200)
    assert "'t3' alone holds" in plan_chunks(list(sizes), sizes | {"t3": 10**9}, 600)
    assert np.isfinite(len(plan_chunks(list(sizes), None)))


def test_when_onnxruntime_cannot_write_its_graph_the_outputs_are_still_compared():
    """onnxruntime refuses to write some optimized graphs (its NCHWc layouts); the check then compares
    the graph outputs of its session at the level with ORT_DISABLE_ALL and says why it went no deeper."""
    from service.adapters.engines.compare_onnxruntime import compare_outputs_only
    from service.adapters.engines.custom_ops import NO_CUSTOM_OPS

    model = MODELS / "resnet_tiny_opset17.onnx"
    sets = synthesized_feed_sets(onnx.load(model), SEQ)
    [comparison] = compare_outputs_only(model, "all", sets, TOLERANCES, (), NO_CUSTOM_OPS, "could not write it")
    assert (comparison.status, comparison.reason, comparison.tensors) == ("unavailable", "could not write it", 2)
    assert comparison.ok and comparison.outputs_max_abs < ATOL


def test_a_gpt2_left_padded_nan_is_named_at_attention_fusions_own_node(monkeypatch):
    gpt2 = MODELS / "gpt2_torchscript_opset14.onnx"
    sets = synthesized_feed_sets(onnx.load(gpt2), SEQ)
    swap_rule(monkeypatch, AttentionWithoutGuard())
    found = {c.feed_set: c for c in compare_native(gpt2, "extended", sets, TOLERANCES)}
    assert found[SYNTHESIZED].ok and found[RIGHT_PADDED].ok
    first = found[LEFT_PADDED].first
    assert (first.tensor, first.op, first.rule, first.nonfinite) == (
        "/model/h.0/attn/Reshape_4_output_0", "com.microsoft.Attention", "AttentionFusion", "NaN"
    )
