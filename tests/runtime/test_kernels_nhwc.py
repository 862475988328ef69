"""The channels-last kernels (runtime/kernels/conv_nhwc.py) against onnxruntime's NCHW ops.

Each NHWC kernel gets the NHWC transpose of the input; its output, transposed back, must
equal onnxruntime's Conv / FusedConv / pool on the NCHW input (graph optimizations off).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from runtime.kernels.base import UnsupportedOp
from runtime.kernels.conv_nhwc import NhwcAveragePool, NhwcFusedConv, NhwcGlobalAveragePool, NhwcMaxPool
from runtime.kernels.registry import find_kernel
from tests.runtime.node_cases import one_node_model, run_onnxruntime

RTOL, ATOL = 1e-3, 1e-4


def onnxruntime_node(op_type, inputs, domain="", **attributes):
    """One node run by onnxruntime (opset 17) with graph optimizations off; its first output."""
    return run_onnxruntime(one_node_model(op_type, inputs, 17, domain=domain, **attributes), inputs)[0]


def make_node(op_type, domain, inputs, attributes, constant_weight=None):
    """An ir.Node for a kernel; `constant_weight` makes input 1 a graph constant, as in a model."""
    values = [ir.Value(name=f"in{i}") for i in range(inputs)]
    if constant_weight is not None:
        values[1] = ir.Value(name="w", const_value=ir.tensor(constant_weight))
    attrs = []
    for key, value in attributes.items():
        if isinstance(value, str):
            attrs.append(ir.AttrString(key, value))
        elif isinstance(value, list) and value and isinstance(value[0], float):
            attrs.append(ir.AttrFloat32s(key, value))
        elif isinstance(value, list):
            attrs.append(ir.AttrInt64s(key, value))
        else:
            attrs.append(ir.AttrInt64(key, value))
    return ir.Node(domain, op_type, values, attrs, num_outputs=1, name=f"test_{op_type}")


def to_nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def to_nchw(y):
    return y.transpose(0, 3, 1, 2)


rng = np.random.default_rng(0)

CONV_CASES = {
    # name: (x shape NCHW, w shape, attributes)
    "3x3 pad 1": ((2, 8, 10, 12), (6, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    "3x3 stride 2 asymmetric pads": ((1, 5, 11, 9), (7, 5, 3, 3), dict(pads=[0, 1, 2, 1], strides=[2, 2])),
    "3x2 dilation 2": ((1, 4, 12, 12), (3, 4, 3, 2), dict(dilations=[2, 2], pads=[2, 1, 2, 1])),
    "7x7 stride 2 stem": ((1, 3, 32, 32), (8, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),
    "1x1 pointwise": ((2, 16, 7, 7), (32, 16, 1, 1), {}),
    "1x1 stride 2": ((1, 16, 9, 9), (8, 16, 1, 1), dict(strides=[2, 2])),
    "depthwise 3x3": ((2, 12, 9, 9), (12, 1, 3, 3), dict(group=12, pads=[1, 1, 1, 1])),
    "depthwise 3x3 stride 2 dilation 2": (
        (1, 6, 13, 11),
        (6, 1, 3, 3),
        dict(group=6, pads=[2, 2, 2, 2], strides=[2, 2], dilations=[2, 2]),
    ),
    "depthwise multiplier 2": ((1, 4, 8, 8), (8, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
    "grouped 3x3 group 2": ((1, 8, 9, 9), (6, 4, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    "SAME_UPPER stride 2": ((1, 3, 10, 9), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "SAME_LOWER": ((1, 3, 8, 8), (4, 3, 4, 4), dict(auto_pad="SAME_LOWER")),
    "VALID": ((1, 3, 8, 8), (4, 3, 3, 3), dict(auto_pad="VALID")),
}


@pytest.mark.parametrize("constant_weight", [True, False], ids=["constant weight", "run-time weight"])
@pytest.mark.parametrize("name", list(CONV_CASES))
def test_nhwc_conv_matches_onnxruntime_conv(name, constant_weight):
    x_shape, w_shape, attributes = CONV_CASES[name]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    expected = onnxruntime_node("Conv", [x, w, b], **attributes)
    kernel = NhwcFusedConv(
        make_node("NhwcFusedConv", "com.microsoft", 3, attributes, w if constant_weight else None), 1
    )
    (actual,) = kernel.run(to_nhwc(x), w, b)
    assert actual.shape == to_nhwc(expected).shape
    np.testing.assert_allclose(to_nchw(actual), expected, rtol=RTOL, atol=ATOL)


ACTIVATIONS = {
    "Relu": {},
    "LeakyRelu": dict(activation_params=[0.2]),
    "Sigmoid": {},
    "Tanh": {},
    "HardSigmoid": dict(activation_params=[0.3, 0.4]),
    "Clip": dict(activation_params=[-0.5, 0.75]),
}


@pytest.mark.parametrize("with_sum", [False, True], ids=["no Z", "residual Z"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_nhwc_fused_conv_matches_onnxruntime_fused_conv(activation, with_sum):
    x = rng.standard_normal((2, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(5).astype(np.float32)
    z = rng.standard_normal((2, 5, 9, 9)).astype(np.float32) if with_sum else None
    attributes = dict(pads=[1, 1, 1, 1], activation=activation, **ACTIVATIONS[activation])
    inputs = [x, w, b] + ([z] if with_sum else [])
    expected = onnxruntime_node("FusedConv", inputs, domain="com.microsoft", **attributes)
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", len(inputs), attributes, w), 1)
    (actual,) = kernel.run(to_nhwc(x), w, b, None if z is None else to_nhwc(z))
    np.testing.assert_allclose(to_nchw(actual), expected, rtol=RTOL, atol=ATOL)


def test_nhwc_conv_without_bias_and_in_float16():
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float16)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float16)
    expected = onnxruntime_node("Conv", [x.astype(np.float32), w.astype(np.float32)], pads=[1, 1, 1, 1])
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 2, dict(pads=[1, 1, 1, 1]), w), 1)
    (actual,) = kernel.run(to_nhwc(x), w)
    assert actual.dtype == np.float16
    # The output is rounded to float16 (3 significant digits), so the tolerance is float16's.
    np.testing.assert_allclose(to_nchw(actual).astype(np.float32), expected, rtol=1e-2, atol=1e-2)


def test_unknown_activation_is_refused_with_the_node_name():
    node = make_node("NhwcFusedConv", "com.microsoft", 2, dict(activation="Gelu"))
    with pytest.raises(UnsupportedOp, match="test_NhwcFusedConv.*Gelu"):
        NhwcFusedConv(node, 1)


def test_wrong_activation_param_count_is_refused():
    node = make_node("NhwcFusedConv", "com.microsoft", 2, dict(activation="Clip", activation_params=[0.0]))
    with pytest.raises(UnsupportedOp, match="Clip takes 2 activation_params, got 1"):
        NhwcFusedConv(node, 1)


def test_channel_mismatch_names_the_node():
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 2, {}), 1)
    x = np.zeros((1, 5, 5, 3), np.float32)
    with pytest.raises(ValueError, match="test_NhwcFusedConv.*3 channels.*4 x group 1"):
        kernel.run(x, np.zeros((2, 4, 3, 3), np.float32))


POOL_CASES = {
    "3x3 stride 2 pad 1": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "2x2": dict(kernel_shape=[2, 2]),
    "3x2 ceil_mode": dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1),
    "asymmetric pads": dict(kernel_shape=[3, 3], pads=[0, 1, 2, 1]),
    "SAME_UPPER stride 2": dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
}


@pytest.mark.parametrize("name", list(POOL_CASES) + ["dilation 2"])
def test_nhwc_max_pool_matches_onnxruntime(name):
    attributes = POOL_CASES.get(name, dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]))
    x = rng.standard_normal((2, 5, 11, 10)).astype(np.float32)
    expected = onnxruntime_node("MaxPool", [x], **attributes)
    (actual,) = NhwcMaxPool(make_node("NhwcMaxPool", "com.fusionwatch", 1, attributes), 1).run(to_nhwc(x))
    np.testing.assert_allclose(to_nchw(actual), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("name", list(POOL_CASES))
def test_nhwc_average_pool_matches_onnxruntime(name, count_include_pad):
    attributes = dict(POOL_CASES[name], count_include_pad=count_include_pad)
    x = rng.standard_normal((2, 5, 11, 10)).astype(np.float32)
    expected = onnxruntime_node("AveragePool", [x], **attributes)
    kernel = NhwcAveragePool(make_node("NhwcAveragePool", "com.fusionwatch", 1, attributes), 1)
    (actual,) = kernel.run(to_nhwc(x))
    np.testing.assert_allclose(to_nchw(actual), expected, rtol=RTOL, atol=ATOL)


def test_nhwc_global_average_pool_matches_onnxruntime():
    x = rng.standard_normal((3, 7, 5, 6)).astype(np.float32)
    expected = onnxruntime_node("GlobalAveragePool", [x])
    (actual,) = NhwcGlobalAveragePool(make_node("NhwcGlobalAveragePool", "com.fusionwatch", 1, {}), 1).run(
        to_nhwc(x)
    )
    assert actual.shape == (3, 1, 1, 7)
    np.testing.assert_allclose(to_nchw(actual), expected, rtol=RTOL, atol=ATOL)


def test_registry_finds_every_nhwc_kernel():
    assert find_kernel("com.microsoft", "NhwcFusedConv", 1) is NhwcFusedConv
    assert find_kernel("com.fusionwatch", "NhwcMaxPool", 1) is NhwcMaxPool
    assert find_kernel("com.fusionwatch", "NhwcAveragePool", 1) is NhwcAveragePool
    assert find_kernel("com.fusionwatch", "NhwcGlobalAveragePool", 1) is NhwcGlobalAveragePool


@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("activation", [None, "Relu"])
def test_nhwc_fused_conv_compiled_epilogue_matches_onnxruntime(activation, with_bias):
    # float32 with Relu or no activation takes the one-pass compiled epilogue; every mix of
    # absent bias / present residual goes through its placeholder arrays.
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32) if with_bias else None
    z = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    attributes = {} if activation is None else dict(activation=activation)
    inputs = [x, w, b if with_bias else np.zeros(16, np.float32), z]
    expected = onnxruntime_node("FusedConv", inputs, domain="com.microsoft", **attributes)
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 4, attributes, w), 1)
    (actual,) = kernel.run(to_nhwc(x), w, b, to_nhwc(z))
    np.testing.assert_allclose(to_nchw(actual), expected, rtol=RTOL, atol=ATOL)


def test_nhwc_fused_conv_compiled_relu_keeps_nan_like_numpy():
    x = np.ones((1, 1, 2, 2), np.float32)
    w = np.ones((2, 1, 1, 1), np.float32)
    b = np.array([np.nan, -5.0], np.float32)
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 3, dict(activation="Relu"), w), 1)
    (actual,) = kernel.run(to_nhwc(x), w, b)
    assert np.isnan(actual[..., 0]).all()
    assert (actual[..., 1] == 0).all()


def test_nhwc_max_pool_compiled_path_propagates_nan_and_leaves_input_alone():
    x = rng.standard_normal((1, 7, 7, 3)).astype(np.float32)
    x[0, 3, 3, 1] = np.nan
    before = x.copy()
    attributes = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    (actual,) = NhwcMaxPool(make_node("NhwcMaxPool", "com.fusionwatch", 1, attributes), 1).run(x)
    np.testing.assert_array_equal(x, before)
    # Output (1, 1) and its neighbours see input (3, 3): windows rows 1..3 / 3..5, same columns.
    nan_at = np.argwhere(np.isnan(actual[0, :, :, 1]))
    assert sorted(map(tuple, nan_at)) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert not np.isnan(actual[..., [0, 2]]).any()
    finite = np.where(np.isnan(x), -np.inf, x)
    expected = onnxruntime_node("MaxPool", [to_nchw(finite)], **attributes)
    np.testing.assert_allclose(
        to_nchw(np.where(np.isnan(actual), -np.inf, actual))[:, [0, 2]], expected[:, [0, 2]]
    )
