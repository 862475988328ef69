"""The normalization family against ONNX's backend node test cases."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import normalization
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    one_node_model,
    run_kernel,
    run_onnxruntime,
)

test_node_case = node_case_test(normalization.KERNELS)


# ---------------------------------------------------------------- against onnxruntime

RNG = np.random.default_rng(0)
F32 = np.float32


def _normal(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("opset", [14, 17])
def test_layer_normalization_at_opset_14_and_17_matches_onnxruntime(opset):
    # At 14 this is ORT's ONNX-domain contrib registration, the op its LayerNormFusion emits.
    x, scale, bias = _normal(2, 5, 16), _normal(16), _normal(16)
    assert_same_as_onnxruntime("LayerNormalization", [x, scale, bias], opset=opset, epsilon=1e-5)


def test_layer_normalization_over_two_axes_with_statistics_outputs():
    x, scale = _normal(3, 4, 6), _normal(4, 6)
    assert_same_as_onnxruntime("LayerNormalization", [x, scale], opset=17, outputs=3, axis=1)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
def test_layer_normalization_last_axis_compiled_loop_with_statistics_outputs(with_bias):
    # float32 over the last axis only runs compiled.skip_layer_norm_rows with a zero skip; a
    # large common offset checks the variance is taken about the mean, not as E[x^2] - mean^2.
    x, scale, bias = _normal(2, 3, 40) * 4 + 300, _normal(40), _normal(40)
    inputs = [x, scale, bias] if with_bias else [x, scale]
    assert_same_as_onnxruntime("LayerNormalization", inputs, opset=17, outputs=3, epsilon=1e-3)


def test_layer_normalization_float16_uses_float32_statistics():
    x, scale, bias = (a.astype(np.float16) for a in (_normal(2, 64) * 30, _normal(64), _normal(64)))
    assert_same_as_onnxruntime("LayerNormalization", [x, scale, bias], opset=17, rtol=1e-2, atol=1e-2)


def test_layer_normalization_below_opset_17_gives_scales_type():
    # ORT's since-1 op types X apart from Scale/B/Y: float16 data with float32 weights gives
    # float32, what LayerNormFusion emits for a float16 stream normalized in float32 (Apex O2).
    # The statistics are float32 on both sides, so the fp32 tolerance holds.
    x = (_normal(2, 3, 64) * 4).astype(np.float16)
    scale, bias = _normal(64), _normal(64)
    model = one_node_model("LayerNormalization", [x, scale, bias], 12, epsilon=1e-5)
    [ours], [theirs] = run_kernel(model, [x, scale, bias]), run_onnxruntime(model, [x, scale, bias])
    assert ours.dtype == theirs.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-4)


def test_layer_normalization_from_opset_17_refuses_mixed_types():
    x, scale = _normal(2, 8).astype(np.float16), _normal(8)
    model = one_node_model("LayerNormalization", [x, scale], 17)
    with pytest.raises(ValueError, match="X is float16 but Scale is float32; from opset 17 they share one type"):
        run_kernel(model, [x, scale])


def test_batch_normalization_inference_matches_onnxruntime():
    x = _normal(2, 6, 5, 5)
    scale, bias, mean = _normal(6), _normal(6), _normal(6)
    var = np.abs(_normal(6)) + 0.1
    assert_same_as_onnxruntime("BatchNormalization", [x, scale, bias, mean, var], opset=15, epsilon=1e-3)


def test_instance_normalization_matches_onnxruntime():
    x = _normal(2, 3, 7, 5)
    assert_same_as_onnxruntime("InstanceNormalization", [x, _normal(3), _normal(3)], 17, epsilon=1e-4)


def test_group_normalization_per_channel_matches_onnxruntime():
    x = _normal(2, 8, 4, 3)
    assert_same_as_onnxruntime("GroupNormalization", [x, _normal(8), _normal(8)], opset=21, num_groups=4)


@pytest.mark.parametrize("size", [3, 5])  # onnxruntime accepts odd sizes only
def test_lrn_matches_onnxruntime(size):
    x = _normal(1, 7, 4, 4)
    assert_same_as_onnxruntime("LRN", [x], 17, size=size, alpha=1e-3, beta=0.6, bias=2.0)


def test_mean_variance_normalization_matches_onnxruntime():
    assert_same_as_onnxruntime("MeanVarianceNormalization", [_normal(2, 3, 4, 5)], opset=13, axes=[0, 2, 3])


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization_matches_onnxruntime(axis):
    x = _normal(2, 5, 16)
    scale = _normal(16) if axis == -1 else _normal(5, 16)
    assert_same_as_onnxruntime("RMSNormalization", [x, scale], opset=23, axis=axis, epsilon=1e-6)


def test_rms_normalization_float16_uses_float32_statistics():
    x, scale = (_normal(2, 64) * 30).astype(np.float16), _normal(64).astype(np.float16)
    assert_same_as_onnxruntime("RMSNormalization", [x, scale], opset=23, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("axis", "with_bias", "outputs"), [(-1, True, 1), (-1, False, 3), (2, True, 3), (1, True, 1)])
def test_layer_normalization_with_constant_weights_matches_onnxruntime(axis, with_bias, outputs):
    """Scale and bias as initializers: the kernel checks them once, when the plan is built, and
    only x on each run (runtime/kernels/normalization.py, bind_constants); over two axes (axis 1)
    it takes the general path. Two shapes in turn, as a session meets them."""
    import onnx
    from onnx import helper, numpy_helper

    from runtime import InferenceSession, SessionOptions

    width = (6, 40) if axis == 1 else (40,)
    scale, bias = _normal(*width), _normal(*width)
    names = ["x0", "scale", "bias"] if with_bias else ["x0", "scale"]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node("LayerNormalization", names, outs, axis=axis, epsilon=1e-3)
    inits = [numpy_helper.from_array(scale, "scale")] + ([numpy_helper.from_array(bias, "bias")] if with_bias else [])
    graph = helper.make_graph(
        [node], "ln", [helper.make_tensor_value_info("x0", onnx.TensorProto.FLOAT, ["a", 6, 40])],
        [helper.make_empty_tensor_value_info(name) for name in outs], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    session = InferenceSession(model, SessionOptions(graph_optimization_level="disabled"))
    (step,) = session.plan.steps
    assert (step.kernel._constant_weights is not None) == (axis != 1)
    for rows in (2, 1, 2):
        x = _normal(rows, 6, 40) * 4 + 300
        expected = run_onnxruntime(model, [x])
        for actual, want in zip(session.run(None, {"x0": x}), expected, strict=True):
            np.testing.assert_allclose(actual, want, rtol=1e-3, atol=1e-4)
