"""The contrib (fused) kernels against onnxruntime running the same one-node model.

ONNX Runtime defines these ops, so it is the oracle: every case builds a single node with
onnx.helper, runs it in ORT with graph optimizations off, and runs our kernel (found through the
registry, as the executor will) on the same feeds. fp32 tolerances rtol 1e-3, atol 1e-4.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runtime.kernels import compiled, contrib_attention, gemm
from runtime.kernels.registry import find_kernel

MS = "com.microsoft"
ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-3, 1e-4
OPSETS = {"": 17, MS: 1}
_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}


def one_node_model(op_type, inputs, outputs, domain=MS, **attrs):
    """A model of one node; `inputs` maps name -> array or None (omitted optional input, name "")."""
    input_names = [name if value is not None else "" for name, value in inputs.items()]
    while input_names and input_names[-1] == "":
        input_names.pop()
    node = helper.make_node(op_type, input_names, [name or "" for name, _ in outputs], domain=domain, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(name, _NP_TO_ONNX[value.dtype], value.shape)
        for name, value in inputs.items()
        if value is not None
    ]
    graph_outputs = [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs if name]
    graph = helper.make_graph([node], "one_node", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid(d, v) for d, v in OPSETS.items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_ort(model, inputs):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {name: value for name, value in inputs.items() if value is not None}
    return session.run(None, feeds)


def run_ours(model, inputs):
    node = ir.from_proto(model).graph[0]
    kernel_class = find_kernel(node.domain, node.op_type, OPSETS[node.domain])
    assert kernel_class is not None, f"no kernel registered for {node.domain}.{node.op_type}"
    kernel = kernel_class(node, OPSETS[node.domain])
    args = [inputs[value.name] if value is not None and value.name else None for value in node.inputs]
    results = kernel.run(*args)
    return [result for result, value in zip(results, node.outputs, strict=False) if value.name]


def check(op_type, inputs, outputs=(("Y", TensorProto.FLOAT),), domain=MS, rtol=RTOL, atol=ATOL, **attrs):
    """Run both and compare every requested output; returns ours for extra assertions."""
    model = one_node_model(op_type, inputs, list(outputs), domain=domain, **attrs)
    expected = run_ort(model, inputs)
    ours = run_ours(model, inputs)
    assert len(ours) == len(expected)
    for name, want, got in zip([n for n, _ in outputs if n], expected, ours, strict=True):
        got = np.asarray(got)
        assert got.dtype == want.dtype, f"{op_type} output {name}: dtype {got.dtype}, ORT {want.dtype}"
        assert got.shape == want.shape, f"{op_type} output {name}: shape {got.shape}, ORT {want.shape}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{op_type} output {name}")
    return ours


def rand(*shape, scale=1.0, seed=0):
    return (np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- activations


def test_gelu():
    check("Gelu", {"X": rand(2, 16, 64, scale=3)})


def test_bias_gelu():
    check(
        "BiasGelu", {"A": rand(2, 16, 64, scale=3), "B": rand(64, seed=1)}, outputs=[("C", TensorProto.FLOAT)]
    )


@pytest.mark.parametrize("with_bias", [True, False])
def test_fast_gelu(with_bias):
    check("FastGelu", {"X": rand(2, 16, 64, scale=3), "bias": rand(64, seed=2) if with_bias else None})


@pytest.mark.parametrize("alpha", [None, 1.0, -0.5])
def test_quick_gelu(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    x = rand(4, 32, scale=40)  # large |x| drives exp to overflow on one side
    check("QuickGelu", {"X": x}, **attrs)


def test_gelu_inputs_are_not_modified():
    x, b = rand(3, 8), rand(8, seed=3)
    x_copy, b_copy = x.copy(), b.copy()
    for op, inputs in [
        ("Gelu", {"X": x}),
        ("BiasGelu", {"A": x, "B": b}),
        ("FastGelu", {"X": x}),
        ("QuickGelu", {"X": x}),
    ]:
        run_ours(one_node_model(op, inputs, [("Y", TensorProto.FLOAT)]), inputs)
    np.testing.assert_array_equal(x, x_copy)
    np.testing.assert_array_equal(b, b_copy)


# ---------------------------------------------------------------- normalization

F, I32 = TensorProto.FLOAT, TensorProto.INT32
SKIP_OUTPUTS = [("Y", F), ("mean", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]


@pytest.mark.parametrize("skip_shape", [(2, 16, 64), (1, 16, 64), (16, 64)])
@pytest.mark.parametrize("with_beta", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_skip_layer_normalization(skip_shape, with_beta, with_bias):
    inputs = {
        "input": rand(2, 16, 64, scale=2),
        "skip": rand(*skip_shape, seed=1),
        "gamma": rand(64, seed=2),
        "beta": rand(64, seed=3) if with_beta else None,
        "bias": rand(64, seed=4) if with_bias else None,
    }
    check("SkipLayerNormalization", inputs, outputs=SKIP_OUTPUTS, epsilon=1e-5)


@pytest.mark.parametrize("outputs", [SKIP_OUTPUTS[:1], [SKIP_OUTPUTS[0], ("", F), ("", F), SKIP_OUTPUTS[3]]])
def test_skip_layer_normalization_optional_outputs(outputs):
    inputs = {"input": rand(1, 8, 32), "skip": rand(1, 8, 32, seed=1), "gamma": rand(32, seed=2)}
    check("SkipLayerNormalization", inputs, outputs=outputs)  # default epsilon 1e-12


@pytest.mark.parametrize("with_bias", [True, False])
def test_skip_simplified_layer_normalization(with_bias):
    inputs = {
        "input": rand(2, 16, 64, scale=2),
        "skip": rand(2, 16, 64, seed=1),
        "gamma": rand(64, seed=2),
        "bias": rand(64, seed=4) if with_bias else None,
    }
    outputs = [("Y", F), ("", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]
    check("SkipSimplifiedLayerNormalization", inputs, outputs=outputs, epsilon=1e-6)


@pytest.mark.parametrize("axis", [-1, 2, 1])
def test_simplified_layer_normalization(axis):
    x = rand(2, 3, 4, 6, scale=3)
    inputs = {"X": x, "scale": rand(*x.shape[axis:], seed=5)}
    check(
        "SimplifiedLayerNormalization", inputs, outputs=[("Y", F), ("inv_std_var", F)], domain="", axis=axis
    )


def test_simplified_layer_normalization_default_attributes():
    inputs = {"X": rand(2, 8, 16), "scale": rand(16, seed=5)}
    check("SimplifiedLayerNormalization", inputs, domain="")


def _embed_inputs(mask=True, segment=True, position_ids_shape=None, batch=2, seq=5, hidden=8, vocab=20):
    rng = np.random.default_rng(7)
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
        "segment_ids": rng.integers(0, 2, (batch, seq)).astype(np.int32) if segment else None,
        "word_embedding": rand(vocab, hidden),
        "position_embedding": rand(16, hidden, seed=1),
        "segment_embedding": rand(2, hidden, seed=2) if segment else None,
        "gamma": rand(hidden, seed=3),
        "beta": rand(hidden, seed=4),
        "mask": np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.int32) if mask else None,
        "position_ids": (
            rng.integers(0, 16, position_ids_shape).astype(np.int32) if position_ids_shape else None
        ),
    }


@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("segment", [True, False])
@pytest.mark.parametrize("position_ids_shape", [None, (2, 5), (1, 5)])
def test_embed_layer_normalization(mask, segment, position_ids_shape):
    inputs = _embed_inputs(mask, segment, position_ids_shape)
    outputs = [("output", F), ("mask_index", I32), ("embedding_sum", F)]
    check("EmbedLayerNormalization", inputs, outputs=outputs, epsilon=1e-5)


def test_embed_layer_normalization_rejects_out_of_range_ids():
    inputs = _embed_inputs()
    inputs["input_ids"][1, 2] = 20
    model = one_node_model("EmbedLayerNormalization", inputs, [("output", F), ("mask_index", I32)])
    with pytest.raises(ValueError, match=r"input_ids out of range \[0, 20\)"):
        run_ours(model, inputs)


# ---------------------------------------------------------------- attention

BATCH, SEQ, HIDDEN, HEADS = 2, 6, 16, 4


def _masks(batch=BATCH, seq=SEQ, past=0):
    """Every mask_index format ORT's CPU Attention takes, keyed by a readable name."""
    total = past + seq
    lengths = np.array([total - 2, total], np.int32)
    raw = (np.arange(total)[None, :] < lengths[:, None]).astype(np.int32)
    raw[1, 1] = 0  # a hole, which key lengths can't express
    three_d = np.repeat(raw[:, None, :], seq, axis=1)
    three_d[0, 0, :] = 0
    three_d[0, 0, 0] = 1
    return {
        "none": None,
        "1d_lengths": lengths,
        "1d_end_start": np.array([total - 1, total, 1, 2], np.int32),
        "2d_raw": raw,
        "2d_dummy": np.ones((batch, 1), np.int32),
        "3d": three_d.astype(np.int32),
    }


@pytest.mark.parametrize("mask_name", list(_masks()))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask_name, unidirectional):
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": _masks()[mask_name],
    }
    check("Attention", inputs, num_heads=HEADS, unidirectional=unidirectional)


@pytest.mark.parametrize(
    "variant", ["no_bias", "scale", "qkv_hidden_sizes", "attention_bias", "filter_value"]
)
def test_attention_attributes(variant):
    dv = 8 if variant == "qkv_hidden_sizes" else HIDDEN
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 2 * HIDDEN + dv, scale=0.5, seed=1),
        "bias": None if variant == "no_bias" else rand(2 * HIDDEN + dv, seed=2),
        "mask_index": _masks()["2d_raw"],
        "past": None,
        "attention_bias": rand(1, HEADS, SEQ, SEQ, seed=3) if variant == "attention_bias" else None,
    }
    attrs = {"num_heads": HEADS}
    if variant == "scale":
        attrs["scale"] = 0.3
    if variant == "qkv_hidden_sizes":
        attrs["qkv_hidden_sizes"] = [HIDDEN, HIDDEN, dv]
    if variant == "filter_value":
        attrs["mask_filter_value"] = -1e4 / 3
    check("Attention", inputs, **attrs)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("with_past", [True, False])
def test_attention_past_and_present(unidirectional, with_past):
    past_len = 3 if with_past else 0
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": _masks(past=past_len)["2d_raw"],
        "past": rand(2, BATCH, HEADS, past_len, HIDDEN // HEADS, seed=4) if with_past else None,
    }
    check(
        "Attention",
        inputs,
        outputs=[("Y", F), ("present", F)],
        num_heads=HEADS,
        unidirectional=unidirectional,
    )


def test_attention_4d_mask_matches_the_3d_mask_it_slices():
    """ORT's CPU kernel refuses 4-D (Megatron) masks, so the oracle is ORT on the equivalent 3-D mask."""
    past_len, max_len = 2, 12
    four_d = (np.random.default_rng(3).random((BATCH, 1, max_len, max_len)) > 0.3).astype(np.int32)
    four_d[:, :, :, 0] = 1
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": four_d,
        "past": rand(2, BATCH, HEADS, past_len, HIDDEN // HEADS, seed=4),
    }
    outputs = [("Y", F), ("present", F)]  # ORT requires present whenever past is given
    ours = run_ours(one_node_model("Attention", inputs, outputs, num_heads=HEADS), inputs)
    inputs_3d = dict(
        inputs, mask_index=np.ascontiguousarray(four_d[:, 0, past_len : past_len + SEQ, : past_len + SEQ])
    )
    expected = run_ort(one_node_model("Attention", inputs_3d, outputs, num_heads=HEADS), inputs_3d)
    for got, want in zip(ours, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_attention_rejects_bad_mask_shape():
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": np.ones((BATCH, SEQ + 1), np.int32),
    }
    model = one_node_model("Attention", inputs, [("Y", F)], num_heads=HEADS)
    with pytest.raises(ValueError, match=r"Attention '.*': 2-D mask has shape \(2, 7\)"):
        run_ours(model, inputs)


KV_SEQ = 5


def _mha_inputs(layout, with_bias=True, mask=None, attention_bias=False, past=False):
    head = HIDDEN // HEADS
    query = rand(BATCH, SEQ, HIDDEN)
    if layout == "3d":
        key, value = rand(BATCH, KV_SEQ, HIDDEN, seed=1), rand(BATCH, KV_SEQ, HIDDEN, seed=2)
    elif layout == "bnsh":
        key, value = rand(BATCH, HEADS, KV_SEQ, head, seed=1), rand(BATCH, HEADS, KV_SEQ, head, seed=2)
    else:  # packed KV
        key, value = rand(BATCH, KV_SEQ, HEADS, 2, head, seed=1), None
    total = KV_SEQ + (3 if past else 0)
    return {
        "query": query,
        "key": key,
        "value": value,
        "bias": rand(3 * HIDDEN, seed=3) if with_bias else None,
        "key_padding_mask": mask,
        "attention_bias": rand(BATCH, HEADS, SEQ, total, seed=4) if attention_bias else None,
        "past_key": rand(BATCH, HEADS, 3, head, seed=5) if past else None,
        "past_value": rand(BATCH, HEADS, 3, head, seed=6) if past else None,
    }


@pytest.mark.parametrize("layout", ["3d", "bnsh"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_multi_head_attention_layouts(layout, with_bias):
    check("MultiHeadAttention", _mha_inputs(layout, with_bias), num_heads=HEADS)


@pytest.mark.parametrize("with_bias", [True, False])
def test_multi_head_attention_packed_kv_matches_unpacked(with_bias):
    """ORT's CPU kernel refuses packed KV, so the oracle is ORT on the same key and value unpacked."""
    packed = _mha_inputs("packed_kv", with_bias)
    ours = run_ours(one_node_model("MultiHeadAttention", packed, [("Y", F)], num_heads=HEADS), packed)
    kv = packed["key"]
    unpacked = dict(
        packed,
        key=np.ascontiguousarray(kv[:, :, :, 0]).reshape(BATCH, KV_SEQ, HIDDEN),
        value=np.ascontiguousarray(kv[:, :, :, 1]).reshape(BATCH, KV_SEQ, HIDDEN),
    )
    expected = run_ort(one_node_model("MultiHeadAttention", unpacked, [("Y", F)], num_heads=HEADS), unpacked)
    np.testing.assert_allclose(ours[0], expected[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mask_name", ["1d_lengths", "2d_raw", "3d"])
def test_multi_head_attention_key_padding_mask(mask_name):
    lengths = np.array([KV_SEQ - 2, KV_SEQ], np.int32)
    raw = (np.arange(KV_SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    mask = {"1d_lengths": lengths, "2d_raw": raw, "3d": np.repeat(raw[:, None, :], SEQ, axis=1)}[mask_name]
    check("MultiHeadAttention", _mha_inputs("3d", mask=mask), num_heads=HEADS)


@pytest.mark.parametrize(
    "variant", ["attention_bias", "scale", "unidirectional", "past", "qk", "masked_causal"]
)
def test_multi_head_attention_variants(variant):
    inputs = _mha_inputs(
        "3d", attention_bias=variant in ("attention_bias", "past", "qk"), past=variant == "past"
    )
    if variant == "masked_causal":  # a left-padded row whose only visible keys are all padded
        inputs["query"] = rand(BATCH, KV_SEQ, HIDDEN)
        inputs["key_padding_mask"] = np.array([[0, 0, 1, 1, 1], [1] * KV_SEQ], np.int32)
    attrs = {"num_heads": HEADS}
    outputs = [("Y", F)]
    if variant == "scale":
        attrs["scale"] = 0.2
    if variant in ("unidirectional", "masked_causal"):
        attrs["unidirectional"] = 1
    if variant == "past":
        outputs += [("present_key", F), ("present_value", F)]
    if variant == "qk":
        outputs += [("", F), ("", F), ("qk", F)]
    check("MultiHeadAttention", inputs, outputs=outputs, **attrs)


# ---------------------------------------------------------------- linear

CONV_ACTIVATION_CASES = [
    (None, None),
    ("Relu", None),
    ("Tanh", None),
    ("Sigmoid", None),
    ("LeakyRelu", [0.1]),
    ("Clip", [-0.5, 0.7]),
    ("HardSigmoid", [0.3, 0.4]),
]


@pytest.mark.parametrize(("activation", "params"), CONV_ACTIVATION_CASES)
@pytest.mark.parametrize("with_z", [True, False])
def test_fused_conv(activation, params, with_z):
    inputs = {
        "X": rand(2, 4, 9, 9),
        "W": rand(6, 4, 3, 3, scale=0.4, seed=1),
        "B": rand(6, seed=2),
        "Z": rand(2, 6, 9, 9, seed=3) if with_z else None,
    }
    attrs = {"pads": [1, 1, 1, 1]}
    if activation:
        attrs["activation"] = activation
    if params:
        attrs["activation_params"] = params
    check("FusedConv", inputs, **attrs)


@pytest.mark.parametrize(
    "conv_attrs",
    [
        {"strides": [2, 2], "group": 2},
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        {"dilations": [2, 2], "pads": [2, 1, 2, 1]},
        {"kernel_shape": [1, 1]},
    ],
)
def test_fused_conv_conv_attributes(conv_attrs):
    w_shape = (
        (6, 2, 3, 3)
        if conv_attrs.get("group")
        else (6, 4, 1, 1)
        if "kernel_shape" in conv_attrs
        else (6, 4, 3, 3)
    )
    inputs = {"X": rand(1, 4, 10, 10), "W": rand(*w_shape, scale=0.4, seed=1)}
    check("FusedConv", inputs, activation="Relu", **conv_attrs)


def test_fused_conv_rejects_wrong_param_count():
    inputs = {"X": rand(1, 4, 5, 5), "W": rand(6, 4, 3, 3, seed=1)}
    model = one_node_model(
        "FusedConv", inputs, [("Y", F)], activation="LeakyRelu", activation_params=[0.1, 0.2]
    )
    with pytest.raises(ValueError, match="FusedConv '.*': activation LeakyRelu takes 1 activation_params"):
        run_ours(model, inputs)


GEMM_ACTIVATION_CASES = [
    ("Relu", {}),
    ("Tanh", {}),
    ("Sigmoid", {}),
    ("Softplus", {}),
    ("Softsign", {}),
    ("LeakyRelu", {"activation_alpha": 0.2}),
    ("Elu", {"activation_alpha": 0.7}),
    ("Celu", {"activation_alpha": 1.3}),
    ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
    ("ThresholdedRelu", {"activation_alpha": 0.5}),
    ("Selu", {"activation_alpha": 1.5, "activation_gamma": 1.1}),
    ("ParametricSoftplus", {"activation_alpha": 0.5, "activation_beta": 2.0}),
    ("ScaledTanh", {"activation_alpha": 0.5, "activation_beta": 2.0}),
]


@pytest.mark.parametrize(("activation", "params"), GEMM_ACTIVATION_CASES)
def test_fused_gemm_activations(activation, params):
    inputs = {"A": rand(8, 12, scale=2), "B": rand(12, 10, seed=1), "C": rand(10, seed=2)}
    check("FusedGemm", inputs, activation=activation, **params)


@pytest.mark.parametrize(
    "gemm_attrs",
    [{"transA": 1}, {"transB": 1, "alpha": 0.5, "beta": 2.0}, {"transA": 1, "transB": 1}, {"beta": 0.0}],
)
def test_fused_gemm_gemm_attributes(gemm_attrs):
    a = rand(12, 8) if gemm_attrs.get("transA") else rand(8, 12)
    b = rand(10, 12, seed=1) if gemm_attrs.get("transB") else rand(12, 10, seed=1)
    check(
        "FusedGemm",
        {"A": a, "B": b, "C": rand(8, 10, seed=2)},
        activation="LeakyRelu",
        activation_alpha=0.1,
        **gemm_attrs,
    )


@pytest.mark.parametrize(
    ("attrs", "error"),
    [
        ({}, "attribute activation is required"),
        ({"activation": "LeakyRelu"}, "activation LeakyRelu needs attribute activation_alpha"),
        (
            {"activation": "HardSigmoid", "activation_alpha": 0.2},
            "activation HardSigmoid needs attribute activation_beta",
        ),
    ],
)
def test_fused_gemm_rejects_what_ort_rejects(attrs, error):
    inputs = {"A": rand(4, 6), "B": rand(6, 5, seed=1)}
    model = one_node_model("FusedGemm", inputs, [("Y", F)], **attrs)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail):  # ORT refuses it at session creation
        run_ort(model, inputs)
    with pytest.raises(ValueError, match=f"FusedGemm '.*': {error}"):
        run_ours(model, inputs)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "attrs"),
    [
        ((3, 4, 5), (3, 5, 6), {}),
        ((3, 4, 5), (5, 6), {"alpha": 0.125}),
        ((3, 5, 4), (3, 5, 6), {"transA": 1}),
        ((3, 4, 5), (3, 6, 5), {"transB": 1, "alpha": 2.0}),
        ((2, 3, 5, 4), (2, 3, 6, 5), {"transA": 1, "transB": 1}),
        ((4, 3, 5), (3, 5, 6), {"transBatchA": 1}),
        ((3, 4, 5), (5, 3, 6), {"transBatchB": 1}),
        ((5, 3, 4), (6, 3, 5), {"transBatchA": 1, "transBatchB": 1, "transA": 1, "transB": 1, "alpha": 0.5}),
        ((4, 2, 3, 5), (2, 3, 5, 6), {"transBatchA": 1}),
        ((5,), (3, 5, 6), {}),
    ],
)
def test_fused_matmul(a_shape, b_shape, attrs):
    check("FusedMatMul", {"A": rand(*a_shape), "B": rand(*b_shape, seed=1)}, **attrs)


def test_fused_matmul_trans_batch_needs_equal_ranks():
    inputs = {"A": rand(4, 2, 3, 5), "B": rand(3, 5, 6, seed=1)}
    model = one_node_model("FusedMatMul", inputs, [("Y", F)], transBatchA=1)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail):
        run_ort(model, inputs)
    with pytest.raises(
        ValueError, match="FusedMatMul '.*': transBatchA/transBatchB need A and B of the same rank"
    ):
        run_ours(model, inputs)


# ---------------------------------------------------------------- compiled loops and their fallback
# On numpy float32 with contiguous inputs the Gelus, the skip normalizations and the attention
# softmax run runtime/kernels/compiled.py's loops; everything else takes the array-API path.
# These cases pin down which path ran (a spy on the loop) and check both against the oracle.


@pytest.fixture
def loop_calls(monkeypatch):
    """Counts calls of each compiled loop by name; the loops still run."""
    calls = {}

    def spy(name):
        real = getattr(compiled, name)

        def counted(*args):
            calls[name] = calls.get(name, 0) + 1
            return real(*args)

        monkeypatch.setattr(compiled, name, counted)

    for name in (
        "gelu_rows",
        "bias_gelu_rows",
        "fast_gelu_rows",
        "bias_fast_gelu_rows",
        "skip_layer_norm_rows",
        "masked_softmax_heads",
    ):
        spy(name)
    return calls


def strided(array):
    """The same values as a non-contiguous view (every other element of a wider last axis)."""
    wide = np.zeros((*array.shape[:-1], 2 * array.shape[-1]), array.dtype)
    wide[..., ::2] = array
    view = wide[..., ::2]
    assert not view.flags.c_contiguous
    return view


def test_scalar_functions_of_the_loops_match_float64():
    """erf32, tanh32 and exp32 stand in for library calls; their error is what Gelu and softmax inherit."""
    grid = np.linspace(-10, 10, 20001, dtype=np.float32)
    erf = np.array([compiled.erf32(v) for v in grid])
    tanh = np.array([compiled.tanh32(v) for v in grid])
    assert np.abs(erf - [math.erf(float(v)) for v in grid]).max() < 1e-6
    assert np.abs(tanh - np.tanh(grid.astype(np.float64))).max() < 1e-6
    below_zero = np.linspace(-86.4, 0, 20001, dtype=np.float32)
    exp = np.array([compiled.exp32(v) for v in below_zero])
    relative = np.abs(exp - np.exp(below_zero.astype(np.float64))) / np.exp(below_zero.astype(np.float64))
    assert relative.max() < 1e-6
    assert compiled.exp32(np.float32(-1e4)) == 0.0
    assert compiled.exp32(np.float32(-np.inf)) == 0.0
    assert compiled.exp32(np.float32(100.0)) == np.inf


def test_gelu_loops_against_math_erf_and_tanh():
    x = np.concatenate([np.linspace(-10, 10, 40001, dtype=np.float32), np.float32([np.inf, np.nan])])
    rows = x.reshape(1, -1)
    exact, tanh_form = np.empty_like(rows), np.empty_like(rows)
    compiled.gelu_rows(rows, exact)
    compiled.fast_gelu_rows(rows, tanh_form)
    x64 = x.astype(np.float64)[:-2]
    want_exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x64])
    want_tanh = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    # float32 results of magnitude up to 10: 2 ulp there is 1.9e-6
    assert np.abs(exact[0, :-2] - want_exact).max() < 2e-6
    assert np.abs(tanh_form[0, :-2] - want_tanh).max() < 2e-6
    assert exact[0, -2] == np.inf and tanh_form[0, -2] == np.inf
    assert np.isnan(exact[0, -1]) and np.isnan(tanh_form[0, -1])


@pytest.mark.parametrize("shape", [(2, 16, 64), (3, 13), (1, 1, 13), (1, 5), (0, 4, 13)])
@pytest.mark.parametrize(
    ("op", "loop"),
    [("Gelu", "gelu_rows"), ("BiasGelu", "bias_gelu_rows"), ("FastGelu", "bias_fast_gelu_rows")],
)
def test_gelus_take_the_compiled_loop(op, loop, shape, loop_calls):
    x = rand(*shape, scale=3)
    inputs = {"X": x} if op == "Gelu" else {"X": x, "bias": rand(shape[-1], seed=1)}
    check(op, inputs)
    assert loop_calls == ({} if x.size == 0 else {loop: 1})


@pytest.mark.parametrize("op", ["Gelu", "BiasGelu", "FastGelu"])
def test_gelus_fall_back_on_strided_input(op, loop_calls):
    x = rand(2, 7, 13, scale=3)
    inputs = {"X": x} if op == "Gelu" else {"X": x, "bias": rand(13, seed=1)}
    model = one_node_model(op, inputs, [("Y", TensorProto.FLOAT)])
    expected = run_ort(model, inputs)[0]
    got = run_ours(model, {**inputs, "X": strided(x)})[0]
    assert loop_calls == {}
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_fast_gelu_without_bias_takes_its_own_loop(loop_calls):
    check("FastGelu", {"X": rand(4, 13, scale=3)})
    assert loop_calls == {"fast_gelu_rows": 1}


def test_gelus_in_float64_use_the_array_path():
    """ORT's CPU Gelus are float-only, so the oracle here is the formula with math.erf / tanh."""
    x = np.linspace(-6, 6, 1001).reshape(7, 143)
    bias = np.linspace(-1, 1, 143)
    for op, want in [
        ("Gelu", np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)),
        ("BiasGelu", np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x + bias)),
    ]:
        inputs = {"X": x} if op == "Gelu" else {"X": x, "bias": bias}
        node = ir.from_proto(
            one_node_model(op, {k: v.astype(np.float32) for k, v in inputs.items()}, [("Y", F)])
        )
        kernel = find_kernel(MS, op, 1)(node.graph[0], 1)
        got = kernel.run(*inputs.values())[0]
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=op)
    y = x + bias
    fast = find_kernel(MS, "FastGelu", 1)(
        ir.from_proto(one_node_model("FastGelu", {"X": x.astype(np.float32)}, [("Y", F)])).graph[0], 1
    ).run(x, bias)[0]
    want = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
    np.testing.assert_allclose(fast, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("x_shape", "skip_shape"),
    [((2, 5, 13), (2, 5, 13)), ((2, 5, 13), (5, 13)), ((1, 1, 13), (1, 1, 13)), ((3, 4, 768), (1, 4, 768))],
)
@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_normalizations_take_the_compiled_loop(op, x_shape, skip_shape, loop_calls):
    hidden = x_shape[-1]
    inputs = {
        "input": rand(*x_shape, scale=2),
        "skip": rand(*skip_shape, seed=1),
        "gamma": rand(hidden, seed=2),
        "beta": rand(hidden, seed=3),
        "bias": rand(hidden, seed=4),
    }
    outputs = SKIP_OUTPUTS
    if op == "SkipSimplifiedLayerNormalization":
        del inputs["beta"]
        outputs = [("Y", F), ("", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]
    check(op, inputs, outputs=outputs, epsilon=1e-5)
    assert loop_calls == {"skip_layer_norm_rows": 1}


def test_skip_layer_normalization_float16_takes_float32_statistics():
    # ONNX Runtime's float16 kernel sums and normalizes in float32 and rounds the output (and the
    # sum) to float16 once; so do we. Both round the same float32 results, so they differ by at
    # most one float16 ulp (2^-10 relative, ~1e-3) where the float32 values straddle a rounding
    # boundary: rtol 2e-3, atol 2e-3 for the outputs near zero. In float16 throughout, the
    # variance of these 768-wide rows at 30 +- 3 loses its digits and the check fails.
    h = np.float16
    inputs = {
        "input": (rand(2, 4, 768, scale=3) + 30).astype(h),
        "skip": rand(2, 4, 768, seed=1).astype(h),
        "gamma": rand(768, seed=2).astype(h),
        "beta": rand(768, seed=3).astype(h),
        "bias": rand(768, seed=4).astype(h),
    }
    half = TensorProto.FLOAT16
    outputs = [("Y", half), ("mean", F), ("inv_std_var", F), ("input_skip_bias_sum", half)]
    ours = check("SkipLayerNormalization", inputs, outputs=outputs, rtol=2e-3, atol=2e-3, epsilon=1e-5)
    assert [a.dtype for a in ours] == [h, np.float32, np.float32, h]


def test_skip_layer_normalization_falls_back_on_strided_input(loop_calls):
    inputs = {"input": rand(2, 5, 13), "skip": rand(2, 5, 13, seed=1), "gamma": rand(13, seed=2)}
    model = one_node_model("SkipLayerNormalization", inputs, SKIP_OUTPUTS, epsilon=1e-5)
    expected = run_ort(model, inputs)
    got = run_ours(model, {**inputs, "skip": strided(inputs["skip"])})
    assert loop_calls == {}
    for want, ours in zip(expected, got, strict=True):
        np.testing.assert_allclose(ours, want, rtol=RTOL, atol=ATOL)


def test_skip_layer_normalization_loop_keeps_precision_far_from_zero_mean():
    """Rows at 1000 +- 1: E[x^2] - mean^2 in float32 would lose the variance to cancellation.

    The oracle is float64 numpy (ORT's float kernel takes that shortcut, so it is not one here).
    """
    x = 1000 + rand(2, 3, 768)
    skip, gamma, beta = np.zeros_like(x), np.ones(768, np.float32), np.zeros(768, np.float32)
    model = one_node_model("SkipLayerNormalization", {"input": x, "skip": skip, "gamma": gamma}, [("Y", F)])
    got = run_ours(model, {"input": x, "skip": skip, "gamma": gamma, "beta": beta})[0]
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("batch", "seq", "hidden", "mask_name"),
    [(2, 6, 16, "none"), (2, 6, 16, "2d_raw"), (2, 6, 16, "3d"), (1, 1, 12, "none"), (3, 5, 20, "none")],
)
def test_attention_softmax_takes_the_compiled_loop(batch, seq, hidden, mask_name, loop_calls):
    inputs = {
        "input": rand(batch, seq, hidden),
        "weights": rand(hidden, 3 * hidden, scale=0.5, seed=1),
        "bias": rand(3 * hidden, seed=2),
        "mask_index": _masks(batch, seq)[mask_name] if mask_name != "none" else None,
    }
    check("Attention", inputs, num_heads=4, unidirectional=1)
    assert loop_calls == {"masked_softmax_heads": 1}


def test_attention_softmax_falls_back_when_scores_are_an_output(loop_calls):
    """MultiHeadAttention's qk output needs the scores before softmax, which the loop overwrites."""
    inputs = {"query": rand(2, 6, 16), "key": rand(2, 6, 16, seed=1), "value": rand(2, 6, 16, seed=2)}
    outputs = [("output", F), ("", F), ("", F), ("qk", F)]
    check("MultiHeadAttention", inputs, outputs=outputs, num_heads=4)
    assert loop_calls == {}


@pytest.mark.parametrize(
    "mask_shape", [None, (1, 1, 1, 7), (2, 1, 5, 7), (1, 3, 1, 7), (2, 3, 5, 7), (2, 1, 1, 7)]
)
def test_masked_softmax_heads_broadcasts_its_mask(mask_shape):
    """The oracle is float64 numpy softmax(scores + mask); masked keys at -1e4 and float32's lowest."""
    scores = rand(2, 3, 5, 7, scale=4)
    mask = np.zeros((1, 1, 1, 7), np.float32) if mask_shape is None else rand(*mask_shape, seed=1)
    mask[..., -1] = -1e4
    mask[..., 0] = np.finfo(np.float32).min
    total = scores.astype(np.float64) + mask
    want = np.exp(total - total.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    compiled.masked_softmax_heads(scores, mask)
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-7)


def test_skip_layer_norm_loop_with_a_scratch_row_matches_a_full_sum():
    x, skip = rand(6, 40), rand(6, 40, seed=1)
    gamma, beta, bias = rand(40, seed=2), rand(40, seed=3), rand(40, seed=4)
    results = []
    for summed in (np.empty((6, 40), np.float32), np.empty((1, 40), np.float32)):
        out, mean, inv_std = np.empty_like(x), np.empty(6, np.float32), np.empty(6, np.float32)
        epsilon = np.float32(1e-5)
        compiled.skip_layer_norm_rows(x, skip, bias, gamma, beta, epsilon, True, out, summed, mean, inv_std)
        results.append((out, mean, inv_std))
    # Not bitwise: the row sums are reassociated, and how depends on the arrays' alignment.
    for full, scratch in zip(*results, strict=True):
        np.testing.assert_allclose(scratch, full, rtol=1e-6, atol=1e-6)


def test_wide_vectors_marks_the_calling_function():
    """The attribute must reach LLVM: llvmlite has no string attributes, so this leans on its printing."""

    @numba.njit
    def doubled(x):
        compiled._wide_vectors()
        for i in range(x.shape[0]):
            x[i] *= 2

    x = np.arange(4, dtype=np.float32)
    doubled(x)
    np.testing.assert_array_equal(x, [0, 2, 4, 6])
    assert '"prefer-vector-width"="512"' in next(iter(doubled.inspect_llvm().values()))


# ---------------------------------------------------------------- attention reading heads in place
# With MKL, Attention and MultiHeadAttention on 3-D numpy float32 projections read every head
# straight from them (contrib_attention._mkl_attend); past, present and qk outputs take the path
# that copies heads out. Both against ORT.

needs_mkl = pytest.mark.skipif(not gemm.available(), reason=f"no MKL here: {gemm.unavailable_reason()}")


@pytest.fixture
def head_reads(monkeypatch):
    calls = []
    real = contrib_attention._mkl_attend

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(contrib_attention, "_mkl_attend", counted)
    return calls


ATTENTION_PATH_CASES = {
    "2d_mask": dict(mask="2d_raw"),
    "1d_lengths_causal": dict(mask="1d_lengths", unidirectional=1),
    "3d_mask": dict(mask="3d"),
    "no_bias": dict(mask="2d_raw", bias=False),
    "qkv_hidden_sizes": dict(mask="2d_raw", dv=8),
    "scale": dict(mask="none", scale=0.3),
    "bias_per_head": dict(mask="none", attention_bias=(1, HEADS, SEQ, SEQ)),
    "bias_per_batch_and_mask": dict(mask="2d_raw", attention_bias=(BATCH, 1, SEQ, SEQ)),
    "bias_full_and_causal": dict(
        mask="1d_lengths", attention_bias=(BATCH, HEADS, SEQ, SEQ), unidirectional=1
    ),
}


@needs_mkl
@pytest.mark.parametrize("case", list(ATTENTION_PATH_CASES))
def test_attention_reads_heads_in_place(case, head_reads):
    spec = ATTENTION_PATH_CASES[case]
    dv = spec.get("dv", HIDDEN)
    bias_shape = spec.get("attention_bias")
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 2 * HIDDEN + dv, scale=0.5, seed=1),
        "bias": rand(2 * HIDDEN + dv, seed=2) if spec.get("bias", True) else None,
        "mask_index": _masks()[spec["mask"]],
        "past": None,
        "attention_bias": None if bias_shape is None else rand(*bias_shape, seed=3),
    }
    attrs = {"num_heads": HEADS, "unidirectional": spec.get("unidirectional", 0)}
    if "scale" in spec:
        attrs["scale"] = spec["scale"]
    if "dv" in spec:
        attrs["qkv_hidden_sizes"] = [HIDDEN, HIDDEN, dv]
    check("Attention", inputs, **attrs)
    assert head_reads == [(BATCH, SEQ, HIDDEN)]


@needs_mkl
def test_attention_with_present_copies_heads(head_reads):
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": _masks()["2d_raw"],
    }
    check("Attention", inputs, outputs=[("Y", F), ("present", F)], num_heads=HEADS)
    assert head_reads == []


@needs_mkl
@pytest.mark.parametrize(
    ("layout", "with_bias", "reads"), [("3d", True, True), ("3d", False, True), ("bnsh", True, False)]
)
def test_multi_head_attention_reads_heads_in_place(layout, with_bias, reads, head_reads):
    inputs = _mha_inputs(layout, with_bias, mask=_masks(seq=KV_SEQ)["2d_raw"], attention_bias=True)
    check("MultiHeadAttention", inputs, num_heads=HEADS)
    assert head_reads == ([(BATCH, SEQ, HIDDEN)] if reads else [])


def test_compiled_loops_run_where_numba_cannot_cache(tmp_path):
    """No writable cache location must cost compile time, not an import error or a warning."""
    script = (
        "import numpy as np\n"
        "from numba.core.caching import NullCache\n"
        "from runtime.kernels import compiled\n"
        "assert isinstance(compiled._gelu_span._cache, NullCache)  # the uncached fallback ran\n"
        "assert isinstance(compiled._gelu_chunks._cache, NullCache)\n"
        "x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)\n"
        "out = np.empty_like(x)\n"
        "compiled.bias_gelu_rows(x, np.zeros(16, np.float32), out)\n"
        "print(repr(float(out.sum())))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    out = np.empty_like(x)
    compiled.bias_gelu_rows(x, np.zeros(16, np.float32), out)
    assert float(result.stdout) == float(out.sum())
