"""The contrib (fused) kernels against onnxruntime running the same one-node model.

ONNX Runtime defines these ops, so it is the oracle: every case builds a single node with
onnx.helper, runs it in ORT with graph optimizations off, and runs our kernel (found through the
registry, as the executor will) on the same feeds. fp32 tolerances rtol 1e-3, atol 1e-4.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from tests.runtime.contrib_cases import (
    ATOL,
    BATCH,
    HEADS,
    HIDDEN,
    I32,
    KV_SEQ,
    RTOL,
    SEQ,
    SKIP_OUTPUTS,
    F,
    check,
    embed_inputs,
    masks,
    mha_inputs,
    one_node_model,
    rand,
    run_ort,
    run_ours,
)

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


@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("segment", [True, False])
@pytest.mark.parametrize("position_ids_shape", [None, (2, 5), (1, 5)])
def test_embed_layer_normalization(mask, segment, position_ids_shape):
    inputs = embed_inputs(mask, segment, position_ids_shape)
    outputs = [("output", F), ("mask_index", I32), ("embedding_sum", F)]
    check("EmbedLayerNormalization", inputs, outputs=outputs, epsilon=1e-5)


@pytest.mark.parametrize(("field", "bad", "named"), [("input_ids", 20, "max 20"), ("input_ids", -1, "min -1"),
                                                    ("position_ids", -3, "min -3"), ("position_ids", 16, "max 16")])
def test_embed_layer_normalization_rejects_out_of_range_ids(field, bad, named):
    """A negative id too: the range check reads the ids as unsigned, where -1 is above any row count."""
    inputs = embed_inputs(position_ids_shape=(2, 5))
    inputs[field][1, 2] = bad
    model = one_node_model("EmbedLayerNormalization", inputs, [("output", F), ("mask_index", I32)])
    rows = 20 if field == "input_ids" else 16
    with pytest.raises(ValueError, match=rf"{field} out of range \[0, {rows}\) \(.*{named}"):
        run_ours(model, inputs)


# ---------------------------------------------------------------- attention

@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask_name, unidirectional):
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": masks()[mask_name],
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
        "mask_index": masks()["2d_raw"],
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
        "mask_index": masks(past=past_len)["2d_raw"],
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


@pytest.mark.parametrize("layout", ["3d", "bnsh"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_multi_head_attention_layouts(layout, with_bias):
    check("MultiHeadAttention", mha_inputs(layout, with_bias), num_heads=HEADS)


@pytest.mark.parametrize("with_bias", [True, False])
def test_multi_head_attention_packed_kv_matches_unpacked(with_bias):
    """ORT's CPU kernel refuses packed KV, so the oracle is ORT on the same key and value unpacked."""
    packed = mha_inputs("packed_kv", with_bias)
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
    check("MultiHeadAttention", mha_inputs("3d", mask=mask), num_heads=HEADS)


@pytest.mark.parametrize(
    "variant", ["attention_bias", "scale", "unidirectional", "past", "qk", "masked_causal"]
)
def test_multi_head_attention_variants(variant):
    inputs = mha_inputs(
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
