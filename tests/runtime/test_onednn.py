"""oneDNN convolutions (runtime/kernels/onednn.py): taken where they should be, equal to the
numpy path and to onnxruntime, and left where they should not run.

The kernel tests in test_kernels_conv.py / test_kernels_nhwc.py / test_kernels_contrib.py
already hold both paths to onnxruntime; here each case runs the same kernel on oneDNN and on
its numpy path and checks which one ran.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import onednn
from runtime.kernels.contrib_linear import FusedConv
from runtime.kernels.conv import Conv
from runtime.kernels.conv_nhwc import NhwcFusedConv
from tests.runtime.test_kernels_nhwc import make_node, onnxruntime_node, to_nchw, to_nhwc

RTOL, ATOL = 1e-3, 1e-4

pytestmark = pytest.mark.skipif(
    not onednn.available(), reason=f"oneDNN is not installed here: {onednn.unavailable_reason()}"
)

rng = np.random.default_rng(7)

CASES = {
    # name: (x shape NC..., w shape, attributes)
    "1-D k3 stride 2": ((2, 5, 17), (4, 5, 3), dict(pads=[1, 2], strides=[2])),
    "2-D 3x3 pad 1": ((1, 8, 10, 12), (6, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    "2-D 3x2 dilation 2 asymmetric": (
        (1, 4, 12, 11),
        (3, 4, 3, 2),
        dict(dilations=[2, 2], pads=[2, 0, 1, 1]),
    ),
    "2-D stem 7x7/2 three channels": ((1, 3, 32, 30), (8, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),
    "2-D SAME_UPPER stride 2": ((1, 3, 10, 9), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "2-D 1x1 stride 2": ((2, 16, 9, 9), (8, 16, 1, 1), dict(strides=[2, 2])),
    "3-D 3x3x3": ((1, 3, 6, 7, 5), (4, 3, 3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1])),
}


def arrays(x_shape, w_shape):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize("name", list(CASES))
def test_conv_runs_on_onednn_and_matches_numpy_path_and_onnxruntime(name):
    x_shape, w_shape, attributes = CASES[name]
    x, w, b = arrays(x_shape, w_shape)
    kernel = Conv(make_node("Conv", "", 3, attributes, w), 17)
    (actual,) = kernel.run(x, w, b)
    assert len(kernel._primitives) == 1, "a constant float32 weight must take the oneDNN path"
    np.testing.assert_allclose(actual, kernel.convolve(x, w, b), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        actual, onnxruntime_node("Conv", [x, w, b], **attributes), rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("2-D")])
def test_nhwc_conv_runs_on_onednn_and_matches_onnxruntime(name):
    x_shape, w_shape, attributes = CASES[name]
    x, w, b = arrays(x_shape, w_shape)
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 3, attributes, w), 1)
    (actual,) = kernel.run(to_nhwc(x), w, b)
    assert len(kernel._primitives) == 1
    assert actual.flags.c_contiguous and actual.shape[-1] == w_shape[0]
    np.testing.assert_allclose(
        to_nchw(actual), onnxruntime_node("Conv", [x, w, b], **attributes), rtol=RTOL, atol=ATOL
    )


ACTIVATIONS = {
    "Relu": [],
    "LeakyRelu": [0.2],
    "Sigmoid": [],
    "Tanh": [],
    "Silu": [],
    "HardSigmoid": [0.3, 0.4],
    "Clip": [-0.5, 0.75],
}


@pytest.mark.parametrize("with_sum", [False, True], ids=["no Z", "residual Z"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_fused_conv_on_onednn_matches_the_numpy_path(activation, with_sum):
    x, w, b = arrays((2, 6, 9, 9), (5, 6, 3, 3))
    z = rng.standard_normal((2, 5, 9, 9)).astype(np.float32) if with_sum else None
    attributes = dict(pads=[1, 1, 1, 1], activation=activation)
    if ACTIVATIONS[activation]:
        attributes["activation_params"] = ACTIVATIONS[activation]
    kernel = FusedConv(make_node("FusedConv", "com.microsoft", 4 if with_sum else 3, attributes, w), 1)
    (actual,) = kernel.run(x, w, b, z)
    assert len(kernel._primitives) == 1
    y = kernel.convolve(x, w, b)
    if z is not None:
        y += z
    kernel.activation(np, y, kernel.params)
    np.testing.assert_allclose(actual, y, rtol=RTOL, atol=ATOL)


def test_relu_after_onednn_keeps_nan_as_onnxruntime_does():
    # oneDNN's own ReLU post-op turns NaN into 0 in its channels-last kernels; ours keeps it.
    x = np.ones((1, 16, 4, 4), np.float32)
    w = np.ones((16, 16, 1, 1), np.float32)
    b = np.zeros(16, np.float32)
    b[3] = np.nan
    attributes = dict(activation="Relu")
    expected = onnxruntime_node("FusedConv", [x, w, b], domain="com.microsoft", **attributes)
    nchw = FusedConv(make_node("FusedConv", "com.microsoft", 3, attributes, w), 1)
    nhwc = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 3, attributes, w), 1)
    for actual in (nchw.run(x, w, b)[0], to_nchw(nhwc.run(to_nhwc(x), w, b)[0])):
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    assert nchw._primitives and nhwc._primitives


def test_grouped_channels_last_conv_runs_on_onednn():
    x, w, b = arrays((1, 12, 9, 9), (12, 1, 3, 3))
    attributes = dict(group=12, pads=[1, 1, 1, 1])
    kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 3, attributes, w), 1)
    (actual,) = kernel.run(to_nhwc(x), w, b)
    assert len(kernel._primitives) == 1
    np.testing.assert_allclose(
        to_nchw(actual), onnxruntime_node("Conv", [x, w, b], **attributes), rtol=RTOL, atol=ATOL
    )


def test_grouped_nchw_conv_stays_on_numpy():
    # Measured slower on oneDNN (runtime/kernels/conv.py, library_primitive).
    x, w, b = arrays((1, 12, 9, 9), (12, 1, 3, 3))
    kernel = Conv(make_node("Conv", "", 3, dict(group=12, pads=[1, 1, 1, 1]), w), 17)
    kernel.run(x, w, b)
    assert kernel._primitives == {}


def test_run_time_weight_and_float16_stay_on_numpy():
    x, w, b = arrays((1, 4, 6, 6), (3, 4, 3, 3))
    runtime_weight = Conv(make_node("Conv", "", 3, dict(pads=[1, 1, 1, 1])), 17)
    runtime_weight.run(x, w, b)
    assert runtime_weight._library_weight is None and runtime_weight._primitives == {}
    half = Conv(make_node("Conv", "", 2, dict(pads=[1, 1, 1, 1]), w.astype(np.float16)), 17)
    (y,) = half.run(x.astype(np.float16), w.astype(np.float16))
    assert y.dtype == np.float16 and half._primitives == {}


def test_one_primitive_per_input_shape():
    x, w, b = arrays((1, 4, 6, 6), (3, 4, 3, 3))
    kernel = Conv(make_node("Conv", "", 3, dict(pads=[1, 1, 1, 1]), w), 17)
    kernel.run(x, w, b)
    kernel.run(x, w, b)
    bigger = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    (y,) = kernel.run(bigger, w, b)
    assert len(kernel._primitives) == 2
    np.testing.assert_allclose(y, kernel.convolve(bigger, w, b), rtol=RTOL, atol=ATOL)


def test_a_strided_input_is_copied_for_onednn():
    x, w, b = arrays((1, 4, 6, 12), (3, 4, 3, 3))
    strided = x[..., ::2]
    kernel = Conv(make_node("Conv", "", 3, dict(pads=[1, 1, 1, 1]), w), 17)
    (y,) = kernel.run(strided, w, b)
    assert len(kernel._primitives) == 1
    expected = onnxruntime_node("Conv", [np.ascontiguousarray(strided), w, b], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def test_a_primitive_oneDNN_refuses_raises_with_the_call_named():
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(onednn.OneDnnError, match="convolution_forward_primitive_desc_create failed"):
        # An output size that does not follow from the input, kernel and padding.
        onednn.ConvPrimitive(
            (1, 3, 8, 8),
            w,
            False,
            group=1,
            strides=[1, 1],
            dilations=[1, 1],
            begin=[0, 0],
            end=[0, 0],
            out=[9, 9],
            channels_last=False,
        )


def test_without_onednn_kernels_use_numpy(monkeypatch):
    monkeypatch.setattr(onednn, "_library", None)
    monkeypatch.setattr(onednn, "_load_error", "the onednn-cpu-gomp package is not installed")
    assert not onednn.available()
    x, w, b = arrays((1, 4, 6, 6), (3, 4, 3, 3))
    kernel = Conv(make_node("Conv", "", 3, dict(pads=[1, 1, 1, 1]), w), 17)
    (y,) = kernel.run(x, w, b)
    assert kernel._library_weight is None
    np.testing.assert_allclose(
        y, onnxruntime_node("Conv", [x, w, b], pads=[1, 1, 1, 1]), rtol=RTOL, atol=ATOL
    )
    with pytest.raises(RuntimeError, match="oneDNN is not available: the onednn-cpu-gomp package"):
        onednn.ConvPrimitive(
            (1, 4, 6, 6),
            w,
            False,
            group=1,
            strides=[1, 1],
            dilations=[1, 1],
            begin=[1, 1],
            end=[1, 1],
            out=[6, 6],
            channels_last=False,
        )
