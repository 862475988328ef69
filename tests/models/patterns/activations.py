"""The GELU family as exporters decompose it, and activations fused into Gemm and Conv."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.models.patterns.parts import float_model, mul, scalar, vector

SQRT2 = math.sqrt(2.0)


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
    nodes, inits = [], [scalar("/mlp/half", 0.5), scalar("/mlp/one", one)]
    x = "x"
    if bias:
        inits.append(vector("/mlp/b", bias_shape))
        nodes.append(helper.make_node("Add", ["/mlp/b", "x"] if commute else ["x", "/mlp/b"], ["/mlp/Add_output_0"], name="/mlp/Add"))
        x = "/mlp/Add_output_0"
    if scale == "div":
        inits.append(scalar("/mlp/sqrt2", divisor))
        nodes.append(helper.make_node("Div", [x, "/mlp/sqrt2"], ["/mlp/scaled"], name="/mlp/Div"))
    else:
        inits.append(scalar("/mlp/rsqrt2", 1.0 / divisor))
        nodes.append(mul(x, "/mlp/rsqrt2", "/mlp/scaled", "/mlp/Mul_scale", commute))
    nodes.append(helper.make_node("Erf", ["/mlp/scaled"], ["/mlp/erf"], name="/mlp/Erf"))
    add_inputs = ["/mlp/one", "/mlp/erf"] if commute else ["/mlp/erf", "/mlp/one"]
    nodes.append(helper.make_node("Add", add_inputs, ["/mlp/bracket"], name="/mlp/Add_1"))
    if half == "last":
        nodes.append(mul(x, "/mlp/bracket", "/mlp/xb", "/mlp/Mul", commute))
        nodes.append(mul("/mlp/xb", "/mlp/half", "y", "/mlp/Mul_1", commute))
    elif half == "first":
        nodes.append(mul(x, "/mlp/half", "/mlp/halfx", "/mlp/Mul", commute))
        nodes.append(mul("/mlp/halfx", "/mlp/bracket", "y", "/mlp/Mul_1", commute))
    else:
        nodes.append(mul("/mlp/bracket", "/mlp/half", "/mlp/halfb", "/mlp/Mul", commute))
        nodes.append(mul(x, "/mlp/halfb", "y", "/mlp/Mul_1", commute))
    outputs = {"y": [2, 4, 16]}
    if extra_consumer:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["extra"], name="/other/Neg"))
        outputs["extra"] = [2, 4, 16]
    return float_model(nodes, {"x": [2, 4, 16]}, outputs, inits, opset=opset, extra_outputs=extra_outputs)


def tanh_gelu(*, cube="pow", half="first", commute=False, coefficient=0.044715, multiplier=None, bias=False):
    """GPT-2's gelu_new: 0.5 * x * (1 + Tanh(√(2/π) * (x + 0.044715 * x³))) on x [2, 4, 16].

    cube: "pow" Pow(x, 3) | "square_first" Mul(Mul(x, x), x) | "square_last" Mul(x, Mul(x, x)).
    """
    multiplier = math.sqrt(2.0 / math.pi) if multiplier is None else multiplier
    inits = [
        scalar("/act/half", 0.5), scalar("/act/one", 1.0), scalar("/act/three", 3.0),
        scalar("/act/coef", coefficient), scalar("/act/k", multiplier),
    ]
    nodes = []
    x = "x"
    if bias:
        inits.append(vector("/mlp/b", (16,)))
        nodes.append(helper.make_node("Add", ["x", "/mlp/b"], ["/mlp/Add_output_0"], name="/mlp/Add"))
        x = "/mlp/Add_output_0"
    if cube == "pow":
        nodes.append(helper.make_node("Pow", [x, "/act/three"], ["/act/cube"], name="/act/Pow"))
    else:
        nodes.append(helper.make_node("Mul", [x, x], ["/act/square"], name="/act/Mul_sq"))
        pair = ["/act/square", x] if cube == "square_first" else [x, "/act/square"]
        nodes.append(helper.make_node("Mul", pair, ["/act/cube"], name="/act/Mul_cube"))
    nodes += [
        mul("/act/cube", "/act/coef", "/act/term", "/act/Mul_coef", commute),
        helper.make_node("Add", ["/act/term", x] if commute else [x, "/act/term"], ["/act/inner"], name="/act/Add"),
        mul("/act/inner", "/act/k", "/act/scaled", "/act/Mul_k", commute),
        helper.make_node("Tanh", ["/act/scaled"], ["/act/tanh"], name="/act/Tanh"),
        helper.make_node("Add", ["/act/tanh", "/act/one"], ["/act/bracket"], name="/act/Add_1"),
    ]
    if half == "first":
        nodes.append(mul(x, "/act/half", "/act/halfx", "/act/Mul_half", commute))
        nodes.append(mul("/act/halfx", "/act/bracket", "y", "/act/Mul_out", commute))
    else:
        nodes.append(mul(x, "/act/bracket", "/act/xb", "/act/Mul_x", commute))
        nodes.append(mul("/act/xb", "/act/half", "y", "/act/Mul_out", commute))
    return float_model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits)


def factored_tanh_gelu(*, square="nested", commute=False, casts=False, coefficient=0.044715):
    """0.5·x·(1 + Tanh((√(2/π)·x) · (1 + 0.044715·x·x))) on x [2, 4, 16], as Megatron writes it.

    square: "nested" x·(x·0.044715) | "square" (x·x)·0.044715.
    casts: x reaches the cube term and the 0.5·x end through float→float Casts (mixed-precision
    exports; ONNX Runtime's fast_gelu3_with_casts.onnx).
    """
    inits = [scalar("/act/half", 0.5), scalar("/act/one", 1.0), scalar("/act/coef", coefficient),
             scalar("/act/k", math.sqrt(2.0 / math.pi))]
    nodes = []
    x = x_end = "x"
    if casts:
        nodes.append(helper.make_node("Cast", ["x"], ["/act/x_f"], name="/act/Cast", to=TensorProto.FLOAT))
        x = "/act/x_f"
    if square == "nested":
        nodes += [mul(x, "/act/coef", "/act/cx", "/act/Mul_c", commute), mul(x, "/act/cx", "/act/term", "/act/Mul_sq", commute)]
    else:
        nodes += [mul(x, x, "/act/sq", "/act/Mul_sq", commute), mul("/act/sq", "/act/coef", "/act/term", "/act/Mul_c", commute)]
    nodes += [
        helper.make_node("Add", ["/act/one", "/act/term"] if commute else ["/act/term", "/act/one"], ["/act/br"], name="/act/Add"),
        mul(x, "/act/k", "/act/kx", "/act/Mul_k", commute),
        mul("/act/kx", "/act/br", "/act/scaled", "/act/Mul_arg", commute),
        helper.make_node("Tanh", ["/act/scaled"], ["/act/tanh"], name="/act/Tanh"),
        helper.make_node("Add", ["/act/tanh", "/act/one"], ["/act/bracket"], name="/act/Add_1"),
        mul(x_end, "/act/half", "/act/halfx", "/act/Mul_half", commute),
    ]
    half = "/act/halfx"
    if casts:
        nodes.append(helper.make_node("Cast", [half], ["/act/halfx_f"], name="/act/Cast_half", to=TensorProto.FLOAT))
        half = "/act/halfx_f"
    nodes.append(mul(half, "/act/bracket", "y", "/act/Mul_out", commute))
    return float_model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits)


def quick_gelu(*, alpha=1.702, commute=False, alpha_shape=()):
    """x * Sigmoid(alpha * x) on x [2, 4, 16]; alpha=None gives SiLU, x * Sigmoid(x)."""
    nodes, inits = [], []
    gated = "x"
    if alpha is not None:
        inits.append(numpy_helper.from_array(np.full(alpha_shape, alpha, np.float32), "/act/alpha"))
        nodes.append(mul("x", "/act/alpha", "/act/ax", "/act/Mul", commute))
        gated = "/act/ax"
    nodes.append(helper.make_node("Sigmoid", [gated], ["/act/sig"], name="/act/Sigmoid"))
    nodes.append(mul("x", "/act/sig", "y", "/act/Mul_1", commute))
    return float_model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits)


def sigmoid_gate():
    """x * Sigmoid(g): a gate, not a GELU (QuickGeluFusion leaves it alone, silently)."""
    nodes = [
        helper.make_node("Sigmoid", ["g"], ["/gate/sig"], name="/gate/Sigmoid"),
        helper.make_node("Mul", ["x", "/gate/sig"], ["y"], name="/gate/Mul"),
    ]
    return float_model(nodes, {"x": [2, 16], "g": [2, 16]}, {"y": [2, 16]})


def add_then_gelu(*, gelu_domain="", opset=20, approximate=None, bias_shape=(16,), bias_side=1, extra_outputs=()):
    """Add(x, '/mlp/b') -> Gelu, the Gelu in either domain (ONNX Gelu needs opset >= 20)."""
    attrs = {} if approximate is None else {"approximate": approximate}
    add_inputs = ["x", "/mlp/b"] if bias_side == 1 else ["/mlp/b", "x"]
    nodes = [
        helper.make_node("Add", add_inputs, ["/mlp/Add_output_0"], name="/mlp/Add"),
        helper.make_node("Gelu", ["/mlp/Add_output_0"], ["y"], name="/mlp/Gelu", domain=gelu_domain, **attrs),
    ]
    return float_model(
        nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, [vector("/mlp/b", bias_shape)],
        opset=opset, extra_outputs=extra_outputs,
    )


def gelu_alone(*, gelu_domain="com.microsoft", opset=14, bias=False, approximate=None):
    """A single Gelu (or BiasGelu with bias=True) on x [2, 4, 16], for GeluApproximation."""
    attrs = {} if approximate is None else {"approximate": approximate}
    if bias:
        node = helper.make_node("BiasGelu", ["x", "/mlp/b"], ["y"], name="/mlp/BiasGelu", domain="com.microsoft")
        inits = [vector("/mlp/b", (16,))]
    else:
        node = helper.make_node("Gelu", ["x"], ["y"], name="/mlp/Gelu", domain=gelu_domain, **attrs)
        inits = []
    return float_model([node], {"x": [2, 4, 16]}, {"y": [2, 4, 16]}, inits, opset=opset)


def gemm_activation(activation, *, attrs=None, trans_b=1, extra_consumer=False, opset=14):
    """Gemm(a [4, 8], W, C) -> activation, W stored [16, 8] when trans_b else [8, 16]."""
    rng = np.random.default_rng(1)
    w_shape = (16, 8) if trans_b else (8, 16)
    inits = [
        numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "/fc/W"),
        vector("/fc/C", (16,), seed=2),
    ]
    nodes = [
        helper.make_node("Gemm", ["a", "/fc/W", "/fc/C"], ["/fc/gemm"], name="/fc/Gemm", alpha=0.5, beta=2.0, transB=trans_b),
        helper.make_node(activation, ["/fc/gemm"], ["y"], name=f"/fc/{activation}", **(attrs or {})),
    ]
    outputs = {"y": [4, 16]}
    if extra_consumer:
        nodes.append(helper.make_node("Neg", ["/fc/gemm"], ["extra"], name="/other/Neg"))
        outputs["extra"] = [4, 16]
    return float_model(nodes, {"a": [4, 8]}, outputs, inits, opset=opset)


def conv_activation(activation, *, attrs=None, clip=None, clip_dynamic=False, opset=17):
    """Conv(x [1, 3, 8, 8], W [4, 3, 3, 3], B, pads 1) -> activation.

    clip: (min, max) constants as Clip inputs (opset >= 11) or attributes (opset < 11),
    None for either leaves it out. clip_dynamic makes max a graph input.
    """
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "/conv/W"),
        vector("/conv/B", (4,), seed=4),
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
            inits.append(scalar("/conv/min", lo))
        if clip_dynamic:
            act_inputs.append("clip_max")
            inputs["clip_max"] = []
        elif hi is not None:
            act_inputs.append("/conv/max")
            inits.append(scalar("/conv/max", hi))
    nodes = [
        helper.make_node("Conv", ["x", "/conv/W", "/conv/B"], ["/conv/out"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node(activation, act_inputs, ["y"], name=f"/conv/{activation}", **attrs),
    ]
    return float_model(nodes, inputs, {"y": [1, 4, 8, 8]}, inits, opset=opset)



def matmul_add_gelu(*, gelu_domain="", opset=20):
    """MatMul(x, W) -> Add('/mlp/b') -> Gelu: BiasGelu must claim the Add before MatMul+Add -> Gemm."""
    rng = np.random.default_rng(6)
    nodes = [
        helper.make_node("MatMul", ["x", "/mlp/W"], ["/mlp/mm"], name="/mlp/MatMul"),
        helper.make_node("Add", ["/mlp/mm", "/mlp/b"], ["/mlp/Add_output_0"], name="/mlp/Add"),
        helper.make_node("Gelu", ["/mlp/Add_output_0"], ["y"], name="/mlp/Gelu", domain=gelu_domain),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "/mlp/W"), vector("/mlp/b", (16,))]
    return float_model(nodes, {"x": [4, 8]}, {"y": [4, 16]}, inits, opset=opset)
