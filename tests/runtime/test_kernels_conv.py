"""The conv family against ONNX's backend node test cases."""

from __future__ import annotations

import pytest

from runtime.kernels import conv
from runtime.kernels.base import UnsupportedOp
from tests.runtime.node_cases import assert_matches, node_cases, run_case

CASES = list(node_cases(conv.KERNELS))


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_node_case(case):
    try:
        results = run_case(case)
    except UnsupportedOp as declined:
        pytest.skip(f"declined: {declined}")
    assert len(results) == len(case.outputs)
    for actual, expected in zip(results, case.outputs, strict=True):
        assert_matches(case.name, actual, expected, case.rtol, case.atol)


# ---------------------------------------------------------------- against onnxruntime
# The conformance suite has 17 Conv/ConvTranspose cases, all tiny; these cover the paths the
# kernel chooses between (pointwise, depthwise, grouped im2col) at realistic shapes.

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime  # noqa: E402
from onnx import helper  # noqa: E402

from runtime.kernels import registry  # noqa: E402


def run_with_onnxruntime(op_type, inputs, opset=17, outputs=1, output_dtypes=None, **attributes):
    """One node run by onnxruntime with graph optimizations off; its outputs in order.
    Outputs are declared with `output_dtypes`, by default the first input's type (MaxPool's
    Indices int64)."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, out_names, **attributes)
    graph = helper.make_graph(
        [node],
        "single",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
            for n, x in zip(names, inputs, strict=True)
            if x is not None
        ],
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
            for n, t in zip(
                out_names, output_dtypes or _default_output_dtypes(op_type, inputs, outputs), strict=True
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feeds = {n: x for n, x in zip(names, inputs, strict=True) if x is not None}
    return session.run(None, feeds), model


def _default_output_dtypes(op_type, inputs, outputs):
    first = inputs[0].dtype
    return [np.int64 if op_type == "MaxPool" and i == 1 else first for i in range(outputs)]


def run_with_kernel(model: onnx.ModelProto, inputs):
    ir_model = ir.serde.deserialize_model(model)
    node = next(iter(ir_model.graph))
    opset = ir_model.opset_imports[""]
    kernel = registry.find_kernel("", node.op_type, opset)(node, opset)
    return kernel.run(*inputs)


def assert_kernel_matches_onnxruntime(
    op_type, inputs, opset=17, outputs=1, output_dtypes=None, rtol=1e-3, atol=1e-4, **attributes
):
    expected, model = run_with_onnxruntime(op_type, inputs, opset, outputs, output_dtypes, **attributes)
    actual = run_with_kernel(model, inputs)
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, (
            got.dtype,
            got.shape,
            want.dtype,
            want.shape,
        )
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


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
    assert_kernel_matches_onnxruntime("Conv", [x, w, b] if with_bias else [x, w], **attributes)


def test_conv_float16_is_computed_in_float32_and_cast_back():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float16)
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float16)
    assert_kernel_matches_onnxruntime("Conv", [x, w], rtol=1e-2, atol=1e-2, pads=[1, 1, 1, 1])


def test_conv_never_writes_into_its_inputs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    before = [a.copy() for a in (x, w, b)]
    _, model = run_with_onnxruntime("Conv", [x, w, b], group=4, pads=[1, 1, 1, 1])
    run_with_kernel(model, [x, w, b])
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
    assert_kernel_matches_onnxruntime("ConvTranspose", [x, w, b], **attributes)
