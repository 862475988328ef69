"""Small ONNX graphs for each fusion pattern, positive and negative, built with onnx.helper."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# --- gelu family and activations ---
# Every builder returns an onnx.ModelProto with float inputs named in `inputs`, so a test
# can feed random data to onnxruntime. Node names follow the exporters' "/mlp/Op" style,
# which is how near misses name their anchor.

SQRT2 = math.sqrt(2.0)


def _act_model(nodes, inputs, outputs, initializers=(), *, opset=14, extra_outputs=(), extra_shape=(2, 4, 16)):
    """A model over float tensors: `inputs`/`outputs` are {name: shape}; `extra_outputs` name
    intermediate values made graph outputs too, all of shape `extra_shape`."""
    graph = helper.make_graph(
        nodes,
        "pattern",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(extra_shape)) for n in extra_outputs],
        list(initializers),
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


def _scalar(name, value):
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def _vector(name, size, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(size).astype(np.float32), name)


def _mul(a, b, out, name, commute=False):
    return helper.make_node("Mul", [b, a] if commute else [a, b], [out], name=name)


def erf_gelu(
    *,
    half="last",
    scale="div",
    commute=False,
    divisor=SQRT2,
    one=1.0,
    bias=False,
    bias_shape=(16,),
    extra_outputs=(),
    extra_consumer=None,
    opset=14,
):
    """x * 0.5 * (1 + Erf(x / √2)) on x [2, 4, 16].

    half: "last" Mul(Mul(x, bracket), 0.5) | "first" Mul(Mul(x, 0.5), bracket) |
          "inside" Mul(x, Mul(bracket, 0.5)). scale: "div" by `divisor` | "mul" by 1/`divisor`.
    commute swaps the inputs of every Add and Mul. bias=True puts Add(x_in, '/mlp/b') first.
    extra_consumer names an intermediate value that a Neg node also reads (output 'extra').
    """
    nodes, inits = [], [_scalar("/mlp/half", 0.5), _scalar("/mlp/one", one)]
    x = "x"
    if bias:
        inits.append(_vector("/mlp/b", bias_shape))
        nodes.append(helper.make_node("Add", ["/mlp/b", "x"] if commute else ["x", "/mlp/b"], ["/mlp/Add_output_0"], name="/mlp/Add"))
        x = "/mlp/Add_output_0"
    if scale == "div":
        inits.append(_scalar("/mlp/sqrt2", divisor))
        nodes.append(helper.make_node("Div", [x, "/mlp/sqrt2"], ["/mlp/scaled"], name="/mlp/Div"))
    else:
        inits.append(_scalar("/mlp/rsqrt2", 1.0 / divisor))
        nodes.append(_mul(x, "/mlp/rsqrt2", "/mlp/scaled", "/mlp/Mul_scale", commute))
    nodes.append(helper.make_node("Erf", ["/mlp/scaled"], ["/mlp/erf"], name="/mlp/Erf"))
    add_inputs = ["/mlp/one", "/mlp/erf"] if commute else ["/mlp/erf", "/mlp/one"]
    nodes.append(helper.make_node("Add", add_inputs, ["/mlp/bracket"], name="/mlp/Add_1"))
    if half == "last":
        nodes.append(_mul(x, "/mlp/bracket", "/mlp/xb", "/mlp/Mul", commute))
        nodes.append(_mul("/mlp/xb", "/mlp/half", "y", "/mlp/Mul_1", commute))
    elif half == "first":
        nodes.append(_mul(x, "/mlp/half", "/mlp/halfx", "/mlp/Mul", commute))
        nodes.append(_mul("/mlp/halfx", "/mlp/bracket", "y", "/mlp/Mul_1", commute))
    else:
        nodes.append(_mul("/mlp/bracket", "/mlp/half", "/mlp/halfb", "/mlp/Mul", commute))
        nodes.append(_mul(x, "/mlp/halfb", "y", "/mlp/Mul_1", commute))
    outputs = {"y": [2, 4, 16]}
    if extra_consumer:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["extra"], name="/other/Neg"))
        outputs["extra"] = [2, 4, 16]
    return _act_model(nodes, {"x": [2, 4, 16]}, outputs, inits, opset=opset, extra_outputs=extra_outputs)


def tanh_gelu(*, cube="pow", half="first", commute=False, coefficient=0.044715, multiplier=None, bias=False):
    """GPT-2's gelu_new: 0.5 * x * (1 + Tanh(√(2/π) * (x + 0.044715 * x³))) on x [2, 4, 16].

    cube: "pow" Pow(x, 3) | "square_first" Mul(Mul(x, x), x) | "square_last" Mul(x, Mul(x, x)).
    """
    multiplier = math.sqrt(2.0 / math.pi) if multiplier is None else multiplier
    inits = [
        _scalar("/act/half", 0.5), _scalar("/act/one", 1.0), _scalar("/act/three", 3.0),
        _scalar("/act/coef", coefficient), _scalar("/act/k", multiplier),
    ]
    nodes = []
    x = "x"
    if bias:
        inits.append(_vector("/mlp/b", (16,)))
        nodes.append(helper.make_node("Add", ["x", "/mlp/b"], ["/mlp/Add_output_0"], name="/mlp/Add"))
        x = "/mlp/Add_output_0"
    if cube == "pow":
        nodes.append(helper.make_node("Pow", [x, "/act/three"], ["/act/cube"], name="/act/Pow"))
    else:
        nodes.append(helper.make_node("Mul", [x, x], ["/act/square"], name="/act/Mul_sq"))
        pair = ["/act/square", x] if cube == "square_first" else [x, "/act/square"]
        nodes.append(helper.make_node("Mul", pair, ["/act/cube"], name="/act/Mul_cube"))
    nodes += [
        _mul("/act/cube", "/act/coef", "/act/term", "/act/Mul_coef", commute),
        helper.make_node("Add", ["/act/term", x] if commute else [x, "/act/term"], ["/act/inner"], name="/act/Add"),
        _mul("/act/inner", "/act/k", "/act/scaled", "/act/Mul_k", commute),
        helper.make_node("Tanh", ["/act/scaled"], ["/act/tanh"], name="/act/Tanh"),
        helper.make_node("Add", ["/act/tanh", "/act/one"], ["/act/bracket"], name="/act/Add_1"),
    ]
    if half == "first":
        nodes.append(_mul(x, "/act/half", "/act/halfx", "/act/Mul_half", commute))
        nodes.append(_mul("/act/halfx", "/act/bracket", "y", "/act/Mul_out", commute))
    else:
        nodes.append(_mul(x, "/act/bracket", "/act/xb", "/act/Mul_x", commute))
        nodes.append(_mul("/act/xb", "/act/half", "y", "/act/Mul_out", commute))
    return _act_model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits)


def factored_tanh_gelu(*, square="nested", commute=False, casts=False, coefficient=0.044715):
    """0.5·x·(1 + Tanh((√(2/π)·x) · (1 + 0.044715·x·x))) on x [2, 4, 16], as Megatron writes it.

    square: "nested" x·(x·0.044715) | "square" (x·x)·0.044715.
    casts: x reaches the cube term and the 0.5·x end through float→float Casts (mixed-precision
    exports; ONNX Runtime's fast_gelu3_with_casts.onnx).
    """
    inits = [_scalar("/act/half", 0.5), _scalar("/act/one", 1.0), _scalar("/act/coef", coefficient),
             _scalar("/act/k", math.sqrt(2.0 / math.pi))]
    nodes = []
    x = x_end = "x"
    if casts:
        nodes.append(helper.make_node("Cast", ["x"], ["/act/x_f"], name="/act/Cast", to=TensorProto.FLOAT))
        x = "/act/x_f"
    if square == "nested":
        nodes += [_mul(x, "/act/coef", "/act/cx", "/act/Mul_c", commute), _mul(x, "/act/cx", "/act/term", "/act/Mul_sq", commute)]
    else:
        nodes += [_mul(x, x, "/act/sq", "/act/Mul_sq", commute), _mul("/act/sq", "/act/coef", "/act/term", "/act/Mul_c", commute)]
    nodes += [
        helper.make_node("Add", ["/act/one", "/act/term"] if commute else ["/act/term", "/act/one"], ["/act/br"], name="/act/Add"),
        _mul(x, "/act/k", "/act/kx", "/act/Mul_k", commute),
        _mul("/act/kx", "/act/br", "/act/scaled", "/act/Mul_arg", commute),
        helper.make_node("Tanh", ["/act/scaled"], ["/act/tanh"], name="/act/Tanh"),
        helper.make_node("Add", ["/act/tanh", "/act/one"], ["/act/bracket"], name="/act/Add_1"),
        _mul(x_end, "/act/half", "/act/halfx", "/act/Mul_half", commute),
    ]
    half = "/act/halfx"
    if casts:
        nodes.append(helper.make_node("Cast", [half], ["/act/halfx_f"], name="/act/Cast_half", to=TensorProto.FLOAT))
        half = "/act/halfx_f"
    nodes.append(_mul(half, "/act/bracket", "y", "/act/Mul_out", commute))
    return _act_model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits)


def quick_gelu(*, alpha=1.702, commute=False, alpha_shape=()):
    """x * Sigmoid(alpha * x) on x [2, 4, 16]; alpha=None gives SiLU, x * Sigmoid(x)."""
    nodes, inits = [], []
    gated = "x"
    if alpha is not None:
        inits.append(numpy_helper.from_array(np.full(alpha_shape, alpha, np.float32), "/act/alpha"))
        nodes.append(_mul("x", "/act/alpha", "/act/ax", "/act/Mul", commute))
        gated = "/act/ax"
    nodes.append(helper.make_node("Sigmoid", [gated], ["/act/sig"], name="/act/Sigmoid"))
    nodes.append(_mul("x", "/act/sig", "y", "/act/Mul_1", commute))
    return _act_model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits)


def sigmoid_gate():
    """x * Sigmoid(g): a gate, not a GELU (QuickGeluFusion leaves it alone, silently)."""
    nodes = [
        helper.make_node("Sigmoid", ["g"], ["/gate/sig"], name="/gate/Sigmoid"),
        helper.make_node("Mul", ["x", "/gate/sig"], ["y"], name="/gate/Mul"),
    ]
    return _act_model(nodes, {"x": [2, 16], "g": [2, 16]}, {"y": [2, 16]})


def add_then_gelu(*, gelu_domain="", opset=20, approximate=None, bias_shape=(16,), bias_side=1, extra_outputs=()):
    """Add(x, '/mlp/b') -> Gelu, the Gelu in either domain (ONNX Gelu needs opset >= 20)."""
    attrs = {} if approximate is None else {"approximate": approximate}
    add_inputs = ["x", "/mlp/b"] if bias_side == 1 else ["/mlp/b", "x"]
    nodes = [
        helper.make_node("Add", add_inputs, ["/mlp/Add_output_0"], name="/mlp/Add"),
        helper.make_node("Gelu", ["/mlp/Add_output_0"], ["y"], name="/mlp/Gelu", domain=gelu_domain, **attrs),
    ]
    return _act_model(
        nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, [_vector("/mlp/b", bias_shape)],
        opset=opset, extra_outputs=extra_outputs,
    )


def gelu_alone(*, gelu_domain="com.microsoft", opset=14, bias=False, approximate=None):
    """A single Gelu (or BiasGelu with bias=True) on x [2, 4, 16], for GeluApproximation."""
    attrs = {} if approximate is None else {"approximate": approximate}
    if bias:
        node = helper.make_node("BiasGelu", ["x", "/mlp/b"], ["y"], name="/mlp/BiasGelu", domain="com.microsoft")
        inits = [_vector("/mlp/b", (16,))]
    else:
        node = helper.make_node("Gelu", ["x"], ["y"], name="/mlp/Gelu", domain=gelu_domain, **attrs)
        inits = []
    return _act_model([node], {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits, opset=opset)


def gemm_activation(activation, *, attrs=None, trans_b=1, extra_consumer=False, opset=14):
    """Gemm(a [4, 8], W, C) -> activation, W stored [16, 8] when trans_b else [8, 16]."""
    rng = np.random.default_rng(1)
    w_shape = (16, 8) if trans_b else (8, 16)
    inits = [
        numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "/fc/W"),
        _vector("/fc/C", (16,), seed=2),
    ]
    nodes = [
        helper.make_node("Gemm", ["a", "/fc/W", "/fc/C"], ["/fc/gemm"], name="/fc/Gemm", alpha=0.5, beta=2.0, transB=trans_b),
        helper.make_node(activation, ["/fc/gemm"], ["y"], name=f"/fc/{activation}", **(attrs or {})),
    ]
    outputs = {"y": [4, 16]}
    if extra_consumer:
        nodes.append(helper.make_node("Neg", ["/fc/gemm"], ["extra"], name="/other/Neg"))
        outputs["extra"] = [4, 16]
    return _act_model(nodes, {"a": [4, 8]}, outputs, inits, opset=opset)


def conv_activation(activation, *, attrs=None, clip=None, clip_dynamic=False, opset=17):
    """Conv(x [1, 3, 8, 8], W [4, 3, 3, 3], B, pads 1) -> activation.

    clip: (min, max) constants as Clip inputs (opset >= 11) or attributes (opset < 11),
    None for either leaves it out. clip_dynamic makes max a graph input.
    """
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "/conv/W"),
        _vector("/conv/B", (4,), seed=4),
    ]
    inputs = {"x": [1, 3, 8, 8]}
    act_inputs = ["/conv/out"]
    attrs = dict(attrs or {})
    if activation == "Clip" and opset < 11:
        lo, hi = clip
        attrs.update({k: v for k, v in (("min", lo), ("max", hi)) if v is not None})
    elif activation == "Clip":
        lo, hi = clip
        act_inputs.append("" if lo is None else "/conv/min")
        if lo is not None:
            inits.append(_scalar("/conv/min", lo))
        if clip_dynamic:
            act_inputs.append("clip_max")
            inputs["clip_max"] = []
        elif hi is not None:
            act_inputs.append("/conv/max")
            inits.append(_scalar("/conv/max", hi))
    nodes = [
        helper.make_node("Conv", ["x", "/conv/W", "/conv/B"], ["/conv/out"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node(activation, act_inputs, ["y"], name=f"/conv/{activation}", **attrs),
    ]
    return _act_model(nodes, inputs, {"y": [1, 4, 8, 8]}, inits, opset=opset)


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
        return _mul(src, "/attn/scale", out, name, commute)

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
    return _act_model(nodes, {"x": [2, 4, 8]}, outputs, inits)


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
        inits.append(_scalar("/mm/scale", scale_after))
        nodes.append(helper.make_node("Mul", ["/mm/out", "/mm/scale"], ["y"], name="/mm/Mul"))
    if shared:
        first = next(n for n in nodes if n.op_type == "Transpose")
        nodes.append(helper.make_node("Neg", [first.output[0]], ["extra"], name="/other/Neg"))
        outputs["extra"] = [2, 4, 8] if first.output[0] == "/mm/a" else [2, 8, 6]
    return _act_model(nodes, inputs, outputs, inits)


# --- attention ---
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
        inits.append(_scalar("root_scale", root))
        nodes += [
            helper.make_node("Mul", ["q_t", "root_scale"], ["q_s"], name="/attn/MulQ"),
            helper.make_node("Mul", ["k_t", "root_scale"], ["k_s"], name="/attn/MulK"),
            helper.make_node("MatMul", ["q_s", "k_s"], ["scores"], name="/attn/MatMul"),
        ]
    else:
        inits.append(_scalar("sqrt_head", math.sqrt(head)))
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
        inits += [numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes"), _scalar("one", 1.0),
                  _scalar("filter", -10000.0)]
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
        inits += [_scalar("zero", 0.0), _scalar("minus_inf", -np.inf)]
        keep = "keep"
        if custom_mask_op:
            nodes.append(helper.make_node("MaskOp", ["keep"], ["keep_custom"], name="/mask/MaskOp", domain="my"))
            imports.append(helper.make_opsetid("my", 1))
            keep = "keep_custom"
        if mask_form == "fill":  # DistilBERT's scores.masked_fill(~keep, finfo.min)
            inits.append(_scalar("fill", float(np.finfo(np.float32).min)))
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


def matmul_add_gelu(*, gelu_domain="", opset=20):
    """MatMul(x, W) -> Add('/mlp/b') -> Gelu: BiasGelu must claim the Add before MatMul+Add -> Gemm."""
    rng = np.random.default_rng(6)
    nodes = [
        helper.make_node("MatMul", ["x", "/mlp/W"], ["/mlp/mm"], name="/mlp/MatMul"),
        helper.make_node("Add", ["/mlp/mm", "/mlp/b"], ["/mlp/Add_output_0"], name="/mlp/Add"),
        helper.make_node("Gelu", ["/mlp/Add_output_0"], ["y"], name="/mlp/Gelu", domain=gelu_domain),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "/mlp/W"), _vector("/mlp/b", (16,))]
    return _act_model(nodes, {"x": [4, 8]}, {"y": [4, 16]}, inits, opset=opset)


# --- basic level ---
# Eliminations, constant folding and the standard-op fusions of ONNX Runtime's Level1.


def _basic_model(nodes, inputs, outputs, initializers=(), *, opset=17):
    """The model, with output shapes left as None filled in by onnx shape inference."""
    graph = helper.make_graph(nodes, "basic", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]  # as inner values, the outputs get their types inferred
    for output in model.graph.output:
        probe.graph.node.append(helper.make_node("Identity", [output.name], [output.name + "__probe"]))
        probe.graph.output.append(helper.make_tensor_value_info(output.name + "__probe", TensorProto.FLOAT, None))
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
    for output in model.graph.output:
        if not output.type.tensor_type.HasField("shape") and output.name in inferred:
            output.type.CopyFrom(inferred[output.name].type)
    return model


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def identity_chain(*, passthrough=False, identity_on_output=False):
    """x -> Relu -> Identity -> Relu -> y; optionally an Identity straight from input to output,
    or an Identity whose output is the graph output."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu0"),
        helper.make_node("Identity", ["r"], ["i"], name="/Identity"),
        helper.make_node("Relu", ["i"], ["y"], name="/relu1"),
    ]
    outputs = [_f32("y", [2, 8])]
    if passthrough:
        nodes.append(helper.make_node("Identity", ["x"], ["x_copy"], name="/Passthrough"))
        outputs.append(_f32("x_copy", [2, 8]))
    if identity_on_output:
        nodes.append(helper.make_node("Identity", ["y"], ["y_named"], name="/OutputIdentity"))
        outputs = [_f32("y_named", [2, 8])] + outputs[1:]
    return _basic_model(nodes, [_f32("x", [2, 8])], outputs)


def dropout(*, mask_used=False, training=None, opset=17):
    """x -> Relu -> Dropout -> Relu; the mask may be read, training_mode may be given."""
    inputs = ["r", "ratio"] + (["training"] if training is not None else [])
    outputs = ["d", "mask"] if mask_used else ["d"]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu0"),
        helper.make_node("Dropout", inputs, outputs, name="/Dropout"),
        helper.make_node("Relu", ["d"], ["y"], name="/relu1"),
    ]
    graph_outputs = [_f32("y", [2, 8])]
    if mask_used:
        nodes.append(helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT, name="/mask_cast"))
        graph_outputs.append(_f32("mask_f", [2, 8]))
    inits = [_init("ratio", np.array(0.1, np.float32))]
    graph_inputs = [_f32("x", [2, 8])]
    if training == "input":
        graph_inputs.append(helper.make_tensor_value_info("training", TensorProto.BOOL, []))
    elif training is not None:
        inits.append(_init("training", np.array(training)))
    return _basic_model(nodes, graph_inputs, graph_outputs, inits, opset=opset)


def slice_model(*, starts=(0,), ends=(2**31 - 1,), axes=(1,), steps=(1,), shape=(2, 8)):
    """x -> Relu -> Slice(starts, ends, axes, steps) -> Relu."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu0"),
        helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["s"], name="/Slice"),
        helper.make_node("Relu", ["s"], ["y"], name="/relu1"),
    ]
    inits = [_init(n, np.array(v, np.int64)) for n, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    return _basic_model(nodes, [_f32("x", list(shape))], [_f32("y", None)], inits)


def unsqueeze_initializer(*, axes=(0,), opset=17, dynamic_axes=False):
    """y = x + Unsqueeze(bias[8], axes): a bias made [1, 8] by the exporter."""
    rng = np.random.default_rng(1)
    inits = [_init("bias", rng.standard_normal(8).astype(np.float32))]
    inputs = [_f32("x", [2, 8])]
    if opset >= 13:
        if dynamic_axes:
            inputs.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [len(axes)]))
        else:
            inits.append(_init("axes", np.array(axes, np.int64)))
        unsqueeze = helper.make_node("Unsqueeze", ["bias", "axes"], ["b2"], name="/Unsqueeze")
    else:
        unsqueeze = helper.make_node("Unsqueeze", ["bias"], ["b2"], axes=list(axes), name="/Unsqueeze")
    nodes = [unsqueeze, helper.make_node("Add", ["x", "b2"], ["y"], name="/Add")]
    return _basic_model(nodes, inputs, [_f32("y", [2, 8])], inits, opset=opset)


def relu_clip(*, order="relu_clip", low=-1.0, high=6.0, opset=17, dynamic_min=False):
    """Relu -> Clip or Clip -> Relu (min/max as inputs from opset 11, attributes before)."""
    clip_inputs, inits, inputs = ["a"], [], [_f32("x", [2, 8])]
    attrs = {}
    if opset >= 11:
        if dynamic_min:
            inputs.append(_f32("lo", []))
        elif low is not None:
            inits.append(_init("lo", np.array(low, np.float32)))
        clip_inputs.append("lo" if (low is not None or dynamic_min) else "")
        if high is not None:
            inits.append(_init("hi", np.array(high, np.float32)))
            clip_inputs.append("hi")
    else:
        attrs = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
    if order == "relu_clip":
        nodes = [helper.make_node("Relu", ["x"], ["a"], name="/Relu"),
                 helper.make_node("Clip", clip_inputs, ["y"], name="/Clip", **attrs)]
    else:
        clip_inputs[0] = "x"
        nodes = [helper.make_node("Clip", clip_inputs, ["a"], name="/Clip", **attrs),
                 helper.make_node("Relu", ["a"], ["y"], name="/Relu")]
    return _basic_model(nodes, inputs, [_f32("y", [2, 8])], inits, opset=opset)


def conv_then(op, *, operand_shape=(4, 1, 1), operand="const", conv_bias=True, weights="const"):
    """Conv(x[1,3,6,6], W[4,3,3,3]) -> Add/Mul(operand): a per-channel operand by default."""
    rng = np.random.default_rng(2)
    inits = [_init("b", rng.standard_normal(4).astype(np.float32))]
    inputs = [_f32("x", [1, 3, 6, 6])]
    if weights == "const":
        inits.append(_init("W", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)))
    else:
        inputs.append(_f32("W", [4, 3, 3, 3]))
    if operand == "const":
        inits.append(_init("c", (rng.standard_normal(operand_shape) + 1.5).astype(np.float32)))
    else:
        inputs.append(_f32("c", list(operand_shape)))
    conv_inputs = ["x", "W", "b"] if conv_bias else ["x", "W"]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["conv"], pads=[1, 1, 1, 1], name="/conv/Conv"),
        helper.make_node(op, ["conv", "c"], ["y"], name=f"/conv/{op}"),
    ]
    return _basic_model(nodes, inputs, [_f32("y", None)], inits)


def conv_bn(*, conv_bias=True, dynamic_mean=False):
    """Conv(x[1,3,6,6]) -> BatchNormalization with constant (or one dynamic) parameters."""
    rng = np.random.default_rng(3)
    inits = [
        _init("W", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
        _init("b", rng.standard_normal(4).astype(np.float32)),
        _init("scale", (rng.random(4) + 0.5).astype(np.float32)),
        _init("bias", rng.standard_normal(4).astype(np.float32)),
        _init("var", (rng.random(4) + 0.5).astype(np.float32)),
    ]
    inputs = [_f32("x", [1, 3, 6, 6])]
    if dynamic_mean:
        inputs.append(_f32("mean", [4]))
    else:
        inits.append(_init("mean", rng.standard_normal(4).astype(np.float32)))
    nodes = [
        helper.make_node("Conv", ["x", "W", "b"] if conv_bias else ["x", "W"], ["conv"], pads=[1, 1, 1, 1], name="/conv/Conv"),
        helper.make_node("BatchNormalization", ["conv", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3, name="/bn/BatchNormalization"),
    ]
    return _basic_model(nodes, inputs, [_f32("y", None)], inits)


def matmul_add(*, a_shape=(4, 8), bias_shape=(16,), bias_first=False, extra_consumer=False):
    """MatMul(A, B[8,16]) + C; C may come first; the MatMul may feed a second node."""
    rng = np.random.default_rng(4)
    inits = [
        _init("B", rng.standard_normal((8, 16)).astype(np.float32)),
        _init("C", rng.standard_normal(bias_shape).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["A", "B"], ["mm"], name="/fc/MatMul"),
        helper.make_node("Add", ["C", "mm"] if bias_first else ["mm", "C"], ["y"], name="/fc/Add"),
    ]
    outputs = [_f32("y", None)]
    if extra_consumer:
        nodes.append(helper.make_node("Relu", ["mm"], ["side"], name="/side/Relu"))
        outputs.append(_f32("side", None))
    return _basic_model(nodes, [_f32("A", list(a_shape))], outputs, inits)


def reshape_from_shape(*, extra_runtime=False, dims=("batch", "seq", 64)):
    """The exporters' split-heads reshape: x[batch, seq, 64] -> [batch, seq, 4, 16], its target
    built as Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [4], [16]).
    With extra_runtime, the 4 is also computed at run time (from a second input's length)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
        helper.make_node("Gather", ["shape", "i0"], ["d0"], axis=0, name="/Gather0"),
        helper.make_node("Gather", ["shape", "i1"], ["d1"], axis=0, name="/Gather1"),
        helper.make_node("Unsqueeze", ["d0", "axes0"], ["u0"], name="/Unsqueeze0"),
        helper.make_node("Unsqueeze", ["d1", "axes0"], ["u1"], name="/Unsqueeze1"),
    ]
    inputs = [_f32("x", list(dims))]
    pieces = ["u0", "u1", "heads", "size"]
    inits = [
        _init("i0", np.array(0, np.int64)), _init("i1", np.array(1, np.int64)), _init("axes0", np.array([0], np.int64)),
        _init("heads", np.array([4], np.int64)), _init("size", np.array([16], np.int64)),
    ]
    if extra_runtime:
        inputs.append(helper.make_tensor_value_info("h", TensorProto.INT64, ["n"]))
        nodes.append(helper.make_node("Shape", ["h"], ["heads_rt"], name="/ShapeH"))
        pieces[2] = "heads_rt"
        inits[-1] = _init("size", np.array([-1], np.int64))
    nodes += [
        helper.make_node("Concat", pieces, ["target"], axis=0, name="/Concat"),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="/Reshape"),
    ]
    return _basic_model(nodes, inputs, [_f32("y", None)], inits, opset=14)


def constant_subgraph(*, fill_elements=16, random=False):
    """Exporter-style constant arithmetic feeding an Add: Constant -> Cast -> Range -> Unsqueeze,
    Shape of a static tensor -> Gather -> Mul, and a ConstantOfShape fill of `fill_elements`."""
    nodes = [
        helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array(8, np.int64)), name="/Constant"),
        helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT, name="/Cast"),
        helper.make_node("Range", ["zero", "n_f", "one"], ["ramp"], name="/Range"),
        helper.make_node("Unsqueeze", ["ramp", "axes0"], ["ramp2"], name="/Unsqueeze"),
        helper.make_node("Shape", ["x"], ["xs"], name="/Shape"),
        helper.make_node("Gather", ["xs", "i1"], ["cols"], axis=0, name="/Gather"),
        helper.make_node("Cast", ["cols"], ["cols_f"], to=TensorProto.FLOAT, name="/Cast_1"),
        helper.make_node("Div", ["ramp2", "cols_f"], ["scaled"], name="/Div"),
        helper.make_node("Add", ["x", "scaled"], ["y0"], name="/Add"),
        helper.make_node("ConstantOfShape", ["fill_shape"], ["fill"], value=numpy_helper.from_array(np.array([0.5], np.float32)), name="/ConstantOfShape"),
        helper.make_node("ReduceSum", ["fill"], ["fill_sum"], keepdims=0, name="/ReduceSum"),
        helper.make_node("Add", ["y0", "fill_sum"], ["y"], name="/Add_1"),
    ]
    inits = [
        _init("zero", np.array(0.0, np.float32)), _init("one", np.array(1.0, np.float32)),
        _init("axes0", np.array([0], np.int64)), _init("i1", np.array(1, np.int64)),
        _init("fill_shape", np.array([fill_elements], np.int64)),
    ]
    if random:
        nodes.append(helper.make_node("RandomNormal", [], ["noise"], shape=[2, 8], seed=1.0, name="/RandomNormal"))
        nodes.append(helper.make_node("Mul", ["noise", "zero"], ["zeroed"], name="/Mul_noise"))
        nodes[-3] = helper.make_node("Add", ["y0", "fill_sum"], ["y1"], name="/Add_1")
        nodes.append(helper.make_node("Add", ["y1", "zeroed"], ["y"], name="/Add_2"))
    return _basic_model(nodes, [_f32("x", [2, 8])], [_f32("y", [2, 8])], inits)


# --- normalization ---
# LayerNorm / RMSNorm as exporters decompose them, a residual Add before a LayerNormalization,
# and BERT's embedding lookups. Every node of a builder is named "/ln/<Op>" (or "/emb/...") so
# near misses name a predictable anchor; inputs are float "x" (and "skip"), or int64 ids.

NORM_SHAPE = (2, 4, 16)


def _norm_model(nodes, inputs, outputs, initializers, *, opset, extra_outputs=()):
    """`inputs` maps name -> (elem_type, shape); outputs are float of unknown shape."""
    graph = helper.make_graph(
        nodes,
        "normalization",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in [*outputs, *extra_outputs]],
        list(initializers),
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


def _reduce_mean(x, out, name, axes, opset):
    """ReduceMean over `axes`: an attribute before opset 18, a constant input from 18 on."""
    if opset >= 18:
        axes_name = f"{name}/axes"
        node = helper.make_node("ReduceMean", [x, axes_name], [out], name=name)
        return [node], [numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name)]
    return [helper.make_node("ReduceMean", [x], [out], name=name, axes=list(axes))], []


def _variance_tail(x_centered, *, opset, axes, square, exponent, cast_exponent, epsilon, eps_const, divide, prefix):
    """square -> ReduceMean -> Add(eps) -> Sqrt -> Div | Reciprocal+Mul; returns (nodes, inits, normalized)."""
    nodes, inits = [], []
    if square == "mul":
        nodes.append(helper.make_node("Mul", [x_centered, x_centered], [f"{prefix}/Pow_output_0"], name=f"{prefix}/Mul_sq"))
    else:
        exponent_name = f"{prefix}/exponent"
        if cast_exponent:  # the exponent arrives as an int constant cast to float
            inits.append(numpy_helper.from_array(np.array(int(exponent), dtype=np.int64), f"{prefix}/exponent_int"))
            nodes.append(helper.make_node("Cast", [f"{prefix}/exponent_int"], [exponent_name], name=f"{prefix}/Cast_exp", to=TensorProto.FLOAT))
        else:
            inits.append(_scalar(exponent_name, exponent))
        nodes.append(helper.make_node("Pow", [x_centered, exponent_name], [f"{prefix}/Pow_output_0"], name=f"{prefix}/Pow"))
    reduce_nodes, reduce_inits = _reduce_mean(f"{prefix}/Pow_output_0", f"{prefix}/ReduceMean_1_output_0", f"{prefix}/ReduceMean_1", axes, opset)
    nodes += reduce_nodes
    inits += reduce_inits
    if eps_const:
        inits.append(_scalar(f"{prefix}/eps", epsilon))
    nodes += [
        helper.make_node("Add", [f"{prefix}/ReduceMean_1_output_0", f"{prefix}/eps"], [f"{prefix}/Add_output_0"], name=f"{prefix}/Add"),
        helper.make_node("Sqrt", [f"{prefix}/Add_output_0"], [f"{prefix}/Sqrt_output_0"], name=f"{prefix}/Sqrt"),
    ]
    if divide == "div":
        nodes.append(helper.make_node("Div", [x_centered, f"{prefix}/Sqrt_output_0"], [f"{prefix}/Div_output_0"], name=f"{prefix}/Div"))
    elif divide == "div_one":  # torch.rsqrt through TorchScript: Div(1, std), then Mul
        inits.append(_scalar(f"{prefix}/one", 1.0))
        nodes += [
            helper.make_node("Div", [f"{prefix}/one", f"{prefix}/Sqrt_output_0"], [f"{prefix}/Reciprocal_output_0"], name=f"{prefix}/Div"),
            helper.make_node("Mul", [x_centered, f"{prefix}/Reciprocal_output_0"], [f"{prefix}/Div_output_0"], name=f"{prefix}/Mul_rsqrt"),
        ]
    else:
        nodes += [
            helper.make_node("Reciprocal", [f"{prefix}/Sqrt_output_0"], [f"{prefix}/Reciprocal_output_0"], name=f"{prefix}/Reciprocal"),
            helper.make_node("Mul", [x_centered, f"{prefix}/Reciprocal_output_0"], [f"{prefix}/Div_output_0"], name=f"{prefix}/Mul_rsqrt"),
        ]
    return nodes, inits, f"{prefix}/Div_output_0"


def layer_norm(
    *,
    opset=14,
    square="pow",
    exponent=2.0,
    cast_exponent=False,
    divide="div",
    axes=(-1,),
    epsilon=1e-5,
    eps_const=True,
    duplicate_sub=False,
    cast_after_sub=None,
    gamma_shape=(16,),
    extra_outputs=(),
    extra_consumer=None,
):
    """x -> ReduceMean -> Sub -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) -> Add(beta) -> y.

    `eps_const=False` makes the epsilon a graph input; `cast_after_sub` inserts Cast(to=...)
    between Sub and Pow; `extra_consumer` names a value that an extra Neg also reads.
    """
    p = "/ln"
    nodes, inits = _reduce_mean("x", f"{p}/ReduceMean_output_0", f"{p}/ReduceMean", axes, opset)
    nodes.append(helper.make_node("Sub", ["x", f"{p}/ReduceMean_output_0"], [f"{p}/Sub_output_0"], name=f"{p}/Sub"))
    centered = f"{p}/Sub_output_0"
    divided = centered
    if duplicate_sub:  # older PyTorch: a second Sub feeds the Div
        nodes.append(helper.make_node("Sub", ["x", f"{p}/ReduceMean_output_0"], [f"{p}/Sub_1_output_0"], name=f"{p}/Sub_1"))
        divided = f"{p}/Sub_1_output_0"
    squared = centered
    if cast_after_sub is not None:
        nodes.append(helper.make_node("Cast", [centered], [f"{p}/Cast_output_0"], name=f"{p}/Cast", to=cast_after_sub))
        squared = f"{p}/Cast_output_0"
    tail, tail_inits, normalized = _variance_tail(
        squared, opset=opset, axes=axes, square=square, exponent=exponent, cast_exponent=cast_exponent,
        epsilon=epsilon, eps_const=eps_const, divide=divide, prefix=p,
    )
    if divided != squared:  # the Div reads the other copy of x - mean
        for node in tail:
            if node.op_type in ("Div", "Mul") and node.input[0] == squared and node.input[1] != squared:
                node.input[0] = divided
    nodes += tail
    inits += tail_inits
    nodes += [
        helper.make_node("Mul", [normalized, f"{p}/gamma"], [f"{p}/Mul_output_0"], name=f"{p}/Mul"),
        helper.make_node("Add", [f"{p}/Mul_output_0", f"{p}/beta"], ["y"], name=f"{p}/Add_1"),
    ]
    inits += [_vector(f"{p}/gamma", gamma_shape, seed=1), _vector(f"{p}/beta", gamma_shape, seed=2)]
    outputs = ["y"]
    if extra_consumer is not None:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["extra"], name=f"{p}/Neg"))
        outputs.append("extra")
    inputs = {"x": (TensorProto.FLOAT, list(NORM_SHAPE))}
    if not eps_const:
        inputs[f"{p}/eps"] = (TensorProto.FLOAT, [])
    return _norm_model(nodes, inputs, outputs, inits, opset=opset, extra_outputs=extra_outputs)


def rms_norm(*, opset=14, square="pow", exponent=2.0, divide="reciprocal", axes=(-1,), epsilon=1e-6,
             gamma_first=True, extra_outputs=(), extra_consumer=None, cast=False):
    """Llama's RMSNorm: x -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x) -> Mul(gamma) -> y.

    cast: x.to(float32) first, a no-op Cast on float32 data (transformers' LlamaRMSNorm)."""
    p = "/ln"
    nodes = []
    source = "x"
    if cast:
        nodes.append(helper.make_node("Cast", ["x"], [f"{p}/x_f"], name=f"{p}/Cast", to=TensorProto.FLOAT))
        source = f"{p}/x_f"
    tail_nodes, inits, normalized = _variance_tail(
        source, opset=opset, axes=axes, square=square, exponent=exponent, cast_exponent=False,
        epsilon=epsilon, eps_const=True, divide=divide, prefix=p,
    )
    nodes += tail_nodes
    gamma_inputs = [f"{p}/gamma", normalized] if gamma_first else [normalized, f"{p}/gamma"]
    nodes.append(helper.make_node("Mul", gamma_inputs, ["y"], name=f"{p}/Mul"))
    inits.append(_vector(f"{p}/gamma", (16,), seed=3))
    outputs = ["y"]
    if extra_consumer is not None:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["extra"], name=f"{p}/Neg"))
        outputs.append("extra")
    return _norm_model(nodes, {"x": (TensorProto.FLOAT, list(NORM_SHAPE))}, outputs, inits, opset=opset,
                       extra_outputs=extra_outputs)


def skip_layer_norm(*, bias=None, sum_consumed=False, x_shape=NORM_SHAPE, skip_shape=NORM_SHAPE, axis=-1,
                    epsilon=1e-5, opset=17, extra_outputs=(), norm="LayerNormalization"):
    """x + skip [+ bias] -> LayerNormalization('/ln'): `bias` is None, "x" (Add(x, b) first) or "skip".

    norm: "LayerNormalization", or an RMS norm in either form: "SimplifiedLayerNormalization"
    (onnxruntime's, ONNX domain) or "RMSNormalization" (opset 23); those take no beta.

    `sum_consumed` adds the next residual: Add(ln_out, residual sum), as in GPT-2's pre-LN blocks.
    """
    nodes, inits = [], [_vector("/ln/gamma", (16,), seed=4), _vector("/ln/beta", (16,), seed=5)]
    x, skip = "x", "skip"
    if bias is not None:
        inits.append(_vector("/ln/bias", (16,), seed=6))
        biased = {"x": x, "skip": skip}[bias]
        nodes.append(helper.make_node("Add", ["/ln/bias", biased], ["/ln/biased"], name="/ln/BiasAdd"))
        x, skip = ("/ln/biased", skip) if bias == "x" else (x, "/ln/biased")
    nodes += [
        helper.make_node("Add", [x, skip], ["/ln/residual"], name="/ln/ResidualAdd"),
        helper.make_node(norm, ["/ln/residual", "/ln/gamma", "/ln/beta"][:3 if norm == "LayerNormalization" else 2],
                         ["y"], name="/ln", axis=axis, epsilon=epsilon),
    ]
    outputs = ["y"]
    if sum_consumed:
        nodes.append(helper.make_node("Add", ["y", "/ln/residual"], ["next"], name="/next/ResidualAdd"))
        outputs = ["next"]
    inputs = {"x": (TensorProto.FLOAT, list(x_shape)), "skip": (TensorProto.FLOAT, list(skip_shape))}
    return _norm_model(nodes, inputs, outputs, inits, opset=opset, extra_outputs=extra_outputs)


def decomposed_skip_layer_norm(*, opset=14):
    """Residual Add -> decomposed LayerNorm (opset 14): LayerNormFusion first, then SkipLayerNormFusion."""
    model = layer_norm(opset=opset)
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == "x":
                node.input[i] = "/ln/residual"
    graph.node.insert(0, helper.make_node("Add", ["x", "skip"], ["/ln/residual"], name="/ln/ResidualAdd"))
    graph.input.append(helper.make_tensor_value_info("skip", TensorProto.FLOAT, list(NORM_SHAPE)))
    return model


EMB_BATCH, EMB_SEQ, EMB_HIDDEN, EMB_VOCAB, EMB_POSITIONS = 2, 6, 16, 30, 12


def embed_layer_norm(*, segment=True, position="slice", attention=True, sum_consumed=False, gather_axis=0,
                     opset=17, rotary=None):
    """BERT's embeddings: word + segment + position lookups -> Add -> Add -> LayerNormalization -> Attention.

    `rotary` (with attention="onnx"): None, "onnx" or "com.microsoft": Q and K pass a RotaryEmbedding.
    `segment`: True (a token_type_ids input), False (DistilBERT) or "buffer" (BERT called without
    token_type_ids: all-zero ids from a buffer, picked by position and expanded to the batch).
    `position`: "slice" (today's exporters: Slice of a [1, P] position_ids buffer to the
    sequence length of input_ids), "constant" (a [1, S] constant 0..S-1), "range" (Range(0, seq)
    expanded to the shape of input_ids, as 2020-era exports built them), "nonzero" (the same count as
    NonZero(ConstantOfShape([S], 1)), PyTorch's arange below opset 11; "nonzero_of_zeros" with
    ConstantOfShape's default 0, which counts nothing), or "input" (a third
    graph input, so position and segment ids can't be told apart). The Attention is
    com.microsoft.Attention, as AttentionFusion leaves it.
    """
    rng = np.random.default_rng(7)
    table = lambda rows, name: numpy_helper.from_array(rng.standard_normal((rows, EMB_HIDDEN)).astype(np.float32), name)  # noqa: E731
    inits = [table(EMB_VOCAB, "/emb/word"), table(EMB_POSITIONS, "/emb/position"),
             _vector("/emb/ln/gamma", (EMB_HIDDEN,), seed=8), _vector("/emb/ln/beta", (EMB_HIDDEN,), seed=9)]
    ids_type = (TensorProto.INT64, ["batch", "seq"])
    inputs = {"input_ids": ids_type}
    nodes = [helper.make_node("Gather", ["/emb/word", "input_ids"], ["/emb/word_out"], name="/emb/word/Gather", axis=gather_axis)]
    if position == "slice":
        inits += [
            numpy_helper.from_array(np.arange(EMB_POSITIONS, dtype=np.int64).reshape(1, -1), "/emb/position_ids"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "/emb/zero"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "/emb/one"),
        ]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["/emb/shape"], name="/emb/Shape", start=1, end=2),
            helper.make_node("Slice", ["/emb/position_ids", "/emb/zero", "/emb/shape", "/emb/one"], ["/emb/pos_ids"], name="/emb/Slice"),
        ]
        position_ids = "/emb/pos_ids"
    elif position == "range":  # 2020-era exports: Range(0, seq) expanded to the ids' shape
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("/emb/r_start", 0), ("/emb/r_step", 1), ("/emb/r_one", 1))]
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "/emb/r_axes"))
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["/emb/ids_shape_r"], name="/emb/r/Shape"),
            helper.make_node("Gather", ["/emb/ids_shape_r", "/emb/r_one"], ["/emb/seq_len"], name="/emb/r/Gather", axis=0),
            helper.make_node("Range", ["/emb/r_start", "/emb/seq_len", "/emb/r_step"], ["/emb/range"], name="/emb/r/Range"),
            helper.make_node("Unsqueeze", ["/emb/range", "/emb/r_axes"], ["/emb/range_row"], name="/emb/r/Unsqueeze"),
            helper.make_node("Expand", ["/emb/range_row", "/emb/ids_shape_r"], ["/emb/pos_ids"], name="/emb/r/Expand"),
        ]
        position_ids = "/emb/pos_ids"
    elif position in ("nonzero", "nonzero_of_zeros"):  # PyTorch's arange below opset 11: NonZero of S ones
        fill = numpy_helper.from_array(np.array([1 if position == "nonzero" else 0], np.int64), "value")
        inits += [numpy_helper.from_array(np.array(1, np.int64), "/emb/n_one"),
                  numpy_helper.from_array(np.array([0], np.int64), "/emb/n_axes0"),
                  numpy_helper.from_array(np.array([1], np.int64), "/emb/n_axes1")]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["/emb/ids_shape_n"], name="/emb/n/Shape"),
            helper.make_node("Gather", ["/emb/ids_shape_n", "/emb/n_one"], ["/emb/n_seq"], name="/emb/n/Gather", axis=0),
            helper.make_node("Unsqueeze", ["/emb/n_seq", "/emb/n_axes0"], ["/emb/n_seq_1d"], name="/emb/n/Unsqueeze"),
            helper.make_node("ConstantOfShape", ["/emb/n_seq_1d"], ["/emb/n_ones"], name="/emb/n/ConstantOfShape",
                             value=fill),
            helper.make_node("NonZero", ["/emb/n_ones"], ["/emb/n_nonzero"], name="/emb/n/NonZero"),
            helper.make_node("Transpose", ["/emb/n_nonzero"], ["/emb/n_t"], name="/emb/n/Transpose", perm=[1, 0]),
            helper.make_node("Squeeze", ["/emb/n_t", "/emb/n_axes1"], ["/emb/n_range"], name="/emb/n/Squeeze"),
            helper.make_node("Unsqueeze", ["/emb/n_range", "/emb/n_axes0"], ["/emb/n_row"], name="/emb/n/Unsqueeze_1"),
            helper.make_node("Expand", ["/emb/n_row", "/emb/ids_shape_n"], ["/emb/pos_ids"], name="/emb/n/Expand"),
        ]
        position_ids = "/emb/pos_ids"
    elif position == "constant":
        inits.append(numpy_helper.from_array(np.arange(EMB_SEQ, dtype=np.int64).reshape(1, -1), "/emb/pos_ids"))
        inputs["input_ids"] = (TensorProto.INT64, [EMB_BATCH, EMB_SEQ])
        ids_type = (TensorProto.INT64, [EMB_BATCH, EMB_SEQ])
        position_ids = "/emb/pos_ids"
    else:
        inputs["position_ids"] = (TensorProto.INT64, [1, "seq"])
        position_ids = "position_ids"
    nodes.append(helper.make_node("Gather", ["/emb/position", position_ids], ["/emb/pos_out"], name="/emb/position/Gather"))
    first_sum = "/emb/word_out"
    if segment:
        inits.append(table(2, "/emb/segment"))
        segment_ids = "token_type_ids"
        if segment == "buffer":  # called without token_type_ids: a zeros buffer expanded to the batch
            inits.append(numpy_helper.from_array(np.zeros((1, EMB_POSITIONS), np.int64), "/emb/token_type_buffer"))
            nodes += [
                helper.make_node("Shape", ["input_ids"], ["/emb/ids_shape"], name="/emb/ids/Shape"),
                helper.make_node("GatherElements", ["/emb/token_type_buffer", position_ids], ["/emb/type_row"],
                                 name="/emb/type/GatherElements", axis=1),
                helper.make_node("Expand", ["/emb/type_row", "/emb/ids_shape"], ["/emb/type_ids"], name="/emb/type/Expand"),
            ]
            segment_ids = "/emb/type_ids"
        else:
            inputs["token_type_ids"] = ids_type
        nodes += [
            helper.make_node("Gather", ["/emb/segment", segment_ids], ["/emb/seg_out"], name="/emb/segment/Gather"),
            helper.make_node("Add", ["/emb/word_out", "/emb/seg_out"], ["/emb/Add_output_0"], name="/emb/Add"),
        ]
        first_sum = "/emb/Add_output_0"
    nodes += [
        helper.make_node("Add", [first_sum, "/emb/pos_out"], ["/emb/Add_1_output_0"], name="/emb/Add_1"),
        helper.make_node("LayerNormalization", ["/emb/Add_1_output_0", "/emb/ln/gamma", "/emb/ln/beta"], ["/emb/ln_out"],
                         name="/emb/LayerNorm", axis=-1, epsilon=1e-12),
    ]
    outputs = ["/emb/ln_out"]
    if attention == "onnx":  # the standard Attention of opset 23 on 3-D projections of the LayerNorm output
        for p in "qkv":
            inits.append(numpy_helper.from_array(rng.standard_normal((EMB_HIDDEN, EMB_HIDDEN)).astype(np.float32) * 0.2,
                                                 f"/attn/{p}_weight"))
            nodes.append(helper.make_node("MatMul", ["/emb/ln_out", f"/attn/{p}_weight"], [f"/attn/{p}"], name=f"/attn/{p}/MatMul"))
        q = k = None
        if rotary:  # Q and K rotated by RoPE in either form: ONNX's (opset 23) or com.microsoft's
            angles = np.arange(EMB_POSITIONS)[:, None] * (1.0 / 10000 ** (np.arange(0, 8, 2) / 8))[None, :]
            inits += [numpy_helper.from_array(np.cos(angles).astype(np.float32), "/rope/cos"),
                      numpy_helper.from_array(np.sin(angles).astype(np.float32), "/rope/sin")]
            inputs["position_ids"] = (TensorProto.INT64, ["batch", "seq"])
            for p in "qk":
                if rotary == "onnx":
                    rope_inputs, domain = [f"/attn/{p}", "/rope/cos", "/rope/sin", "position_ids"], ""
                else:
                    rope_inputs, domain = [f"/attn/{p}", "position_ids", "/rope/cos", "/rope/sin"], "com.microsoft"
                nodes.append(helper.make_node("RotaryEmbedding", rope_inputs, [f"/attn/{p}_rot"], name=f"/attn/{p}/Rotary",
                                              domain=domain, num_heads=2))
            q, k = "/attn/q_rot", "/attn/k_rot"
        nodes.append(helper.make_node("Attention", [q or "/attn/q", k or "/attn/k", "/attn/v"], ["attn_out"],
                                      name="/attn/Attention", q_num_heads=2, kv_num_heads=2))
        outputs = ["attn_out"]
    elif attention:
        inits += [
            numpy_helper.from_array(rng.standard_normal((EMB_HIDDEN, 3 * EMB_HIDDEN)).astype(np.float32) * 0.2, "/attn/qkv_weight"),
            numpy_helper.from_array(rng.standard_normal(3 * EMB_HIDDEN).astype(np.float32) * 0.2, "/attn/qkv_bias"),
        ]
        nodes.append(helper.make_node("Attention", ["/emb/ln_out", "/attn/qkv_weight", "/attn/qkv_bias"], ["attn_out"],
                                      name="/attn/Attention", domain="com.microsoft", num_heads=2))
        outputs = ["attn_out"]
    if sum_consumed:
        nodes.append(helper.make_node("Add", [outputs[0], "/emb/Add_1_output_0"], ["residual_out"], name="/next/ResidualAdd"))
        outputs = ["residual_out"]
    return _norm_model(nodes, inputs, outputs, inits, opset=opset)
