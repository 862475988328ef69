"""Self-attention blocks as exporters write them, and the scaled or transposed MatMuls inside them."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.models.patterns.parts import float_model, mul, scalar

# A tiny self-attention block as exporters write it: x [2, 4, 8], 2 heads of 4.
# `scale` "qk" scales Q·Kᵀ once (eager), "split" scales Q and Kᵀ by sqrt(1/sqrt(d)) (SDPA).
# `qkv` "separate" is BERT's three MatMul+Add; "packed" is GPT-2's one MatMul+Add then Split.

ATTN_BATCH, ATTN_SEQ, ATTN_HIDDEN, ATTN_HEADS = 2, 4, 8, 2


def self_attention(*, scale="qk", qkv="separate", mask=True, custom_mask_op=False, extra_outputs=(), opset=17,
                   mask_form="rows", heads_form=False):
    rng = np.random.default_rng(7)
    hidden, heads = ATTN_HIDDEN, ATTN_HEADS
    head = hidden // heads
    inits = [numpy_helper.from_array(np.array([0, 0, heads, head], np.int64), "split_heads"),
             numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "merge_heads")]
    nodes = []

    def param(name, shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    if qkv == "packed":
        nodes += [
            helper.make_node("MatMul", ["x", param("w_qkv", (hidden, 3 * hidden))], ["qkv_mm"], name="/attn/c_attn/MatMul"),
            helper.make_node("Add", ["qkv_mm", param("b_qkv", (3 * hidden,))], ["qkv"], name="/attn/c_attn/Add"),
        ]
        inits.append(numpy_helper.from_array(np.array([hidden] * 3, np.int64), "qkv_sizes"))
        nodes.append(helper.make_node("Split", ["qkv", "qkv_sizes"], ["q", "k", "v"], name="/attn/Split", axis=2))
    else:
        for p in "qkv":
            nodes += [
                helper.make_node("MatMul", ["x", param(f"w_{p}", (hidden, hidden))], [f"{p}_mm"], name=f"/attn/{p}/MatMul"),
                helper.make_node("Add", [param(f"b_{p}", (hidden,)), f"{p}_mm"], [p], name=f"/attn/{p}/Add"),
            ]
    for p in "qkv":
        nodes.append(helper.make_node("Reshape", [p, "split_heads"], [f"{p}_4d"], name=f"/attn/{p}/Reshape"))
    if heads_form:  # Q rotated by a per-position factor after the head split (as RoPE does), K in heads first
        nodes += [
            helper.make_node("Transpose", ["q_4d"], ["q_heads"], name="/attn/q/Transpose", perm=[0, 2, 1, 3]),
            helper.make_node("Mul", ["q_heads", "rot"], ["q_t"], name="/attn/q/Rotate"),
            helper.make_node("Transpose", ["k_4d"], ["k_heads"], name="/attn/k/Transpose", perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["k_heads"], ["k_t"], name="/attn/k/TransposeT", perm=[0, 1, 3, 2]),
            helper.make_node("Transpose", ["v_4d"], ["v_t"], name="/attn/v/Transpose", perm=[0, 2, 1, 3]),
        ]
    else:
        nodes += [
            helper.make_node("Transpose", ["q_4d"], ["q_t"], name="/attn/q/Transpose", perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["k_4d"], ["k_t"], name="/attn/k/Transpose", perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", ["v_4d"], ["v_t"], name="/attn/v/Transpose", perm=[0, 2, 1, 3]),
        ]
    if scale == "split":
        root = math.sqrt(1.0 / math.sqrt(head))
        inits.append(scalar("root_scale", root))
        nodes += [
            helper.make_node("Mul", ["q_t", "root_scale"], ["q_s"], name="/attn/MulQ"),
            helper.make_node("Mul", ["k_t", "root_scale"], ["k_s"], name="/attn/MulK"),
            helper.make_node("MatMul", ["q_s", "k_s"], ["scores"], name="/attn/MatMul"),
        ]
    else:
        inits.append(scalar("sqrt_head", math.sqrt(head)))
        nodes += [
            helper.make_node("MatMul", ["q_t", "k_t"], ["qk"], name="/attn/MatMul"),
            helper.make_node("Div", ["qk", "sqrt_head"], ["scores"], name="/attn/Div"),
        ]
    logits = "scores"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ATTN_BATCH, ATTN_SEQ, hidden])]
    if heads_form:
        inputs.append(helper.make_tensor_value_info("rot", TensorProto.FLOAT, [1, 1, ATTN_SEQ, head]))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    if mask and mask_form == "raw":
        # BERT's classic padding mask: (1 - attention_mask[:, None, None, :]) * -10000, [B, 1, 1, S].
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [ATTN_BATCH, ATTN_SEQ]))
        inits += [numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes"), scalar("one", 1.0),
                  scalar("filter", -10000.0)]
        nodes += [
            helper.make_node("Unsqueeze", ["attention_mask", "mask_axes"], ["mask_4d"], name="/mask/Unsqueeze"),
            helper.make_node("Cast", ["mask_4d"], ["mask_f"], name="/mask/Cast", to=TensorProto.FLOAT),
            helper.make_node("Sub", ["one", "mask_f"], ["mask_inv"], name="/mask/Sub"),
            helper.make_node("Mul", ["mask_inv", "filter"], ["additive_mask"], name="/mask/Mul"),
            helper.make_node("Add", ["scores", "additive_mask"], ["masked"], name="/attn/Add"),
        ]
        logits = "masked"
    elif mask:
        # The exporters' additive mask: Where(keep, 0, -inf) over a bool [B, 1, S, S] (mask_form
        # "rows") or one row per batch, [B, 1, 1, S], broadcast over the queries ("key_row").
        rows = 1 if mask_form == "key_row" else ATTN_SEQ
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [ATTN_BATCH, 1, rows, ATTN_SEQ]))
        inits += [scalar("zero", 0.0), scalar("minus_inf", -np.inf)]
        keep = "keep"
        if custom_mask_op:
            nodes.append(helper.make_node("MaskOp", ["keep"], ["keep_custom"], name="/mask/MaskOp", domain="my"))
            imports.append(helper.make_opsetid("my", 1))
            keep = "keep_custom"
        if mask_form == "fill":  # DistilBERT's scores.masked_fill(~keep, finfo.min)
            inits.append(scalar("fill", float(np.finfo(np.float32).min)))
            nodes.append(helper.make_node("Where", [keep, "scores", "fill"], ["masked"], name="/mask/Where"))
        else:
            nodes += [
                helper.make_node("Where", [keep, "zero", "minus_inf"], ["additive_mask"], name="/mask/Where"),
                helper.make_node("Add", ["scores", "additive_mask"], ["masked"], name="/attn/Add"),
            ]
        logits = "masked"
    nodes += [
        helper.make_node("Softmax", [logits], ["probs"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["context"], name="/attn/MatMul_1"),
        helper.make_node("Transpose", ["context"], ["context_t"], name="/attn/Transpose_out", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merge_heads"], ["y"], name="/attn/Reshape_out"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ATTN_BATCH, ATTN_SEQ, hidden])]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in extra_outputs]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=imports)


def attention_keep_mask(rows=ATTN_SEQ):
    """A padding mask as the bool [B, 1, S, S] the exporters build: batch 1 ignores its last key."""
    keep = np.ones((ATTN_BATCH, 1, rows, ATTN_SEQ), bool)
    keep[1, :, :, -1] = False
    return keep



def matmul_scale(*, where="after", op="Mul", scale=0.125, scale_shape=(), shared_scale=False, commute=False):
    """x [2, 4, 8] @ W [8, 16] scaled by a constant before ("before": x is scaled), after, or "both".

    shared_scale: the leading scale's output also feeds a Neg (output 'extra').
    """
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "/attn/W"),
        numpy_helper.from_array(np.full(scale_shape, scale, np.float32), "/attn/scale"),
    ]

    def scaled(src, out, name):
        if op == "Div":
            return helper.make_node("Div", [src, "/attn/scale"], [out], name=name)
        return mul(src, "/attn/scale", out, name, commute)

    nodes, outputs = [], {"y": [2, 4, 16]}
    a = "x"
    if where in ("before", "both"):
        nodes.append(scaled("x", "/attn/xs", "/attn/Scale_in"))
        a = "/attn/xs"
    mm_out = "y" if where == "before" else "/attn/mm"
    nodes.append(helper.make_node("MatMul", [a, "/attn/W"], [mm_out], name="/attn/MatMul"))
    if where in ("after", "both"):
        nodes.append(scaled("/attn/mm", "y", "/attn/Scale_out"))
    if shared_scale:
        nodes.append(helper.make_node("Neg", ["/attn/xs"], ["extra"], name="/other/Neg"))
        outputs["extra"] = [2, 4, 8]
    return float_model(nodes, {"x": [2, 4, 8]}, outputs, inits)


def matmul_transpose(*, side="b", perm=None, shared=False, scale_after=None):
    """a [2, 4, 8] @ b [2, 8, 6] where the chosen side(s) arrive through a Transpose.

    side: "a", "b" or "both"; perm defaults to swapping the last two axes. shared: the
    Transpose output also feeds a Neg (output 'extra'). scale_after: Mul by it after the MatMul.
    """
    perm = perm or [0, 2, 1]
    inputs, nodes, inits = {}, [], []
    names = {}
    for key, shape in (("a", [2, 4, 8]), ("b", [2, 8, 6])):
        if side in (key, "both"):
            stored = [shape[i] for i in np.argsort(perm)]
            inputs[f"{key}_t"] = stored
            nodes.append(helper.make_node("Transpose", [f"{key}_t"], [f"/mm/{key}"], name=f"/mm/Transpose_{key}", perm=perm))
            names[key] = f"/mm/{key}"
        else:
            inputs[key] = shape
            names[key] = key
    mm_out = "y" if scale_after is None else "/mm/out"
    nodes.append(helper.make_node("MatMul", [names["a"], names["b"]], [mm_out], name="/mm/MatMul"))
    outputs = {"y": [2, 4, 6]}
    if scale_after is not None:
        inits.append(scalar("/mm/scale", scale_after))
        nodes.append(helper.make_node("Mul", ["/mm/out", "/mm/scale"], ["y"], name="/mm/Mul"))
    if shared:
        first = next(n for n in nodes if n.op_type == "Transpose")
        nodes.append(helper.make_node("Neg", [first.output[0]], ["extra"], name="/other/Neg"))
        outputs["extra"] = [2, 4, 8] if first.output[0] == "/mm/a" else [2, 8, 6]
    return float_model(nodes, inputs, outputs, inits)
