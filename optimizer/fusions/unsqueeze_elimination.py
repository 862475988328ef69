"""UnsqueezeElimination: Unsqueeze(constant initializer)  =>  a new, reshaped initializer.

Exporters unsqueeze weights and scalars (a bias made [1, C], a scalar made [1]); doing
it once here saves a node per use. The source initializer stays for its other readers;
ConstantFolding's cleanup does not cover it, so an initializer left unread by this rule
remains until a general cleanup removes it.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import attr, const_array, describe, input_at, opset, unique_name, value_name
from optimizer.rule import Match, Rule, fail
from optimizer.text import preview


class UnsqueezeElimination(Rule):
    name = "UnsqueezeElimination"
    anchors = ("Unsqueeze",)

    def match(self, graph: ir.Graph, unsqueeze: ir.Node):
        data = unsqueeze.inputs[0]
        if data is None or data.const_value is None or data.is_graph_input() or data.producer() is not None:
            # only initializers; Constant nodes and other constants are ConstantFolding's
            return fail("input", f"input of {describe(unsqueeze)} is not an initializer")
        if unsqueeze.outputs[0].is_graph_output():
            return fail("output", f"output of {describe(unsqueeze)} is a graph output, which must stay a computed value")
        if opset(graph) < 13:
            axes = attr(unsqueeze, "axes")
        else:
            axes_array = const_array(input_at(unsqueeze, 1))
            if axes_array is None:
                return fail("axes", f"axes '{value_name(input_at(unsqueeze, 1))}' are not constant")
            axes = [int(a) for a in axes_array.reshape(-1)]
        array = const_array(data)
        out_rank = array.ndim + len(axes)
        normalized = sorted(a + out_rank if a < 0 else a for a in axes)
        if len(set(normalized)) != len(normalized) or not all(0 <= a < out_rank for a in normalized):
            return fail("axes", f"axes {preview(axes)} are invalid for a rank-{array.ndim} input")
        for axis in normalized:
            array = array.reshape(array.shape[:axis] + (1,) + array.shape[axis:])
        name = unique_name(graph, f"{data.name}_unsqueezed")
        return Match(nodes=[unsqueeze], outputs=[unsqueeze.outputs[0]], captures={"array": array, "name": name})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.initializer(ir.Tensor(match.array, name=match.name))
