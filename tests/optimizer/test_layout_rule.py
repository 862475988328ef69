"""NhwcTransformer (the `layout` level): exact op counts, where it stays off, and numerics.

The optimized graphs hold com.fusionwatch pools and com.microsoft.NhwcFusedConv, which the
x86 onnxruntime wheel has no float kernel for, so they run on our runtime; the oracle is
onnxruntime on the *original* model with graph optimizations off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from optimizer.fusions.nhwc_conv_layout import MIN_CONVOLUTIONS
from runtime import InferenceSession, SessionOptions

RESNET_TINY = Path(__file__).parents[1] / "models" / "resnet_tiny_opset17.onnx"
RTOL, ATOL = 1e-3, 1e-4
rng = np.random.default_rng(0)


def reference(model: onnx.ModelProto | Path, feeds: dict) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_layout_matches_reference(model, feeds):
    session = InferenceSession(
        model if isinstance(model, Path) else model.SerializeToString(),
        SessionOptions(graph_optimization_level="layout"),
    )
    for actual, expected in zip(session.run(None, feeds), reference(model, feeds), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def conv(name, x, out, c_in, c_out, k=3, **attributes):
    """A Conv node with its initializers (weights scaled to keep activations O(1))."""
    w = numpy_helper.from_array(
        (rng.standard_normal((c_out, c_in // attributes.get("group", 1), k, k)) * 0.3).astype(np.float32),
        f"{name}_w",
    )
    b = numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), f"{name}_b")
    pads = [k // 2] * 4
    return helper.make_node("Conv", [x, w.name, b.name], [out], name=name, pads=pads, **attributes), [w, b]


def model(nodes, initializers, inputs, outputs):
    graph = helper.make_graph(nodes, "layout", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def image(name, c, h=8, w=8):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, h, w])


def nhwc_ops(report) -> dict[str, int]:
    return {op: n for op, n in report.ops_after.items() if op == "Transpose" or "Nhwc" in op}


# --- the tiny ResNet fixture ---------------------------------------------------------------
@pytest.mark.parametrize("level", ["layout", "all"])
def test_resnet_tiny_runs_channels_last_with_a_transpose_at_each_edge(level):
    report = optimize(RESNET_TINY, level=level).report
    # 9 convolutions (5 FusedConv from ConvActivationFusion, 4 Conv of which 2 take their
    # block's Add and Relu as residual Z + activation), MaxPool, GlobalAveragePool; one
    # Transpose into the region (pixel_values) and one out per graph output.
    assert report.ops_after == {
        "Transpose": 3,
        "com.fusionwatch.NhwcGlobalAveragePool": 1,
        "com.fusionwatch.NhwcMaxPool": 1,
        "com.microsoft.NhwcFusedConv": 9,
    }
    assert report.rules["NhwcTransformer"].fired == 1
    assert report.fusions == {  # the edge Transposes are helpers, not fusions
        "com.fusionwatch.NhwcGlobalAveragePool": 1,
        "com.fusionwatch.NhwcMaxPool": 1,
        "com.microsoft.NhwcFusedConv": 9,
    }


def test_resnet_tiny_extended_level_stays_nchw():
    report = optimize(RESNET_TINY, level="extended").report
    assert nhwc_ops(report) == {}
    assert report.ops_after["com.microsoft.FusedConv"] == 5


def test_resnet_tiny_layout_numerics_match_onnxruntime():
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    assert_layout_matches_reference(RESNET_TINY, {"pixel_values": x})


def test_graph_outputs_keep_their_names_and_shapes():
    result = optimize(RESNET_TINY, level="layout")
    outputs = {v.name: list(v.shape) for v in result.model.graph.outputs}
    assert [str(d) for d in outputs["last_hidden_state"]] == ["batch", "32", "4", "4"]
    assert [str(d) for d in outputs["pooler_output"]] == ["batch", "32", "1", "1"]


def test_disabled_by_its_onnx_runtime_name():
    report = optimize(RESNET_TINY, level="layout", disabled=["NhwcTransformer"]).report
    assert nhwc_ops(report) == {}


# --- where it stays off ----------------------------------------------------------------------
def test_a_lone_conv_stays_nchw():
    node, inits = conv("c0", "x", "c0_out", 3, 4)
    relu = helper.make_node("Relu", ["c0_out"], ["y"], name="r0")
    pool = helper.make_node("MaxPool", ["y"], ["z"], name="p0", kernel_shape=[2, 2], strides=[2, 2])
    m = model(
        [node, relu, pool],
        inits,
        [image("x", 3)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    report = optimize(m, level="layout").report
    assert MIN_CONVOLUTIONS == 2
    assert report.ops_after == {"MaxPool": 1, "com.microsoft.FusedConv": 1}
    assert report.rules["NhwcTransformer"].fired == 0


def test_grouped_conv_stays_nchw_and_splits_the_region():
    c0, i0 = conv("c0", "x", "a", 8, 8)
    c1, i1 = conv("c1", "a", "b", 8, 8, group=2)  # grouped, not depthwise: measured slower in NHWC
    c2, i2 = conv("c2", "b", "y", 8, 8)
    m = model(
        [c0, c1, c2],
        i0 + i1 + i2,
        [image("x", 8)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    report = optimize(m, level="layout").report
    assert report.ops_after == {"Conv": 3}  # each side holds a single convolution
    assert report.rules["NhwcTransformer"].fired == 0


# --- what a region may hold ----------------------------------------------------------------------
def test_depthwise_chain_with_per_channel_constants_converts():
    c0, i0 = conv("c0", "x", "a", 3, 6)
    relu = helper.make_node("Relu", ["a"], ["r"], name="relu")
    scale = numpy_helper.from_array(rng.standard_normal((6, 1, 1)).astype(np.float32), "scale")
    shift = numpy_helper.from_array(rng.standard_normal((1, 6, 1, 1)).astype(np.float32), "shift")
    mul = helper.make_node("Mul", ["r", "scale"], ["m"], name="mul")
    add = helper.make_node("Add", ["shift", "m"], ["s"], name="add")
    c1, i1 = conv("c1", "s", "d", 6, 6, group=6)
    c2, i2 = conv("c2", "d", "y", 6, 4, k=1)
    m = model(
        [c0, relu, mul, add, c1, c2],
        i0 + i1 + i2 + [scale, shift],
        [image("x", 3)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    report = optimize(m, level="layout").report
    assert nhwc_ops(report) == {"Transpose": 2, "com.microsoft.NhwcFusedConv": 3}
    assert report.ops_after["Mul"] == 1 and report.ops_after["Add"] == 1
    assert_layout_matches_reference(m, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})


def test_residual_add_and_relu_become_z_and_activation():
    c0, i0 = conv("c0", "x", "a", 4, 4)
    c1, i1 = conv("c1", "a", "b", 4, 4)
    add = helper.make_node("Add", ["b", "x"], ["s"], name="add")  # residual from the graph input
    relu = helper.make_node("Relu", ["s"], ["y"], name="relu")
    m = model(
        [c0, c1, add, relu],
        i0 + i1,
        [image("x", 4)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    result = optimize(m, level="layout")
    # c0 feeds a Conv, not an Add, so it stays as it is; c1 + Add + Relu become one node with Z.
    assert nhwc_ops(result.report) == {"Transpose": 2, "com.microsoft.NhwcFusedConv": 2}
    fused = [n for n in result.model.graph if n.op_type == "NhwcFusedConv" and len(n.inputs) == 4]
    assert len(fused) == 1 and fused[0].attributes["activation"].value == "Relu"
    # The input's Transpose is shared by c0 and the residual.
    assert fused[0].inputs[3].producer().op_type == "Transpose"
    assert_layout_matches_reference(m, {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)})


def test_residual_after_folded_padding_with_a_symbolic_batch_becomes_z():
    # TorchScript's TF-style "same" padding (MobileNetV2): pads computed by a chain onnx's inference
    # does not evaluate (Transpose, Reshape of constants), so the first inference names no size after
    # the Pad, nor its batch as the input's. Folded, with only the batch symbolic, a second inference
    # names them, which the residual's same-shape check needs.
    halves = numpy_helper.from_array(np.array([[0, 0], [0, 0], [1, 1], [1, 1]], np.int64), "halves")
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    begin_end = helper.make_node("Transpose", ["halves"], ["begin_end"], name="begin_end", perm=[1, 0])
    pads = helper.make_node("Reshape", ["begin_end", "flat"], ["pads"], name="pads")
    pad = helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad")
    c0, i0 = conv("c0", "padded", "a", 4, 4)
    c0.attribute[0].CopyFrom(helper.make_attribute("pads", [0, 0, 0, 0]))  # the Pad's instead
    c1, i1 = conv("c1", "a", "b", 4, 4)
    relu = helper.make_node("Relu", ["x"], ["r"], name="relu_in")
    add = helper.make_node("Add", ["b", "r"], ["s"], name="add")
    batch_image = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])
    m = model([begin_end, pads, pad, relu, c0, c1, add], i0 + i1 + [halves, flat], [batch_image],
              [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)])
    result = optimize(m, level="layout")
    fused = [n for n in result.model.graph if n.op_type == "NhwcFusedConv" and len(n.inputs) == 4]
    assert len(fused) == 1 and "Add" not in result.report.ops_after
    assert_layout_matches_reference(m, {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)})


def test_intermediate_graph_output_is_transposed_back_too():
    c0, i0 = conv("c0", "x", "a", 3, 4)
    c1, i1 = conv("c1", "a", "y", 4, 4)
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "y")]
    m = model([c0, c1], i0 + i1, [image("x", 3)], outputs)
    report = optimize(m, level="layout").report
    assert nhwc_ops(report) == {"Transpose": 3, "com.microsoft.NhwcFusedConv": 2}
    assert_layout_matches_reference(m, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})


def test_back_to_back_transposes_cancel():
    # An NHWC graph input, transposed to NCHW for two convolutions, then back to NHWC and
    # through a Relu: both existing transposes cancel against the region's own.
    to_nchw = helper.make_node("Transpose", ["x"], ["x_nchw"], name="t_in", perm=[0, 3, 1, 2])
    c0, i0 = conv("c0", "x_nchw", "a", 3, 4)
    c1, i1 = conv("c1", "a", "b", 4, 4)
    to_nhwc = helper.make_node("Transpose", ["b"], ["b_nhwc"], name="t_out", perm=[0, 2, 3, 1])
    relu = helper.make_node("Relu", ["b_nhwc"], ["y"], name="relu")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 3])
    m = model(
        [to_nchw, c0, c1, to_nhwc, relu],
        i0 + i1,
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    report = optimize(m, level="layout").report
    assert nhwc_ops(report) == {"com.microsoft.NhwcFusedConv": 2}
    assert report.ops_after["Relu"] == 1
    assert_layout_matches_reference(m, {"x": rng.standard_normal((1, 8, 8, 3)).astype(np.float32)})
