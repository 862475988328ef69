"""onnx's C++ functions (shape inference) called on our onnx-ir model, leaving the model as it was.

onnx-ir's `call_onnx_api` hands onnx the graph without its large weights: it turns every
initializer into a graph input, takes the weights over 1 KB out, serializes, calls, and puts
everything back. It serializes before its `try`, so when serializing fails (a lazily packed
weight whose computation raises, say) the model keeps every initializer as a graph input with
its large weights gone, and every rule after that sees no constants. This wrapper puts the
inputs, initializers and weights back whatever fails, and lets the error through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import onnx
import onnx_ir as ir
from onnx_ir.passes.common._c_api_utils import call_onnx_api

_R = TypeVar("_R")


def call_onnx(func: Callable[[onnx.ModelProto], _R], model: ir.Model) -> _R:
    graph = model.graph
    inputs = list(graph.inputs)
    initializers = [(value, value.const_value) for value in graph.initializers.values()]
    try:
        return call_onnx_api(func, model)
    except BaseException:
        for value, tensor in initializers:
            value.const_value = tensor
            if value.name not in graph.initializers:
                graph.initializers.add(value)
        graph.inputs.clear()
        graph.inputs.extend(inputs)
        raise
