"""Shape inference on the models onnx's own inference gives up on."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
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


def test_in_order_is_whether_each_node_comes_after_what_it_reads():
    from optimizer.shape_inference import in_order

    relu, add = helper.make_node("Relu", ["s"], ["y"]), helper.make_node("Add", ["x", "x"], ["s"])
    assert in_order(load_model(_listed([add, relu])).graph)
    assert not in_order(load_model(_listed([relu, add])).graph)
    # a node with a subgraph reads outer values its inputs do not list: left to the full check
    branch = helper.make_graph([helper.make_node("Identity", ["s"], ["out"])], "branch", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    condition = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True)))
    branching = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    assert not in_order(load_model(_listed([add, condition, branching])).graph)


def test_inferred_types_are_read_as_onnx_irs_serde_reads_them():
    import onnx_ir as ir  # the module's tests use onnx's helpers only

    from optimizer.shape_inference import read_tensor_type

    dims = helper.make_tensor_type_proto(TensorProto.FLOAT16, ["batch", 4, None])
    no_shape = helper.make_tensor_type_proto(TensorProto.INT64, None)
    scalar = helper.make_tensor_type_proto(TensorProto.BOOL, [])
    no_elem = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    no_elem.tensor_type.ClearField("elem_type")
    for proto in (dims, no_shape, scalar, no_elem):
        dtype, shape = read_tensor_type(proto)
        expected_type = ir.serde.deserialize_type_proto_for_type(proto)
        assert (None if dtype is None else ir.TensorType(dtype)) == expected_type
        expected = ir.serde.deserialize_type_proto_for_shape(proto)
        assert (shape is None) == (expected is None)
        if shape is not None:
            assert shape == expected and shape.frozen
            assert [type(d) for d in shape] == [type(d) for d in expected]
    # Left to serde: a sequence, a denoted type or dimension.
    denoted = helper.make_tensor_type_proto(TensorProto.FLOAT, ["batch"])
    denoted.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    sequence = helper.make_sequence_type_proto(dims)
    assert read_tensor_type(denoted) is None and read_tensor_type(sequence) is None


def test_a_string_constant_does_not_stop_inference():
    # onnx-ir cannot size a string tensor (its nbytes raises); the copy inference reads goes without it.
    strings = onnx.helper.make_tensor("s", onnx.TensorProto.STRING, [2], [b"a", b"b"])
    nodes = [onnx.helper.make_node("Constant", [], ["s"], value=strings), onnx.helper.make_node("Equal", ["s", "q"], ["e"]),
             onnx.helper.make_node("Cast", ["e"], ["f"], to=onnx.TensorProto.FLOAT), onnx.helper.make_node("Add", ["x", "f"], ["y"])]
    graph = onnx.helper.make_graph(
        nodes, "strings", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2]),
                           onnx.helper.make_tensor_value_info("q", onnx.TensorProto.STRING, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    for level in ("basic", "extended", "all"):
        model = ir.serde.deserialize_model(proto)
        assert optimize(model, level).report.ops_after == {"Add": 1, "Cast": 1, "Equal": 1}
        [kept] = model.graph.initializers.values()  # the folded Constant, its strings intact
        assert kept.const_value.numpy().tolist() == [b"a", b"b"]
