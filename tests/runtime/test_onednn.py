"""oneDNN convolutions (runtime/kernels/onednn_conv.py, behind NhwcFusedConv and Conv): taken where they
should be, equal to the numpy path and to onnxruntime, and left where they should not run.

The kernel tests in test_kernels_nhwc.py already hold NhwcFusedConv to onnxruntime with a
constant weight (oneDNN) and a run-time one (numpy); here each case also checks which path ran.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from runtime.kernels import libraries, onednn, onednn_conv
from runtime.kernels.conv import Conv
from runtime.kernels.conv_nhwc import NhwcFusedConv
from tests.runtime.test_kernels_nhwc import make_node, onnxruntime_node

RTOL, ATOL = 1e-3, 1e-4

pytestmark = pytest.mark.skipif(
    not onednn.available(), reason=f"oneDNN is not installed here: {onednn.unavailable_reason()}"
)

rng = np.random.default_rng(7)


def channels_last(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


def channels_first(y):
    return np.moveaxis(y, -1, 1)


def arrays(x_shape, w_shape):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    return x, w, b


def nhwc_kernel(attributes, w, inputs=3):
    return NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", inputs, attributes, w), 1)


CASES = {
    # name: (x shape NC..., w shape, attributes)
    "1-D k3 stride 2": ((2, 5, 17), (4, 5, 3), dict(pads=[1, 2], strides=[2])),
    "2-D 3x3 pad 1": ((1, 8, 10, 12), (6, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    "2-D 3x2 dilation 2 asymmetric": ((1, 4, 12, 11), (3, 4, 3, 2), dict(dilations=[2, 2], pads=[2, 0, 1, 1])),
    "2-D stem 7x7/2 three channels": ((1, 3, 32, 30), (8, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),
    "2-D SAME_UPPER stride 2": ((1, 3, 10, 9), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "2-D 1x1 stride 2": ((2, 16, 9, 9), (8, 16, 1, 1), dict(strides=[2, 2])),
    "2-D depthwise": ((1, 12, 9, 9), (12, 1, 3, 3), dict(group=12, pads=[1, 1, 1, 1])),
    "2-D grouped": ((1, 8, 9, 9), (6, 4, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    "3-D 3x3x3": ((1, 3, 6, 7, 5), (4, 3, 3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_constant_weight_conv_runs_on_onednn_and_matches_onnxruntime(name):
    x_shape, w_shape, attributes = CASES[name]
    x, w, b = arrays(x_shape, w_shape)
    kernel = nhwc_kernel(attributes, w)
    (actual,) = kernel.run(channels_last(x), w, b)
    assert len(kernel._primitives) == 1, "a constant float32 weight must take the oneDNN path"
    assert actual.flags.c_contiguous and actual.shape[-1] == w_shape[0]
    expected = onnxruntime_node("Conv", [x, w, b], **attributes)
    np.testing.assert_allclose(channels_first(actual), expected, rtol=RTOL, atol=ATOL)
    run_time_weight = nhwc_kernel(attributes, None)  # the numpy path, for the same call
    (numpy_path,) = run_time_weight.run(channels_last(x), w, b)
    assert run_time_weight._primitives == {}
    np.testing.assert_allclose(actual, numpy_path, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_constant_weight_nchw_conv_runs_on_onednn_and_matches_onnxruntime(name):
    # ONNX's own Conv (levels below `layout`), in its NC... layout: the same cases, the same oracle.
    x_shape, w_shape, attributes = CASES[name]
    x, w, b = arrays(x_shape, w_shape)
    kernel = Conv(make_node("Conv", "", 3, attributes, w), 17)
    (actual,) = kernel.run(x, w, b)
    assert len(kernel._primitives) == 1, "a constant float32 weight must take the oneDNN path"
    expected = onnxruntime_node("Conv", [x, w, b], **attributes)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    run_time_weight = Conv(make_node("Conv", "", 3, attributes), 17)
    (numpy_path,) = run_time_weight.run(x, w, b)
    assert run_time_weight._primitives == {}
    np.testing.assert_allclose(actual, numpy_path, rtol=RTOL, atol=ATOL)


def test_nchw_conv_without_bias_and_with_im2col_chosen():
    x, w, _ = arrays((1, 8, 10, 12), (6, 8, 3, 3))
    kernel = Conv(make_node("Conv", "", 2, {"pads": [1, 1, 1, 1]}, w), 17)
    (actual,) = kernel.run(x, w)
    np.testing.assert_allclose(actual, onnxruntime_node("Conv", [x, w], pads=[1, 1, 1, 1]), rtol=RTOL, atol=ATOL)
    assert len(kernel._primitives) == 1
    chosen_numpy = Conv(make_node("Conv", "", 2, {"pads": [1, 1, 1, 1]}, w), 17)
    with libraries.using({"conv": "numpy"}):  # the session measured im2col faster
        (numpy_path,) = chosen_numpy.run(x, w)
    assert chosen_numpy._primitives == {}
    np.testing.assert_allclose(numpy_path, actual, rtol=RTOL, atol=ATOL)


ACTIVATIONS = {
    "Relu": [],
    "LeakyRelu": [0.2],
    "Sigmoid": [],
    "Tanh": [],
    "HardSigmoid": [0.3, 0.4],
    "Clip": [-0.5, 0.75],
}


@pytest.mark.parametrize("with_sum", [False, True], ids=["no Z", "residual Z"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_residual_and_activation_after_onednn_match_onnxruntime(activation, with_sum):
    x, w, b = arrays((2, 6, 9, 9), (5, 6, 3, 3))
    z = rng.standard_normal((2, 5, 9, 9)).astype(np.float32) if with_sum else None
    attributes = dict(pads=[1, 1, 1, 1], activation=activation)
    if ACTIVATIONS[activation]:
        attributes["activation_params"] = ACTIVATIONS[activation]
    inputs = [x, w, b] + ([z] if with_sum else [])
    kernel = nhwc_kernel(attributes, w, len(inputs))
    (actual,) = kernel.run(channels_last(x), w, b, None if z is None else channels_last(z))
    assert len(kernel._primitives) == 1
    expected = onnxruntime_node("FusedConv", inputs, domain="com.microsoft", **attributes)
    np.testing.assert_allclose(channels_first(actual), expected, rtol=RTOL, atol=ATOL)


def test_relu_after_onednn_keeps_nan_as_onnxruntime_does():
    # oneDNN's own ReLU post-op turns NaN into 0 in its channels-last kernels; ours keeps it.
    x = np.ones((1, 16, 4, 4), np.float32)
    w = np.ones((16, 16, 1, 1), np.float32)
    b = np.zeros(16, np.float32)
    b[3] = np.nan
    expected = onnxruntime_node("FusedConv", [x, w, b], domain="com.microsoft", activation="Relu")
    kernel = nhwc_kernel(dict(activation="Relu"), w)
    actual = channels_first(kernel.run(channels_last(x), w, b)[0])
    assert kernel._primitives
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_float16_stays_on_numpy():
    x, w, _ = arrays((1, 4, 6, 6), (3, 4, 3, 3))
    kernel = nhwc_kernel(dict(pads=[1, 1, 1, 1]), w.astype(np.float16), inputs=2)
    (y,) = kernel.run(channels_last(x).astype(np.float16), w.astype(np.float16))
    assert y.dtype == np.float16 and kernel._primitives == {}


def test_one_primitive_per_input_shape():
    x, w, b = arrays((1, 4, 6, 6), (3, 4, 3, 3))
    kernel = nhwc_kernel(dict(pads=[1, 1, 1, 1]), w)
    kernel.run(channels_last(x), w, b)
    kernel.run(channels_last(x), w, b)
    bigger = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    (y,) = kernel.run(channels_last(bigger), w, b)
    assert len(kernel._primitives) == 2
    expected = onnxruntime_node("Conv", [bigger, w, b], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(channels_first(y), expected, rtol=RTOL, atol=ATOL)


def test_a_strided_input_is_copied_for_onednn():
    # The layout level's first convolution reads a Transpose's view of the NCHW input.
    x, w, b = arrays((1, 4, 6, 7), (3, 4, 3, 3))
    view = np.moveaxis(x, 1, -1)
    assert not view.flags.c_contiguous
    kernel = nhwc_kernel(dict(pads=[1, 1, 1, 1]), w)
    (y,) = kernel.run(view, w, b)
    assert len(kernel._primitives) == 1
    expected = onnxruntime_node("Conv", [x, w, b], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(channels_first(y), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "x_shape, w_shape, attributes",
    [
        ((1, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1])),  # ResNet-50's conv2 3x3
        ((1, 64, 56, 56), (256, 64, 1, 1), {}),  # its 1x1 expansion
        ((1, 3, 224, 224), (64, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),  # its stem
    ],
    ids=["3x3", "1x1", "stem"],
)
def test_resnet_layers_get_a_jit_kernel_not_the_reference_loops(x_shape, w_shape, attributes):
    x, w, b = arrays(x_shape, w_shape)
    kernel = nhwc_kernel(attributes, w)
    kernel.run(channels_last(x), w, b)
    (primitive,) = kernel._primitives.values()
    assert not primitive.implementation.startswith("ref"), primitive.implementation


def test_a_primitive_onednn_refuses_raises_with_the_call_named():
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(onednn.OneDnnError, match="convolution_forward_primitive_desc_create failed"):
        # An output size that does not follow from the input, kernel and padding.
        onednn_conv.ConvPrimitive(
            (1, 8, 8, 3), w, False, group=1, strides=[1, 1], dilations=[1, 1], begin=[0, 0], end=[0, 0], out=[9, 9]
        )


def test_without_onednn_the_kernel_uses_numpy(monkeypatch):
    monkeypatch.setattr(onednn, "_library", None)
    monkeypatch.setattr(onednn, "_load_error", "the onednn-cpu-gomp package is not installed")
    assert not onednn.available()
    x, w, b = arrays((1, 4, 6, 6), (3, 4, 3, 3))
    kernel = nhwc_kernel(dict(pads=[1, 1, 1, 1]), w)
    (y,) = kernel.run(channels_last(x), w, b)
    assert kernel._library_weight is None
    expected = onnxruntime_node("Conv", [x, w, b], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(channels_first(y), expected, rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match="oneDNN is not available: the onednn-cpu-gomp package"):
        onednn_conv.ConvPrimitive(
            (1, 6, 6, 4), w, False, group=1, strides=[1, 1], dilations=[1, 1], begin=[1, 1], end=[1, 1], out=[6, 6]
        )


_FORK_SCRIPT = """
import os, signal
import numpy as np
from runtime.kernels import onednn
from runtime.kernels.conv_nhwc import NhwcFusedConv
from tests.runtime.test_kernels_nhwc import make_node
x = np.random.default_rng(0).standard_normal((1, 28, 28, 32)).astype(np.float32)
w = np.random.default_rng(1).standard_normal((32, 32, 3, 3)).astype(np.float32)
kernel = NhwcFusedConv(make_node("NhwcFusedConv", "com.microsoft", 2, dict(pads=[1, 1, 1, 1]), w), 1)
(parent,) = kernel.run(x, w)
assert kernel._primitives, "the parent must have run oneDNN"
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang in libgomp would end here, as a failure
    (child,) = kernel.run(x, w)
    ok = np.allclose(child, parent, rtol=1e-3, atol=1e-4) and not onednn.available()
    print(onednn.unavailable_reason(), flush=True)
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_falls_back_to_numpy_instead_of_hanging_in_openmp():
    done = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forked from one that had run oneDNN" in done.stdout
