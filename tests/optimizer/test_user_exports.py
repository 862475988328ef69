"""The fixtures exported as users export them: fused counts pinned, numerics at every level.

BERT and RoBERTa without token_type_ids, GPT-2 with its key/value cache, a Llama-style model at
opsets 14, 20 and 23, BERT and GPT-2 from the dynamo exporter at opset 23 (tests/models/README.md).
Counts are our optimizer's at level extended; the README's table (tools/fusion_table.py) puts
onnxruntime's beside them.
"""

from __future__ import annotations

import onnx
import pytest

from optimizer import optimize
from tests.oracle import MODELS, assert_same_outputs, fixture_feeds

MS = "com.microsoft."
BERT = {f"{MS}Attention": 2, f"{MS}BiasGelu": 2, f"{MS}EmbedLayerNormalization": 1, f"{MS}FusedGemm": 1,
        f"{MS}SkipLayerNormalization": 4}
# Llama: the first RMSNorm reads the embeddings, the four after a residual Add fuse with it.
LLAMA = {"SimplifiedLayerNormalization": 1, f"{MS}SkipSimplifiedLayerNormalization": 4, f"{MS}QuickGelu": 2}

EXTENDED: dict[str, dict[str, int]] = {
    "bert_notype_torchscript_opset14.onnx": BERT,
    "roberta_notype_torchscript_opset14.onnx": BERT,
    # The key/value cache becomes Attention's present output, split back into present_*.
    "gpt2_cache_torchscript_opset14.onnx": {
        "Reshape": 1, f"{MS}Attention": 2, f"{MS}EmbedLayerNormalization": 1, f"{MS}FastGelu": 2,
        f"{MS}SkipLayerNormalization": 4,
    },
    # Q and K pass the rotary embedding (fused: one RotaryEmbedding per Q and K per layer) and K/V
    # the grouped-query repeat after their projections: attention fuses as MultiHeadAttention on
    # the heads, which becomes GroupQueryAttention on the un-repeated K/V. TorchScript's export
    # leaves the number of heads symbolic (view(batch, seq, -1, head_size)); inference at pinned
    # sizes proves it.
    "llama_torchscript_opset14.onnx": {**LLAMA, "Reshape": 6, f"{MS}GroupQueryAttention": 2, f"{MS}RotaryEmbedding": 4},
    "llama_dynamo_opset20.onnx": {**LLAMA, f"{MS}GroupQueryAttention": 2, f"{MS}RotaryEmbedding": 4},
    # opset 23: the exporter's own Attention, RMSNormalization and RotaryEmbedding stay; the
    # rules around them fire on both forms.
    "llama_dynamo_opset23.onnx": {f"{MS}SkipSimplifiedLayerNormalization": 4, f"{MS}QuickGelu": 2},
    "bert_dynamo_opset23.onnx": {f"{MS}BiasGelu": 2, f"{MS}EmbedLayerNormalization": 1, f"{MS}FusedGemm": 1,
                                 f"{MS}SkipLayerNormalization": 4},
    "gpt2_dynamo_opset23.onnx": {f"{MS}EmbedLayerNormalization": 1, f"{MS}FastGelu": 2,
                                 f"{MS}SkipLayerNormalization": 4},
}


@pytest.mark.parametrize("name", sorted(EXTENDED))
def test_extended_fusions_are_pinned(name):
    assert optimize(str(MODELS / name), "extended").report.fusions == EXTENDED[name]


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
@pytest.mark.parametrize("name", sorted(EXTENDED))
def test_every_level_matches_onnxruntime(name, level):
    model = onnx.load(str(MODELS / name))
    result = optimize(model, level)
    assert_same_outputs(model, result, fixture_feeds(model, batch=2, seq=8))


def test_gpt2_cache_comes_out_of_attentions_present():
    model = optimize(str(MODELS / "gpt2_cache_torchscript_opset14.onnx"), "extended").model
    for output in model.graph.outputs[1:]:
        gather = output.producer()
        assert gather.op_type == "Gather" and gather.inputs[0].producer().op_type == "Attention"


def test_opset_23_keeps_the_exporters_fused_ops():
    ops = optimize(str(MODELS / "llama_dynamo_opset23.onnx"), "extended").report.ops_after
    # the first RMS norm has no residual Add in front; the other four became SkipSimplifiedLayerNorm
    assert ops["Attention"] == 2 and ops["RotaryEmbedding"] == 4 and ops["RMSNormalization"] == 1


@pytest.mark.parametrize("level", ["extended", "all"])
@pytest.mark.parametrize("name", sorted(EXTENDED))
def test_every_level_runs_in_our_executor_as_in_onnxruntime(name, level):
    # The fused ops these rules emit (Attention with present, MultiHeadAttention on heads,
    # EmbedLayerNormalization, SkipSimplifiedLayerNormalization) run in runtime/ as well.
    import numpy as np

    import runtime
    from tests.oracle import ATOL, RTOL, run_onnxruntime

    model = onnx.load(str(MODELS / name))
    feeds = fixture_feeds(model, batch=2, seq=8)
    expected = run_onnxruntime(model, feeds)
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    for (output, want), got in zip(expected.items(), session.run(None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=output)
