"""A custom op for both engines, as an operator of the service would provide one
(FUSIONWATCH_CUSTOM_OPS=tests.service.custom_op_plugin): `ai.onnx.contrib.Passthrough` returns its
input. Our executor gets a kernel; onnxruntime gets it through onnxruntime-extensions' Python ops."""

from __future__ import annotations

import onnx
from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op

from runtime.kernels.base import Kernel

DOMAIN = "ai.onnx.contrib"


@onnx_op(op_type="Passthrough", domain=DOMAIN, inputs=[PyCustomOpDef.dt_float], outputs=[PyCustomOpDef.dt_float])
def _passthrough(x):
    return x


class Passthrough(Kernel):
    op_type = "Passthrough"
    domain = DOMAIN
    since_version = 1

    def run(self, x):
        return (x,)


KERNELS = [Passthrough]
ORT_LIBRARIES = [get_library_path()]


def insert_before_gelu(model: onnx.ModelProto) -> onnx.ModelProto:
    """The export a model repository's CI might produce after adding a custom op between the MLP's bias
    Add and its Erf-GELU: every consumer of each Erf-GELU's input reads the Passthrough's output."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    erf_inputs = {node.input[0] for node in graph.node if node.op_type == "Erf"}
    # Erf reads x / sqrt(2): the GELU's own input is the Div's first input.
    gelu_inputs = [producers[name].input[0] for name in erf_inputs if producers[name].op_type == "Div"]
    assert gelu_inputs, "no Erf-GELU found"
    for index, x in enumerate(sorted(gelu_inputs)):
        renamed = f"{x}_custom"
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == x:
                    node.input[i] = renamed
        position = next(i for i, node in enumerate(graph.node) if x in node.output) + 1
        graph.node.insert(position, onnx.helper.make_node("Passthrough", [x], [renamed], name=f"custom_{index}", domain=DOMAIN))
    if not any(entry.domain == DOMAIN for entry in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return model
