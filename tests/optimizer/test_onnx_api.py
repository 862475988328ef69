"""call_onnx hands onnx the graph without its weights and leaves the model as it was, even when
serializing it fails (onnx-ir's call_onnx_api serializes outside its try, and left every initializer
a graph input with the large weights gone)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from optimizer.onnx_api import call_onnx, serialize_for_inference
from tests.oracle import MODELS


def _model(broken: bool) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4, 512]))
    big = ir.Value(name="big", const_value=ir.tensor(np.ones((512,), np.float32), name="big"))  # 2 KB: taken out

    def fail() -> ir.Tensor:
        raise ValueError("this weight cannot be computed")

    small = ir.Value(name="small", const_value=ir.LazyTensor(
        fail if broken else (lambda: ir.tensor(np.ones((4, 1), np.float32))), dtype=ir.DataType.FLOAT,
        shape=ir.Shape([4, 1])))  # 16 bytes: serialized, so computed
    add = ir.node("Add", [x, big])
    mul = ir.node("Mul", [add.outputs[0], small])
    graph = ir.Graph([x], mul.outputs, nodes=[add, mul], initializers=[big, small], opset_imports={"": 17})
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize("broken", [False, True])
def test_the_model_is_left_as_it_was(broken):
    model = _model(broken)
    graph = model.graph
    inputs, initializers = list(graph.inputs), dict(graph.initializers)
    tensors = {name: value.const_value for name, value in initializers.items()}
    if broken:
        with pytest.raises(Exception, match="serialize"):
            call_onnx(lambda proto: proto, model)
    else:
        proto = call_onnx(lambda proto: proto, model)
        assert {i.name for i in proto.graph.input} == {"x", "big", "small"}  # what onnx was handed
    assert list(graph.inputs) == inputs
    assert dict(graph.initializers) == initializers
    assert {name: value.const_value for name, value in graph.initializers.items()} == tensors
    assert not any(value.is_graph_input() for value in initializers.values())


def _model_for_inference() -> ir.Model:
    """Every part of a graph onnx's inference reads: attributes of each kind (a subgraph too), a
    missing optional input, a trailing unnamed output, typed intermediate values, an initializer
    that is not an input; and what it does not (metadata, doc strings)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", 4]))
    axes = ir.Value(name="axes", const_value=ir.tensor(np.array([0], np.int64), name="axes"))
    const = ir.node("Constant", [], attributes={"value": ir.tensor(np.ones((1, 4), np.float32))})
    add = ir.node("Add", [x, const.outputs[0]], name="add", doc_string="not read by inference")
    add.metadata_props["pkg.torch.onnx.stack_trace"] = "not read by inference"
    add.outputs[0].name, add.outputs[0].shape = "sum", ir.Shape(["batch", 4])
    add.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    clip = ir.node("Clip", [add.outputs[0], None, None])
    drop = ir.node("Dropout", [clip.outputs[0]], num_outputs=2, attributes={"seed": 3})
    drop.outputs[0].name = "dropped"
    squeeze = ir.node("Unsqueeze", [drop.outputs[0], axes])
    then_out = ir.Value(name="then_out")
    then_graph = ir.Graph([], [then_out], nodes=[ir.node("Identity", [x], outputs=[then_out])], name="then")
    else_out = ir.Value(name="else_out")
    else_graph = ir.Graph([], [else_out], nodes=[ir.node("Identity", [x], outputs=[else_out])], name="else")
    flag = ir.Value(name="flag", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    branch = ir.node("If", [flag], attributes={"then_branch": then_graph, "else_branch": else_graph})
    cast = ir.node("Cast", [squeeze.outputs[0]], attributes={"to": 10}, domain="")
    mean = ir.node("ReduceMean", [cast.outputs[0]], attributes={"axes": [1], "keepdims": 0, "note": "text",
                                                                 "alpha": 0.5})
    graph = ir.Graph([x, flag], [mean.outputs[0], branch.outputs[0]],
                     nodes=[const, add, clip, drop, squeeze, branch, cast, mean],
                     initializers=[axes], opset_imports={"": 12}, name="main")
    drop.outputs[1].name = ""  # the graph names every value it is given; the mask stays unnamed
    return ir.Model(graph, ir_version=8, producer_name="test")


def _without_what_inference_ignores(proto) -> bytes:
    for field in ("producer_name", "producer_version", "doc_string", "metadata_props"):
        proto.ClearField(field)
    for field in ("metadata_props", "doc_string"):
        proto.graph.ClearField(field)
    for node in proto.graph.node:
        node.ClearField("metadata_props")
        node.ClearField("doc_string")
    return proto.SerializeToString()


def test_the_copy_for_inference_is_what_onnx_irs_serializer_writes_but_metadata():
    model = _model_for_inference()
    ours = serialize_for_inference(model)
    assert not ours.graph.node[1].metadata_props and not ours.graph.node[1].doc_string
    assert list(ours.graph.node[3].output) == ["dropped"]  # the trailing unnamed mask is left out
    assert _without_what_inference_ignores(ours) == _without_what_inference_ignores(ir.serde.serialize_model(model))


@pytest.mark.parametrize("path", sorted(MODELS.rglob("*.onnx")), ids=lambda p: str(p.relative_to(MODELS)))
def test_the_copy_for_inference_of_each_fixture_is_what_onnx_irs_serializer_writes(path):
    """Loaded models hold their Constants' tensors as protos, which the copy writes as they are."""
    model = ir.load(path)
    ours = serialize_for_inference(model)
    assert _without_what_inference_ignores(ours) == _without_what_inference_ignores(ir.serde.serialize_model(model))
