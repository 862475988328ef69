"""The conv family against ONNX's backend node test cases."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import conv
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test, one_node_model, run_kernel

test_node_case = node_case_test(conv.KERNELS)


# ---------------------------------------------------------------- against onnxruntime
# The conformance suite has 17 Conv/ConvTranspose cases, all tiny; these cover the paths the
# kernel chooses between (pointwise, depthwise, grouped im2col) at realistic shapes.

CONV_CONFIGS = {
    # name: (x shape, w shape, attributes)
    "resnet_stem_7x7_s2": ((1, 3, 32, 32), (8, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    "3x3_pad1": ((2, 16, 14, 14), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    "3x3_s2_asymmetric_pads": ((1, 8, 15, 13), (4, 8, 3, 3), dict(strides=[2, 2], pads=[0, 1, 2, 1])),
    "pointwise": ((2, 32, 9, 9), (64, 32, 1, 1), {}),
    "pointwise_s2": ((1, 32, 10, 10), (16, 32, 1, 1), dict(strides=[2, 2])),
    "pointwise_grouped": ((1, 32, 7, 7), (16, 8, 1, 1), dict(group=4)),
    "depthwise_3x3": ((2, 12, 11, 11), (12, 1, 3, 3), dict(group=12, pads=[1, 1, 1, 1])),
    "depthwise_5x5_s2_dilated": (
        (1, 6, 20, 20),
        (6, 1, 5, 5),
        dict(group=6, strides=[2, 2], dilations=[2, 2], pads=[4, 4, 4, 4]),
    ),
    "depthwise_multiplier_2": ((1, 4, 9, 9), (8, 1, 3, 3), dict(group=4)),
    "grouped_3x3": ((1, 16, 9, 9), (24, 4, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
    "dilated_rectangular": ((1, 4, 17, 12), (5, 4, 3, 2), dict(dilations=[2, 3], strides=[1, 2])),
    "same_upper_s2": ((1, 3, 10, 9), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower_even_kernel": ((1, 3, 8, 8), (4, 3, 4, 4), dict(auto_pad="SAME_LOWER")),
    "valid": ((1, 3, 8, 7), (2, 3, 3, 3), dict(auto_pad="VALID", strides=[2, 1])),
    "conv1d": ((2, 6, 30), (8, 3, 5), dict(group=2, strides=[3], pads=[2, 1])),
    "conv3d": ((1, 4, 6, 7, 8), (6, 4, 3, 3, 3), dict(pads=[1, 0, 1, 1, 2, 0], strides=[1, 2, 2])),
}


@pytest.mark.parametrize("name", list(CONV_CONFIGS))
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_conv_matches_onnxruntime(name, with_bias):
    x_shape, w_shape, attributes = CONV_CONFIGS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    assert_same_as_onnxruntime("Conv", [x, w, b] if with_bias else [x, w], 17, **attributes)


def test_conv_float16_is_computed_in_float32_and_cast_back():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float16)
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float16)
    assert_same_as_onnxruntime("Conv", [x, w], 17, rtol=1e-2, atol=1e-2, pads=[1, 1, 1, 1])


def test_conv_never_writes_into_its_inputs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    before = [a.copy() for a in (x, w, b)]
    run_kernel(one_node_model("Conv", [x, w, b], 17, group=4, pads=[1, 1, 1, 1]), [x, w, b])
    for a, kept in zip((x, w, b), before, strict=True):
        np.testing.assert_array_equal(a, kept)


CONV_TRANSPOSE_CONFIGS = {
    "s2_k4_pads": ((1, 8, 7, 7), (8, 4, 4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "grouped_dilated": ((2, 6, 5, 6), (6, 2, 3, 3), dict(group=3, dilations=[2, 1], strides=[1, 2])),
    "output_padding": (
        (1, 4, 5, 5),
        (4, 3, 3, 3),
        dict(strides=[2, 2], output_padding=[1, 1], pads=[1, 1, 1, 1]),
    ),
    "output_shape": ((1, 2, 4, 4), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[9, 9])),
    "same_upper": ((1, 2, 5, 4), (2, 2, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    "conv_transpose_1d": ((1, 3, 9), (3, 5, 4), dict(strides=[3], pads=[1, 2])),
}


@pytest.mark.parametrize("name", list(CONV_TRANSPOSE_CONFIGS))
def test_conv_transpose_matches_onnxruntime(name):
    x_shape, w_shape, attributes = CONV_TRANSPOSE_CONFIGS[name]
    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[1] * attributes.get("group", 1)).astype(np.float32)
    assert_same_as_onnxruntime("ConvTranspose", [x, w, b], 17, **attributes)


@pytest.mark.parametrize("op_type", ["Conv", "ConvTranspose"])
def test_constant_weights_match_onnxruntime(op_type):
    """Weights as initializers: the path oneDNN takes for Conv. A ConvTranspose with as many
    outputs as inputs once passed Conv's weight check and ran as a Conv (ONNX Runtime's
    test_conv_follow_convtrans.onnx: [1, 32, 8, 26] where [1, 32, 29, 30] was right)."""
    import onnx
    import onnxruntime

    import runtime

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 32, 15, 28)).astype(np.float32)
    w = rng.standard_normal((32, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    node = onnx.helper.make_node(op_type, ["x", "w", "b"], ["y"], group=16, dilations=[2, 2], pads=[2, 1, 2, 1],
                                 strides=[2, 1], kernel_shape=[3, 3])
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    data = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    expected = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    actual = runtime.InferenceSession(data, runtime.SessionOptions(graph_optimization_level="disabled")).run(
        None, {"x": x})[0]
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-4)
