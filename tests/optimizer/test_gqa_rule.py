"""GroupQueryAttentionFusion on a hand-built MultiHeadAttention over repeated K/V heads.

The Llama exports' counts and every-level numerics (onnxruntime and our executor) live in
test_user_exports.py; here the repeat itself is varied: neighbouring copies (Llama's
repeat_kv) fuse, a tiled order does not, and the fused graph computes what the unfused one did.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from tests.oracle import assert_fuses_as_pinned

BATCH, SEQ, HEADS, KV_HEADS, HEAD_SIZE = 2, 5, 4, 2, 16
RNG = np.random.default_rng(5)


def grouped_model(repeat_axis=2, causal_bias=True):
    """MultiHeadAttention(q, repeat(k), repeat(v), bias): K/V heads copied HEADS/KV_HEADS times."""
    group = HEADS // KV_HEADS
    expanded = [BATCH, KV_HEADS, SEQ, HEAD_SIZE]
    expanded.insert(repeat_axis, group)
    inits = [
        numpy_helper.from_array(np.array([repeat_axis], np.int64), "axis"),
        numpy_helper.from_array(np.array(expanded, np.int64), "expanded"),
        numpy_helper.from_array(np.array([BATCH, HEADS, SEQ, HEAD_SIZE], np.int64), "heads"),
    ]
    nodes = []
    for role in ("k", "v"):
        nodes += [
            helper.make_node("Unsqueeze", [role, "axis"], [f"{role}5"]),
            helper.make_node("Expand", [f"{role}5", "expanded"], [f"{role}x"]),
            helper.make_node("Reshape", [f"{role}x", "heads"], [f"{role}_rep"]),
        ]
    bias = (
        np.triu(np.full((SEQ, SEQ), -np.inf, np.float32), 1)
        if causal_bias
        else RNG.standard_normal((SEQ, SEQ))
    )
    inits.append(numpy_helper.from_array(bias.astype(np.float32).reshape(1, 1, SEQ, SEQ), "bias"))
    nodes.append(
        helper.make_node(
            "MultiHeadAttention",
            ["q", "k_rep", "v_rep", "", "", "bias"],
            ["y"],
            domain="com.microsoft",
            num_heads=HEADS,
            name="/attn/mha",
        )
    )
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [BATCH, SEQ, HEADS * HEAD_SIZE])]
    inputs += [
        helper.make_tensor_value_info(r, TensorProto.FLOAT, [BATCH, KV_HEADS, SEQ, HEAD_SIZE]) for r in "kv"
    ]
    graph = helper.make_graph(
        nodes, "gqa", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _feeds():
    return {
        "q": RNG.standard_normal((BATCH, SEQ, HEADS * HEAD_SIZE)).astype(np.float32),
        "k": RNG.standard_normal((BATCH, KV_HEADS, SEQ, HEAD_SIZE)).astype(np.float32),
        "v": RNG.standard_normal((BATCH, KV_HEADS, SEQ, HEAD_SIZE)).astype(np.float32),
    }


@pytest.mark.parametrize("causal_bias", [True, False], ids=["causal_mask", "arbitrary_bias"])
def test_neighbouring_copies_fuse_and_compute_the_same(causal_bias):
    assert_fuses_as_pinned(
        grouped_model(causal_bias=causal_bias), _feeds(), {"com.microsoft.GroupQueryAttention": 1}
    )


def test_a_tiled_repeat_is_a_near_miss():
    # Unsqueeze on axis 1 copies the whole set of K/V heads: query head h would read K/V head
    # h % KV_HEADS, not GroupQueryAttention's h // (HEADS / KV_HEADS).
    result = optimize(grouped_model(repeat_axis=1), "extended")
    assert result.report.rules["GroupQueryAttentionFusion"].fired == 0
    [miss] = result.report.explain("GroupQueryAttentionFusion")
    assert miss.step == "repeat" and "neighbouring query heads" in miss.reason
