"""Graphs for ONNX Runtime's Level1: eliminations, constant folding and standard-op fusions."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _basic_model(nodes, inputs, outputs, initializers=(), *, opset=17):
    """The model, with output shapes left as None filled in by onnx shape inference."""
    graph = helper.make_graph(nodes, "basic", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]  # as inner values, the outputs get their types inferred
    for output in model.graph.output:
        probe.graph.node.append(helper.make_node("Identity", [output.name], [output.name + "__probe"]))
        probe.graph.output.append(helper.make_tensor_value_info(output.name + "__probe", TensorProto.FLOAT, None))
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(probe).graph.value_info}
    for output in model.graph.output:
        if not output.type.tensor_type.HasField("shape") and output.name in inferred:
            output.type.CopyFrom(inferred[output.name].type)
    return model


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def identity_chain(*, passthrough=False, identity_on_output=False):
    """x -> Relu -> Identity -> Relu -> y; optionally an Identity straight from input to output,
    or an Identity whose output is the graph output."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu0"),
        helper.make_node("Identity", ["r"], ["i"], name="/Identity"),
        helper.make_node("Relu", ["i"], ["y"], name="/relu1"),
    ]
    outputs = [_f32("y", [2, 8])]
    if passthrough:
        nodes.append(helper.make_node("Identity", ["x"], ["x_copy"], name="/Passthrough"))
        outputs.append(_f32("x_copy", [2, 8]))
    if identity_on_output:
        nodes.append(helper.make_node("Identity", ["y"], ["y_named"], name="/OutputIdentity"))
        outputs = [_f32("y_named", [2, 8])] + outputs[1:]
    return _basic_model(nodes, [_f32("x", [2, 8])], outputs)


def dropout(*, mask_used=False, training=None, opset=17):
    """x -> Relu -> Dropout -> Relu; the mask may be read, training_mode may be given."""
    inputs = ["r", "ratio"] + (["training"] if training is not None else [])
    outputs = ["d", "mask"] if mask_used else ["d"]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu0"),
        helper.make_node("Dropout", inputs, outputs, name="/Dropout"),
        helper.make_node("Relu", ["d"], ["y"], name="/relu1"),
    ]
    graph_outputs = [_f32("y", [2, 8])]
    if mask_used:
        nodes.append(helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT, name="/mask_cast"))
        graph_outputs.append(_f32("mask_f", [2, 8]))
    inits = [_init("ratio", np.array(0.1, np.float32))]
    graph_inputs = [_f32("x", [2, 8])]
    if training == "input":
        graph_inputs.append(helper.make_tensor_value_info("training", TensorProto.BOOL, []))
    elif training is not None:
        inits.append(_init("training", np.array(training)))
    return _basic_model(nodes, graph_inputs, graph_outputs, inits, opset=opset)


def slice_model(*, starts=(0,), ends=(2**31 - 1,), axes=(1,), steps=(1,), shape=(2, 8)):
    """x -> Relu -> Slice(starts, ends, axes, steps) -> Relu."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu0"),
        helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["s"], name="/Slice"),
        helper.make_node("Relu", ["s"], ["y"], name="/relu1"),
    ]
    inits = [_init(n, np.array(v, np.int64)) for n, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    return _basic_model(nodes, [_f32("x", list(shape))], [_f32("y", None)], inits)


def unsqueeze_initializer(*, axes=(0,), opset=17, dynamic_axes=False):
    """y = x + Unsqueeze(bias[8], axes): a bias made [1, 8] by the exporter."""
    rng = np.random.default_rng(1)
    inits = [_init("bias", rng.standard_normal(8).astype(np.float32))]
    inputs = [_f32("x", [2, 8])]
    if opset >= 13:
        if dynamic_axes:
            inputs.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [len(axes)]))
        else:
            inits.append(_init("axes", np.array(axes, np.int64)))
        unsqueeze = helper.make_node("Unsqueeze", ["bias", "axes"], ["b2"], name="/Unsqueeze")
    else:
        unsqueeze = helper.make_node("Unsqueeze", ["bias"], ["b2"], axes=list(axes), name="/Unsqueeze")
    nodes = [unsqueeze, helper.make_node("Add", ["x", "b2"], ["y"], name="/Add")]
    return _basic_model(nodes, inputs, [_f32("y", [2, 8])], inits, opset=opset)


def relu_clip(*, order="relu_clip", low=-1.0, high=6.0, opset=17, dynamic_min=False):
    """Relu -> Clip or Clip -> Relu (min/max as inputs from opset 11, attributes before)."""
    clip_inputs, inits, inputs = ["a"], [], [_f32("x", [2, 8])]
    attrs = {}
    if opset >= 11:
        if dynamic_min:
            inputs.append(_f32("lo", []))
        elif low is not None:
            inits.append(_init("lo", np.array(low, np.float32)))
        clip_inputs.append("lo" if (low is not None or dynamic_min) else "")
        if high is not None:
            inits.append(_init("hi", np.array(high, np.float32)))
            clip_inputs.append("hi")
    else:
        attrs = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
    if order == "relu_clip":
        nodes = [helper.make_node("Relu", ["x"], ["a"], name="/Relu"),
                 helper.make_node("Clip", clip_inputs, ["y"], name="/Clip", **attrs)]
    else:
        clip_inputs[0] = "x"
        nodes = [helper.make_node("Clip", clip_inputs, ["a"], name="/Clip", **attrs),
                 helper.make_node("Relu", ["a"], ["y"], name="/Relu")]
    return _basic_model(nodes, inputs, [_f32("y", [2, 8])], inits, opset=opset)


def conv_then(op, *, operand_shape=(4, 1, 1), operand="const", conv_bias=True, weights="const"):
    """Conv(x[1,3,6,6], W[4,3,3,3]) -> Add/Mul(operand): a per-channel operand by default."""
    rng = np.random.default_rng(2)
    inits = [_init("b", rng.standard_normal(4).astype(np.float32))]
    inputs = [_f32("x", [1, 3, 6, 6])]
    if weights == "const":
        inits.append(_init("W", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)))
    else:
        inputs.append(_f32("W", [4, 3, 3, 3]))
    if operand == "const":
        inits.append(_init("c", (rng.standard_normal(operand_shape) + 1.5).astype(np.float32)))
    else:
        inputs.append(_f32("c", list(operand_shape)))
    conv_inputs = ["x", "W", "b"] if conv_bias else ["x", "W"]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["conv"], pads=[1, 1, 1, 1], name="/conv/Conv"),
        helper.make_node(op, ["conv", "c"], ["y"], name=f"/conv/{op}"),
    ]
    return _basic_model(nodes, inputs, [_f32("y", None)], inits)


def conv_bn(*, conv_bias=True, dynamic_mean=False):
    """Conv(x[1,3,6,6]) -> BatchNormalization with constant (or one dynamic) parameters."""
    rng = np.random.default_rng(3)
    inits = [
        _init("W", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
        _init("b", rng.standard_normal(4).astype(np.float32)),
        _init("scale", (rng.random(4) + 0.5).astype(np.float32)),
        _init("bias", rng.standard_normal(4).astype(np.float32)),
        _init("var", (rng.random(4) + 0.5).astype(np.float32)),
    ]
    inputs = [_f32("x", [1, 3, 6, 6])]
    if dynamic_mean:
        inputs.append(_f32("mean", [4]))
    else:
        inits.append(_init("mean", rng.standard_normal(4).astype(np.float32)))
    nodes = [
        helper.make_node("Conv", ["x", "W", "b"] if conv_bias else ["x", "W"], ["conv"], pads=[1, 1, 1, 1], name="/conv/Conv"),
        helper.make_node("BatchNormalization", ["conv", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3, name="/bn/BatchNormalization"),
    ]
    return _basic_model(nodes, inputs, [_f32("y", None)], inits)


def matmul_add(*, a_shape=(4, 8), bias_shape=(16,), bias_first=False, extra_consumer=False):
    """MatMul(A, B[8,16]) + C; C may come first; the MatMul may feed a second node."""
    rng = np.random.default_rng(4)
    inits = [
        _init("B", rng.standard_normal((8, 16)).astype(np.float32)),
        _init("C", rng.standard_normal(bias_shape).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["A", "B"], ["mm"], name="/fc/MatMul"),
        helper.make_node("Add", ["C", "mm"] if bias_first else ["mm", "C"], ["y"], name="/fc/Add"),
    ]
    outputs = [_f32("y", None)]
    if extra_consumer:
        nodes.append(helper.make_node("Relu", ["mm"], ["side"], name="/side/Relu"))
        outputs.append(_f32("side", None))
    return _basic_model(nodes, [_f32("A", list(a_shape))], outputs, inits)


def reshape_from_shape(*, extra_runtime=False, dims=("batch", "seq", 64)):
    """The exporters' split-heads reshape: x[batch, seq, 64] -> [batch, seq, 4, 16], its target
    built as Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [4], [16]).
    With extra_runtime, the 4 is also computed at run time (from a second input's length)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
        helper.make_node("Gather", ["shape", "i0"], ["d0"], axis=0, name="/Gather0"),
        helper.make_node("Gather", ["shape", "i1"], ["d1"], axis=0, name="/Gather1"),
        helper.make_node("Unsqueeze", ["d0", "axes0"], ["u0"], name="/Unsqueeze0"),
        helper.make_node("Unsqueeze", ["d1", "axes0"], ["u1"], name="/Unsqueeze1"),
    ]
    inputs = [_f32("x", list(dims))]
    pieces = ["u0", "u1", "heads", "size"]
    inits = [
        _init("i0", np.array(0, np.int64)), _init("i1", np.array(1, np.int64)), _init("axes0", np.array([0], np.int64)),
        _init("heads", np.array([4], np.int64)), _init("size", np.array([16], np.int64)),
    ]
    if extra_runtime:
        inputs.append(helper.make_tensor_value_info("h", TensorProto.INT64, ["n"]))
        nodes.append(helper.make_node("Shape", ["h"], ["heads_rt"], name="/ShapeH"))
        pieces[2] = "heads_rt"
        inits[-1] = _init("size", np.array([-1], np.int64))
    nodes += [
        helper.make_node("Concat", pieces, ["target"], axis=0, name="/Concat"),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="/Reshape"),
    ]
    return _basic_model(nodes, inputs, [_f32("y", None)], inits, opset=14)


def constant_subgraph(*, fill_elements=16, random=False):
    """Exporter-style constant arithmetic feeding an Add: Constant -> Cast -> Range -> Unsqueeze,
    Shape of a static tensor -> Gather -> Mul, and a ConstantOfShape fill of `fill_elements`."""
    nodes = [
        helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array(8, np.int64)), name="/Constant"),
        helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT, name="/Cast"),
        helper.make_node("Range", ["zero", "n_f", "one"], ["ramp"], name="/Range"),
        helper.make_node("Unsqueeze", ["ramp", "axes0"], ["ramp2"], name="/Unsqueeze"),
        helper.make_node("Shape", ["x"], ["xs"], name="/Shape"),
        helper.make_node("Gather", ["xs", "i1"], ["cols"], axis=0, name="/Gather"),
        helper.make_node("Cast", ["cols"], ["cols_f"], to=TensorProto.FLOAT, name="/Cast_1"),
        helper.make_node("Div", ["ramp2", "cols_f"], ["scaled"], name="/Div"),
        helper.make_node("Add", ["x", "scaled"], ["y0"], name="/Add"),
        helper.make_node("ConstantOfShape", ["fill_shape"], ["fill"], value=numpy_helper.from_array(np.array([0.5], np.float32)), name="/ConstantOfShape"),
        helper.make_node("ReduceSum", ["fill"], ["fill_sum"], keepdims=0, name="/ReduceSum"),
        helper.make_node("Add", ["y0", "fill_sum"], ["y"], name="/Add_1"),
    ]
    inits = [
        _init("zero", np.array(0.0, np.float32)), _init("one", np.array(1.0, np.float32)),
        _init("axes0", np.array([0], np.int64)), _init("i1", np.array(1, np.int64)),
        _init("fill_shape", np.array([fill_elements], np.int64)),
    ]
    if random:
        nodes.append(helper.make_node("RandomNormal", [], ["noise"], shape=[2, 8], seed=1.0, name="/RandomNormal"))
        nodes.append(helper.make_node("Mul", ["noise", "zero"], ["zeroed"], name="/Mul_noise"))
        nodes[-3] = helper.make_node("Add", ["y0", "fill_sum"], ["y1"], name="/Add_1")
        nodes.append(helper.make_node("Add", ["y1", "zeroed"], ["y"], name="/Add_2"))
    return _basic_model(nodes, [_f32("x", [2, 8])], [_f32("y", [2, 8])], inits)
