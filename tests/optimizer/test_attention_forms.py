"""Attention forms beyond BERT/GPT-2/Llama, as exported from transformers (tests/models/attention_forms/).

Each form fuses with the counts pinned here at level extended, and the fused graph computes what the
original does on padded inputs (tests/optimizer/test_padded_inputs.py runs every level on left- and
right-padded, fully masked, batch-1 and one-position inputs). Forms our fused ops cannot express are
in docs/optimizer.md with the near miss they leave.
"""

from __future__ import annotations

import onnx
import pytest

from optimizer import optimize
from tests.optimizer.test_padded_inputs import masked_inputs
from tests.oracle import MODELS, assert_fuses_as_pinned

FORMS = MODELS / "attention_forms"

# file -> the fused ops optimize(..., "extended") makes, every rule's pinned exactly
PINNED = {
    # one K/V head every query head shares (multi-query): MultiHeadAttention over K/V expanded to
    # every head, then GroupQueryAttention with kv_num_heads=1 (the Expand taken back out)
    "falcon_dynamo.onnx": {"com.microsoft.GroupQueryAttention": 2, "com.microsoft.SkipLayerNormalization": 2},
    "bigcode_torchscript.onnx": {"LayerNormalization": 1, "com.microsoft.FastGelu": 2,
                                 "com.microsoft.GroupQueryAttention": 2, "com.microsoft.SkipLayerNormalization": 4},
    # a relative position bias added to the scores, then the padding mask: attention_bias is their sum
    "mpnet_dynamo.onnx": {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                          "com.microsoft.EmbedLayerNormalization": 1, "com.microsoft.SkipLayerNormalization": 4},
    # Q·Kᵀ and probs·V as [batch*heads, S, ...] products, the scores reshaped to [B, N, S, T] around
    # the masked_fill and Softmax: the probe proves both reshapes keep head n of batch b at row b*N + n
    "deberta_v2_dynamo.onnx": {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                               "com.microsoft.SkipLayerNormalization": 4},
    # the same in TorchScript, whose scale sqrt(head_size) is computed from a Shape of K at run time
    # (inference leaves the head size unnamed): evaluated at both probe sizes, equal, so a constant
    "deberta_v2_torchscript.onnx": {"LayerNormalization": 1, "com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                                    "com.microsoft.SkipLayerNormalization": 4},
    # ALiBi added to the [batch*heads, S, T] scores before their reshape (baddbmm): reshaped to
    # [B, N, 1, T] and repeated over the queries it joins the mask in attention_bias; the TorchScript
    # export also Casts the probabilities to the type they have
    "bloom_dynamo.onnx": {"com.microsoft.Attention": 2, "com.microsoft.FastGelu": 2,
                          "com.microsoft.SkipLayerNormalization": 4},
    "bloom_torchscript.onnx": {"LayerNormalization": 4, "Reshape": 1, "com.microsoft.Attention": 2,
                               "com.microsoft.FastGelu": 2, "com.microsoft.SkipLayerNormalization": 2},
    # ALiBi [heads, 1, T] (a slice of a buffer by the sequence length) added under a finfo.min
    # masked_fill, which absorbs it where it masks: it joins attention_bias, repeated over the queries
    "mpt_dynamo.onnx": {"com.microsoft.Attention": 2, "com.microsoft.SkipLayerNormalization": 4},
    # the same in TorchScript, whose K reshape also feeds a second Transpose that only sizes the ALiBi
    # slice (and T5's first layer's, sizing its position bias): that reshape and what it is computed
    # from stay in the graph for that reader (attention_shared.py), the projection among them, so
    # the block is MultiHeadAttention over Q, K, V as projected rather than Attention projecting again
    "mpt_torchscript.onnx": {"com.microsoft.Gelu": 2, "com.microsoft.MultiHeadAttention": 2},
    "t5_encoder_torchscript.onnx": {"Reshape": 1, "SimplifiedLayerNormalization": 1, "com.microsoft.Attention": 1,
                                    "com.microsoft.MultiHeadAttention": 1,
                                    "com.microsoft.SkipSimplifiedLayerNormalization": 4},
    # Q and K in heads after TorchScript's partial rotary (the rotated slice of each head concatenated
    # with the rest), whose heads and head size inference cannot name: read by evaluating the chain
    # at both probe sizes. GPT-NeoX's K/V have every head (MultiHeadAttention); Phi-3's two K/V heads
    # are repeated (GroupQueryAttention), as are Gemma's one, whose repeat inference leaves unnamed
    "gpt_neox_torchscript.onnx": {"Reshape": 2, "com.microsoft.BiasGelu": 2, "com.microsoft.MultiHeadAttention": 2,
                                  "com.microsoft.SkipLayerNormalization": 1},
    "phi3_torchscript.onnx": {"Reshape": 6, "SimplifiedLayerNormalization": 3, "com.microsoft.GroupQueryAttention": 2,
                              "com.microsoft.QuickGelu": 2, "com.microsoft.SkipSimplifiedLayerNormalization": 2},
    # Falcon's multi-query block in TorchScript: SDPA scales Q and Kᵀ each by sqrt(sqrt(1/head_size))
    # computed from K's shape, and the rotary Add loses K's one head to inference: the scale steps
    # join the fused op's scale, the head is read by evaluating K's chain
    "falcon_torchscript.onnx": {"LayerNormalization": 1, "Reshape": 8, "com.microsoft.Gelu": 2,
                                "com.microsoft.GroupQueryAttention": 2, "com.microsoft.SkipLayerNormalization": 2},
    "gemma_torchscript.onnx": {"Reshape": 6, "SimplifiedLayerNormalization": 1, "com.microsoft.FastGelu": 2,
                               "com.microsoft.GroupQueryAttention": 2,
                               "com.microsoft.SkipSimplifiedLayerNormalization": 4},
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_attention_form_fuses_as_pinned_and_matches_on_padded_inputs(name):
    model = onnx.load(FORMS / name)
    assert_fuses_as_pinned(model, masked_inputs(model)["left_padded"], PINNED[name])


@pytest.mark.parametrize("name", ["falcon_dynamo.onnx", "falcon_torchscript.onnx"])
def test_multi_query_attention_reads_its_one_key_value_head(name):
    fused = optimize(onnx.load(FORMS / name), "extended").model
    gqa = [node for node in fused.graph if node.op_type == "GroupQueryAttention"]
    assert [(n.attributes["num_heads"].value, n.attributes["kv_num_heads"].value) for n in gqa] == [(4, 1)] * 2
    assert [n.attributes["scale"].value for n in gqa] == pytest.approx([8 ** -0.5] * 2)  # head size 8
    assert not any(node.op_type == "Softmax" or node.name.endswith(("/key_heads", "/value_heads")) for node in fused.graph)


@pytest.mark.parametrize("name", ["mpt_torchscript.onnx", "t5_encoder_torchscript.onnx"])
def test_k_reshape_another_reader_needs_stays_for_it(name):
    fused = optimize(onnx.load(FORMS / name), "extended")
    assert not [m for m in fused.report.near_misses if m.rule == "AttentionFusion" and m.step != "anchor"]
    kept = [n for n in fused.model.graph if n.name.endswith("/Reshape_1") and "att" in n.name.lower()]
    assert kept and all(n.outputs[0].uses() for n in kept)
    # no projection computed twice: every MatMul left is read, and none by a packed Attention's weight
    mha = [n for n in fused.model.graph if n.op_type == "MultiHeadAttention"]
    assert mha and all(v.producer().op_type in ("MatMul", "Slice") for n in mha for v in n.inputs[:3])


def test_every_attention_form_file_is_pinned():
    assert sorted(p.name for p in FORMS.glob("*.onnx")) == sorted(PINNED)
