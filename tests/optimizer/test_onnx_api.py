"""call_onnx hands onnx the graph without its weights and leaves the model as it was, even when
serializing it fails (onnx-ir's call_onnx_api serializes outside its try, and left every initializer
a graph input with the large weights gone)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from optimizer.onnx_api import call_onnx


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
