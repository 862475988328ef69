"""Our CommonSubexpressionElimination merges exactly what onnx-ir's pass merges, keeping the same nodes.

The rule reimplements the pass for speed (its module says why); onnx-ir's pass is the oracle here:
the same graph after either must serialize to the same bytes.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import CommonSubexpressionEliminationPass

from optimizer.fusions.common_subexpression_elimination import eliminate_common_subexpressions
from tests.oracle import MODELS

MODEL_FILES = sorted(MODELS.rglob("*.onnx"))


def _both(proto: onnx.ModelProto) -> tuple[bytes, bytes]:
    ours, theirs = ir.serde.deserialize_model(proto), ir.serde.deserialize_model(proto)
    eliminate_common_subexpressions(ours.graph)
    CommonSubexpressionEliminationPass()(theirs)
    return ir.to_proto(ours).SerializeToString(), ir.to_proto(theirs).SerializeToString()


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: str(p.relative_to(MODELS)))
def test_same_as_onnx_ir_on_the_fixtures(path):
    ours, theirs = _both(onnx.load(str(path)))
    assert ours == theirs


def _model(nodes, outputs, initializers=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph(nodes, "g", [x], outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _out(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def test_same_as_onnx_ir_on_attributes_outputs_and_skips():
    small = numpy_helper.from_array(np.ones(3, np.float32))
    large = numpy_helper.from_array(np.ones(11, np.float32))
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [_out("t")])
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [
        # same op and inputs, attributes equal, different, or absent
        helper.make_node("Softmax", ["x"], ["s1"], axis=1),
        helper.make_node("Softmax", ["x"], ["s2"], axis=1),
        helper.make_node("Softmax", ["x"], ["s3"], axis=0),
        helper.make_node("Softmax", ["x"], ["s4"]),
        # NaN attributes are never equal
        helper.make_node("LeakyRelu", ["x"], ["l1"], alpha=float("nan")),
        helper.make_node("LeakyRelu", ["x"], ["l2"], alpha=float("nan")),
        # list attributes, small and large tensors
        helper.make_node("Transpose", ["x"], ["p1"], perm=[1, 0]),
        helper.make_node("Transpose", ["x"], ["p2"], perm=[1, 0]),
        helper.make_node("Constant", [], ["c1"], value=small),
        helper.make_node("Constant", [], ["c2"], value=small),
        helper.make_node("Constant", [], ["c3"], value=large),
        helper.make_node("Constant", [], ["c4"], value=large),
        # subgraphs and random ops are left alone
        helper.make_node("If", ["cond"], ["i1"], then_branch=then, else_branch=then),
        helper.make_node("If", ["cond"], ["i2"], then_branch=then, else_branch=then),
        helper.make_node("RandomNormalLike", ["x"], ["r1"]),
        helper.make_node("RandomNormalLike", ["x"], ["r2"]),
        # a merge that rewires a later node, which then merges too
        helper.make_node("Relu", ["s1"], ["u1"]),
        helper.make_node("Relu", ["s2"], ["u2"]),
        # graph outputs: the kept value takes the name, or an Identity keeps both
        helper.make_node("Neg", ["x"], ["n1"]),
        helper.make_node("Neg", ["x"], ["out_a"]),
        helper.make_node("Abs", ["x"], ["out_b"]),
        helper.make_node("Abs", ["x"], ["out_c"]),
        helper.make_node("Sqrt", ["x"], ["q1"]),
        helper.make_node("Sqrt", ["x"], ["out_d"]),
        helper.make_node("Relu", ["q1"], ["q2"]),
    ]
    outputs = ["s3", "s4", "l1", "l2", "p1", "p2", "c1", "c2", "c3", "c4", "i1", "i2", "r1", "r2", "u1", "u2",
               "n1", "out_a", "out_b", "out_c", "out_d", "q2"]
    ours, theirs = _both(_model(nodes, [_out(name) for name in outputs], [cond]))
    assert ours == theirs
    merged = ir.serde.deserialize_model(onnx.load_from_string(ours))
    assert merged.graph.num_nodes() < len(nodes)  # the case merges something
