"""AttentionFusion on GPT-2's attention with a key/value past (tests/models/past_attention.py).

The fused com.microsoft.Attention takes the stacked past, returns the stacked present, and carries
the causal mask as `unidirectional`; onnxruntime (optimizations off) on the original graph is the
oracle, for the optimized graph in onnxruntime and for our own executor, at every level.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import runtime
from optimizer import optimize
from tests.models.past_attention import gpt2_past_attention, hf_past_attention, hf_past_feeds, past_feeds
from tests.oracle import ATOL, RTOL, assert_same_outputs, run_onnxruntime

# (past, new) positions: a prompt after a past, a first prompt, one generated token
STEPS = [(3, 4), (0, 4), (5, 1)]


def _attention(model):
    [node] = [n for n in model.graph if n.op_type == "Attention"]
    return node


def test_the_past_goes_in_and_the_present_comes_out_of_attention():
    result = optimize(gpt2_past_attention(), "extended")
    assert result.report.fusions == {"com.microsoft.Attention": 1}
    node = _attention(result.model)
    assert node.attributes["unidirectional"].value == 1
    assert node.inputs[4].name == "past" and node.inputs[4].is_graph_input()
    assert node.inputs[3].producer().op_type == "Cast"  # the raw attention_mask as mask_index, in int32
    assert node.outputs[1].name == "present" and node.outputs[1].is_graph_output()
    assert {n.op_type for n in result.model.graph} == {"Attention", "Cast"}  # the mask's int64 -> int32


def test_a_bidirectional_buffer_is_no_mask():
    node = _attention(optimize(gpt2_past_attention(buffer="ones"), "extended").model)
    assert "unidirectional" not in node.attributes


def test_without_a_present_attention_still_returns_one_for_onnxruntime():
    # onnxruntime's Attention refuses a past without a present output; nothing reads it here.
    node = _attention(optimize(gpt2_past_attention(present=False), "extended").model)
    assert len(node.outputs) == 2 and not node.outputs[1].uses()


VARIANTS = {
    "causal": {},
    "ones": {"buffer": "ones"},
    "no_present": {"present": False},
    "no_padding": {"padding": False},
    "key_in_heads": {"key_layout": "heads"},
}


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_level_matches_onnxruntime_in_onnxruntime_and_in_our_executor(variant, level):
    model = gpt2_past_attention(**VARIANTS[variant])
    optimized = optimize(model, level)
    assert optimized.report.fusions == ({} if level == "basic" else {"com.microsoft.Attention": 1})
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    names = [o.name for o in model.graph.output]
    for past, new in STEPS:
        feeds = past_feeds(model, batch=2, past=past, seq=new)
        assert_same_outputs(model, optimized, feeds)
        expected = run_onnxruntime(model, feeds)
        for name, got in zip(names, session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, expected[name], rtol=RTOL, atol=ATOL, err_msg=f"{name}, past {past}")


@pytest.mark.parametrize(
    ("variant", "step", "reason"),
    [
        ({"buffer": "upper"}, "mask", "neither causal (j <= past + i) nor all visible"),
        ({"past_first": False}, "projection", "puts the new keys/values before the past"),
    ],
)
def test_a_past_attention_cannot_take_says_why(variant, step, reason):
    report = optimize(gpt2_past_attention(**variant), "extended").report
    assert "com.microsoft.Attention" not in report.fusions
    [miss] = report.explain("AttentionFusion")
    assert miss.step == step and reason in miss.reason, miss.reason


@pytest.mark.parametrize("level", ["extended", "all"])
def test_a_hugging_face_cache_goes_into_multi_head_attention(level):
    # past_key / past_value [B, N, P, H] per layer: the Concats onto them go into the fused op, as
    # its past_key / past_value inputs and present_key / present_value outputs; the new K and V
    # enter as the [B, S, hidden] they were split into heads from.
    model = hf_past_attention()
    optimized = optimize(model, level)
    assert optimized.report.fusions == {"com.microsoft.MultiHeadAttention": 1}
    assert "Concat" not in optimized.report.ops_after
    [node] = [n for n in optimized.model.graph if n.op_type == "MultiHeadAttention"]
    assert [v.name for v in node.inputs[1:3]] == ["k", "v"]
    assert [v.name for v in node.inputs[6:8]] == ["past_key", "past_value"]
    assert [v.name for v in node.outputs[1:]] == ["present_key", "present_value"]
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    names = [o.name for o in model.graph.output]
    for past, new in STEPS:
        feeds = hf_past_feeds(batch=2, past=past, seq=new)
        assert_same_outputs(model, optimized, feeds)
        expected = run_onnxruntime(model, feeds)
        for name, got in zip(names, session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, expected[name], rtol=RTOL, atol=ATOL, err_msg=f"{name}, past {past}")


@pytest.mark.parametrize("level", ["extended", "all"])
def test_a_mask_sliced_to_the_length_of_the_present_key_still_fuses(level):
    # transformers' SDPA slices the mask to key.shape[-2], the concatenated key that is also the
    # present output (Optimum's GPT-2 and BART decoders with past). Fused, that Shape would read the
    # op's own present output to compute the op's mask, a cycle: it is computed from the past's
    # shape and the new key's length instead. The bias here has two more columns than keys.
    model = hf_past_attention(mask_to_key_length=True)
    optimized = optimize(model, level)
    assert optimized.report.fusions == {"com.microsoft.MultiHeadAttention": 1}
    [node] = [n for n in optimized.model.graph if n.op_type == "MultiHeadAttention"]
    assert all(v.producer() is not node for v in node.inputs if v is not None)
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    names = [o.name for o in model.graph.output]
    for past, new in STEPS:
        feeds = hf_past_feeds(batch=2, past=past, seq=new, extra_keys=2)
        assert_same_outputs(model, optimized, feeds)
        expected = run_onnxruntime(model, feeds)
        for name, got in zip(names, session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, expected[name], rtol=RTOL, atol=ATOL, err_msg=f"{name}, past {past}")


def test_a_present_read_back_into_its_own_mask_is_a_near_miss_not_a_cycle():
    # The present key passes a Neg before its Shape: nothing recomputes that from the op's inputs,
    # so fused, the op's mask would come from its own present output. Refused, with the reason.
    proto = hf_past_attention(mask_to_key_length=True)
    [shape] = [n for n in proto.graph.node if n.name == "/attn/Shape_key"]
    shape.input[0] = "negated_key"
    proto.graph.node.insert(list(proto.graph.node).index(shape),
                            onnx.helper.make_node("Neg", ["present_key"], ["negated_key"], name="/attn/Neg_key"))
    result = optimize(proto, "extended")
    assert "com.microsoft.MultiHeadAttention" not in result.report.fusions
    [miss] = result.report.explain("AttentionFusion")
    assert miss.step == "boundary" and "its own output" in miss.reason and "/attn/Neg_key" in miss.reason, miss.reason
    assert_same_outputs(proto, result, hf_past_feeds(batch=2, past=3, seq=4, extra_keys=2))


def test_a_present_shape_with_start_and_end_is_computed_as_it_was():
    # Shape(present_key, start=-2, end=-1) gives the key length directly (opset 15's bounds, negative
    # from the back): the recomputed shape takes the same bounds.
    proto = hf_past_attention(mask_to_key_length=True)
    [shape] = [n for n in proto.graph.node if n.name == "/attn/Shape_key"]
    shape.attribute.extend([onnx.helper.make_attribute("start", -2), onnx.helper.make_attribute("end", -1)])
    [mask_slice] = [n for n in proto.graph.node if n.name == "/attn/Slice_mask"]
    mask_slice.input[2] = "present_shape"
    [gather] = [n for n in proto.graph.node if n.name == "/attn/Gather_key"]
    proto.graph.node.remove(gather)
    result = optimize(proto, "extended")
    assert result.report.fusions == {"com.microsoft.MultiHeadAttention": 1}
    session = runtime.InferenceSession(proto, runtime.SessionOptions(graph_optimization_level="extended"))
    for past, new in STEPS:
        feeds = hf_past_feeds(batch=2, past=past, seq=new, extra_keys=2)
        assert_same_outputs(proto, result, feeds)
        for (name, want), got in zip(run_onnxruntime(proto, feeds).items(), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{name}, past {past}")
