"""A GPT-2 attention block with a key/value past, as ONNX Runtime's GPT-2 export writes it.

One `past` input (2, batch, heads, past, head_size) per layer, key and value concatenated onto
it, the causal mask sliced out of a constant triangle by shape arithmetic on the scores, a
padding mask over all past + new keys, and one stacked `present` output. The form of
onnxruntime's gpt2_past*.onnx test models, built here so the tests run without them; the
keyword arguments make the variants AttentionFusion must refuse (and say why).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, POSITIONS = 8, 2, 16
HEAD = HIDDEN // HEADS
INT_MAX = np.iinfo(np.int64).max


def gpt2_past_attention(*, buffer="causal", past_first=True, present=True, padding=True, key_layout="transposed",
                        opset=13) -> onnx.ModelProto:
    """buffer: "causal" (lower triangle), "ones" (a bidirectional model), "upper" (not a mask
    Attention has); past_first=False concatenates the new keys before the past; present=False
    leaves the present out; key_layout="heads" concatenates K as [B, N, T, H] and transposes after
    (the form onnxruntime's transpose optimizer leaves), instead of concatenating Kᵀ."""
    rng = np.random.default_rng(11)

    def init(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    inits: list[onnx.TensorProto] = []
    triangle = {"causal": np.tril(np.ones((POSITIONS, POSITIONS))), "ones": np.ones((POSITIONS, POSITIONS)),
                "upper": np.triu(np.ones((POSITIONS, POSITIONS)))}[buffer]
    init("bias", triangle.reshape(1, 1, POSITIONS, POSITIONS).astype(np.float32))
    init("w_qkv", (rng.standard_normal((HIDDEN, 3 * HIDDEN)) * 0.3).astype(np.float32))
    init("b_qkv", (rng.standard_normal(3 * HIDDEN) * 0.1).astype(np.float32))
    init("qkv_sizes", np.array([HIDDEN] * 3, np.int64))
    init("split_heads", np.array([0, 0, HEADS, HEAD], np.int64))
    init("merge_heads", np.array([0, 0, HIDDEN], np.int64))
    for name, value in (("zero", 0), ("one", 1), ("axis0", [0]), ("axis2", [2]), ("axis3", [3]), ("last", [-1]),
                        ("second_last", [-2]), ("end", [INT_MAX]), ("start0", [0])):
        init(name, np.array(value, np.int64))
    init("sqrt_head", np.array(np.sqrt(HEAD), np.float32))
    init("fill", np.array(-10000.0, np.float32))
    init("one_f", np.array(1.0, np.float32))

    def concat(first, second, out, axis, name):
        inputs = [first, second] if past_first else [second, first]
        return helper.make_node("Concat", inputs, [out], name=name, axis=axis)

    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv_mm"], name="/attn/c_attn/MatMul"),
        helper.make_node("Add", ["qkv_mm", "b_qkv"], ["qkv"], name="/attn/c_attn/Add"),
        helper.make_node("Split", ["qkv", "qkv_sizes"], ["q", "k", "v"], name="/attn/Split", axis=2),
        *(helper.make_node("Reshape", [p, "split_heads"], [f"{p}_4d"], name=f"/attn/{p}/Reshape") for p in "qkv"),
        helper.make_node("Transpose", ["q_4d"], ["q_t"], name="/attn/q/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k_4d"], ["k_t"], name="/attn/k/Transpose",
                         perm=[0, 2, 3, 1] if key_layout == "transposed" else [0, 2, 1, 3]),
        helper.make_node("Transpose", ["v_4d"], ["v_t"], name="/attn/v/Transpose", perm=[0, 2, 1, 3]),
        # the past: key stored [B, N, P, H], concatenated as Kᵀ; value as it is
        helper.make_node("Gather", ["past", "zero"], ["past_k"], name="/attn/past/GatherK", axis=0),
        helper.make_node("Gather", ["past", "one"], ["past_v"], name="/attn/past/GatherV", axis=0),
        concat("past_v", "v_t", "value", -2, "/attn/ConcatV"),
    ]
    if key_layout == "transposed":
        nodes += [
            helper.make_node("Transpose", ["past_k"], ["past_kt"], name="/attn/past/TransposeK", perm=[0, 1, 3, 2]),
            concat("past_kt", "k_t", "key_t", -1, "/attn/ConcatK"),
        ]
    else:
        nodes += [
            concat("past_k", "k_t", "key", -2, "/attn/ConcatK"),
            helper.make_node("Transpose", ["key"], ["key_t"], name="/attn/k/TransposeT", perm=[0, 1, 3, 2]),
        ]
    nodes += [
        helper.make_node("MatMul", ["q_t", "key_t"], ["qk"], name="/attn/MatMul"),
        helper.make_node("Div", ["qk", "sqrt_head"], ["scores"], name="/attn/Div"),
        # causal: rows T-S..T and columns 0..T of the triangle, S and T read from the scores
        helper.make_node("Shape", ["scores"], ["scores_shape"], name="/attn/mask/Shape"),
        helper.make_node("Slice", ["scores_shape", "last", "end", "axis0"], ["total"], name="/attn/mask/Total"),
        helper.make_node("Slice", ["scores_shape", "second_last", "last", "axis0"], ["queries"], name="/attn/mask/Queries"),
        helper.make_node("Sub", ["total", "queries"], ["past_len"], name="/attn/mask/Sub"),
        helper.make_node("Slice", ["bias", "past_len", "total", "axis2"], ["rows"], name="/attn/mask/Rows"),
        helper.make_node("Slice", ["rows", "start0", "total", "axis3"], ["block"], name="/attn/mask/Columns"),
        helper.make_node("Cast", ["block"], ["keep"], name="/attn/mask/Cast", to=TensorProto.BOOL),
        helper.make_node("Where", ["keep", "scores", "fill"], ["causal_scores"], name="/attn/mask/Where"),
    ]
    logits = "causal_scores"
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "batch", HEADS, "past_seq", HEAD]),
    ]
    if padding:  # (1 - attention_mask[:, None, None, :]) * -10000 over past + new keys
        init("mask_axes", np.array([1, 2], np.int64))
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_seq"]))
        nodes += [
            helper.make_node("Unsqueeze", ["attention_mask", "mask_axes"], ["mask_4d"], name="/mask/Unsqueeze"),
            helper.make_node("Cast", ["mask_4d"], ["mask_f"], name="/mask/Cast", to=TensorProto.FLOAT),
            helper.make_node("Sub", ["one_f", "mask_f"], ["mask_inv"], name="/mask/Sub"),
            helper.make_node("Mul", ["mask_inv", "fill"], ["additive_mask"], name="/mask/Mul"),
            helper.make_node("Add", ["causal_scores", "additive_mask"], ["masked"], name="/attn/Add"),
        ]
        logits = "masked"
    nodes += [
        helper.make_node("Softmax", [logits], ["probs"], name="/attn/Softmax", axis=3),
        helper.make_node("MatMul", ["probs", "value"], ["context"], name="/attn/MatMul_1"),
        helper.make_node("Transpose", ["context"], ["context_t"], name="/attn/Transpose_out", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merge_heads"], ["y"], name="/attn/Reshape_out"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]
    if present:
        if key_layout == "transposed":
            nodes.append(helper.make_node("Transpose", ["key_t"], ["key"], name="/attn/present/TransposeK",
                                          perm=[0, 1, 3, 2]))
        nodes += [
            helper.make_node("Unsqueeze", ["key", "axis0"], ["present_k"], name="/attn/present/UnsqueezeK"),
            helper.make_node("Unsqueeze", ["value", "axis0"], ["present_v"], name="/attn/present/UnsqueezeV"),
            helper.make_node("Concat", ["present_k", "present_v"], ["present"], name="/attn/present/Concat", axis=0),
        ]
        outputs.append(helper.make_tensor_value_info("present", TensorProto.FLOAT, [2, "batch", HEADS, "total_seq", HEAD]))
    graph = helper.make_graph(nodes, "gpt2_past_attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def past_feeds(model: onnx.ModelProto, batch: int, past: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for `past` cached and `seq` new positions; the attention mask pads the end of the
    last row's keys (a right-padded batch: every query still sees a key, see AttentionFusion's
    docstring on fully masked rows)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        if value.name in ("x", "past"):
            shape = (batch, seq, HIDDEN) if value.name == "x" else (2, batch, HEADS, past, HEAD)
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        elif value.name == "attention_mask":
            mask = np.ones((batch, past + seq), np.int64)
            mask[-1, past + seq - max(1, seq // 3):] = 0
            feeds[value.name] = mask
        else:
            raise AssertionError(f"past_feeds has no rule for input '{value.name}'")
    return feeds


def hf_past_attention(*, mask_to_key_length: bool = False) -> onnx.ModelProto:
    """The cache as Hugging Face models take it today: a past_key and a past_value [B, N, P, H]
    per layer, the new key/value concatenated onto them (the results are the present outputs), and
    the mask the exporter computes as an additive [B, 1, S, P+S] bias (here an input).

    mask_to_key_length: the bias is sliced to the length of the concatenated keys, read from the
    present key's shape, as transformers' SDPA attention does (`attention_mask[:, :, :, :key.shape[-2]]`;
    Optimum's GPT-2 and BART decoders with past): the mask then depends on the present output."""
    rng = np.random.default_rng(12)
    inits = [
        numpy_helper.from_array((rng.standard_normal((HIDDEN, 3 * HIDDEN)) * 0.3).astype(np.float32), "w_qkv"),
        numpy_helper.from_array((rng.standard_normal(3 * HIDDEN) * 0.1).astype(np.float32), "b_qkv"),
        numpy_helper.from_array(np.array([HIDDEN] * 3, np.int64), "qkv_sizes"),
        numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "split_heads"),
        numpy_helper.from_array(np.array([0, 0, HIDDEN], np.int64), "merge_heads"),
        numpy_helper.from_array(np.array(np.sqrt(HEAD), np.float32), "sqrt_head"),
        numpy_helper.from_array(np.array([2], np.int64), "key_axis"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_start"),
        numpy_helper.from_array(np.array([3], np.int64), "last_axis"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv_mm"], name="/attn/c_attn/MatMul"),
        helper.make_node("Add", ["qkv_mm", "b_qkv"], ["qkv"], name="/attn/c_attn/Add"),
        helper.make_node("Split", ["qkv", "qkv_sizes"], ["q", "k", "v"], name="/attn/Split", axis=2),
        *(helper.make_node("Reshape", [p, "split_heads"], [f"{p}_4d"], name=f"/attn/{p}/Reshape") for p in "qkv"),
        *(helper.make_node("Transpose", [f"{p}_4d"], [f"{p}_t"], name=f"/attn/{p}/Transpose", perm=[0, 2, 1, 3])
          for p in "qkv"),
        helper.make_node("Concat", ["past_key", "k_t"], ["present_key"], name="/attn/cache/ConcatK", axis=-2),
        helper.make_node("Concat", ["past_value", "v_t"], ["present_value"], name="/attn/cache/ConcatV", axis=-2),
        helper.make_node("Transpose", ["present_key"], ["key_t"], name="/attn/k/TransposeT", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_t", "key_t"], ["qk"], name="/attn/MatMul"),
        helper.make_node("Div", ["qk", "sqrt_head"], ["scores"], name="/attn/Div"),
        *([helper.make_node("Shape", ["present_key"], ["present_shape"], name="/attn/Shape_key"),
           helper.make_node("Gather", ["present_shape", "key_axis"], ["key_length"], name="/attn/Gather_key", axis=0),
           helper.make_node("Slice", ["attention_bias", "zero_start", "key_length", "last_axis"], ["bias_to_keys"],
                            name="/attn/Slice_mask")] if mask_to_key_length else []),
        helper.make_node("Add", ["scores", "bias_to_keys" if mask_to_key_length else "attention_bias"], ["masked"],
                         name="/attn/Add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "present_value"], ["context"], name="/attn/MatMul_1"),
        helper.make_node("Transpose", ["context"], ["context_t"], name="/attn/Transpose_out", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merge_heads"], ["y"], name="/attn/Reshape_out"),
    ]
    past = ["batch", HEADS, "past_seq", HEAD]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, past),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, past),
        helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT,
                                      ["batch", 1, "seq", "bias_length" if mask_to_key_length else "total_seq"]),
    ]
    present = ["batch", HEADS, "total_seq", HEAD]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
               helper.make_tensor_value_info("present_key", TensorProto.FLOAT, present),
               helper.make_tensor_value_info("present_value", TensorProto.FLOAT, present)]
    graph = helper.make_graph(nodes, "hf_past_attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def hf_past_feeds(batch: int, past: int, seq: int, seed: int = 0, extra_keys: int = 0) -> dict[str, np.ndarray]:
    """Feeds for hf_past_attention: a causal bias over past + new keys; in the last row the first
    key is padding (left-padded), when there is a past to pad. `extra_keys` more columns, all
    visible, that a bias sliced to the key length must drop."""
    rng = np.random.default_rng(seed)
    total = past + seq + extra_keys
    visible = np.broadcast_to(np.arange(total)[None, :] <= past + np.arange(seq)[:, None], (batch, 1, seq, total)).copy()
    visible[..., past + seq:] = True
    if past:
        visible[-1, :, :, 0] = False
    bias = np.where(visible, 0.0, -1e9).astype(np.float32)
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "past_key": rng.standard_normal((batch, HEADS, past, HEAD)).astype(np.float32),
        "past_value": rng.standard_normal((batch, HEADS, past, HEAD)).astype(np.float32),
        "attention_bias": bias,
    }
