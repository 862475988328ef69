"""Shape inference on the models onnx's own inference gives up on."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from optimizer.model_io import load_model
from optimizer.shape_inference import infer_shapes


def _model(opset_imports):
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="/ln"),
        helper.make_node("Relu", ["ln"], ["y"], name="/relu"),
        helper.make_node("Gelu", ["x"], ["side"], name="/gelu", domain="com.microsoft"),
    ]
    inits = [numpy_helper.from_array(np.ones(8, np.float32), n) for n in ("g", "b")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "side")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=opset_imports)


def _shapes(model):
    ir_model = load_model(model)
    infer_shapes(ir_model)
    return {v.name: v.shape for node in ir_model.graph for v in node.outputs}


def test_onnxruntimes_layer_norm_below_opset_17_keeps_its_input_shape():
    # onnxruntime's own LayerNormalization (opset < 17) has no onnx shape function; without one,
    # nothing after it had a shape (ORT's gpt2_one_layer.onnx, opset 11).
    shapes = _shapes(_model([helper.make_opsetid("", 11), helper.make_opsetid("com.microsoft", 1)]))
    assert [str(d) for d in shapes["ln"]] == ["batch", "8"]
    assert [str(d) for d in shapes["y"]] == ["batch", "8"]


def test_a_forgotten_com_microsoft_import_does_not_sink_inference():
    # onnxruntime's fusion test models use com.microsoft ops without importing the domain.
    shapes = _shapes(_model([helper.make_opsetid("", 17)]))
    assert [str(d) for d in shapes["y"]] == ["batch", "8"]


def _listed(nodes):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_graph_listed_out_of_order_still_gets_its_shapes():
    # onnx infers in the listed order: the copy it gets is put in order where ours is not, and
    # left as it is where ours is (the check runs on our graph, not on the serialized copy).
    relu, add = helper.make_node("Relu", ["s"], ["y"]), helper.make_node("Add", ["x", "x"], ["s"])
    for nodes in ([relu, add], [add, relu]):
        shapes = _shapes(_listed(nodes))
        assert [str(d) for d in shapes["y"]] == ["batch", "8"], [n.op_type for n in nodes]
