"""onnx's C++ functions (shape inference) called on our onnx-ir model, leaving the model as it was.

onnx's functions take a serialized ModelProto, and serializing a model's weights costs more than
inferring its graph (and cannot be done at all above 2 GB). So the call gets the graph with every
initializer turned into a graph input (typed and shaped, as inference needs) and the values of those
over BIG_TENSOR_BYTES left out; small ones stay, since shape arithmetic reads them. Whatever happens
(serializing can fail too: a lazily packed weight whose computation raises), the model gets its
inputs, initializers and weights back, and the error goes through.

onnx-ir's own helper for this is private, and restores nothing when serializing fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import onnx
import onnx_ir as ir

_R = TypeVar("_R")

BIG_TENSOR_BYTES = 1000  # values above this are left out of the serialized copy


def call_onnx(func: Callable[[onnx.ModelProto], _R], model: ir.Model) -> _R:
    graph = model.graph
    inputs = list(graph.inputs)
    initializers = [(value, value.const_value) for value in graph.initializers.values()]
    try:
        for value, tensor in initializers:
            if tensor is not None:
                value.shape = value.shape if value.shape is not None else tensor.shape
                value.dtype = value.dtype if value.dtype is not None else tensor.dtype
            if value not in graph.inputs:
                graph.inputs.append(value)
            if tensor is None or tensor.nbytes > BIG_TENSOR_BYTES:
                value.const_value = None
                graph.initializers.pop(value.name)
        return func(ir.serde.serialize_model(model))
    finally:
        for value, tensor in initializers:
            value.const_value = tensor
            if value.name not in graph.initializers:
                graph.initializers.add(value)
        graph.inputs.clear()
        graph.inputs.extend(inputs)
