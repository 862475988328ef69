"""Every rule answers at every anchor it did not fire on, from the very first check on.

"Why did X not fuse?" is the product's question, and "no near misses" may only mean that the
graph holds no anchor of the rule. Each case is the rule's anchor op alone on graph inputs, where
nothing around it matches, and the rule must say so at that node, with a step and a reason. Then
the same as a property of real graphs: in every fixture (and every model of the zoo, when it has
been made), at every level, each node left that is an anchor of a rule of that level has that
rule's near miss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from optimizer.levels import LEVELS, rules_for_level
from optimizer.match import op_key
from optimizer.text import shorten
from tests.oracle import MODELS

ZOO = Path(__file__).resolve().parents[2] / "var" / "zoo"

SHAPE = [2, 4, 16]


def _single(op, inputs, *, domain="", opset=17, initializers=(), input_types=None, **attributes):
    """One `op` node named '/anchor' on graph inputs (float [2, 4, 16] unless typed otherwise)."""
    types = input_types or {}
    node = helper.make_node(op, list(inputs), ["y"], name="/anchor", domain=domain, **attributes)
    init_names = {t.name for t in initializers}
    graph_inputs = [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), SHAPE)
                    for n in dict.fromkeys(inputs) if n and n not in init_names]
    graph = helper.make_graph([node], "anchor", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              list(initializers))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


def _vec(name, size=16):
    return numpy_helper.from_array(np.ones(size, np.float32), name)


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


# rule -> a model whose '/anchor' node is that rule's anchor op in a place it cannot fire
NEGATIVES = {
    "EliminateIdentity": lambda: _single("Identity", ["x"]),
    "EliminateDropout": lambda: _single("Dropout", ["x"]),
    "CastElimination": lambda: _single("Cast", ["x"], to=TensorProto.INT64),
    "EliminateSlice": lambda: _single("Slice", ["x", "s", "e"], initializers=[_ints("s", [1]), _ints("e", [3])]),
    "UnsqueezeElimination": lambda: _single("Unsqueeze", ["x", "axes"], initializers=[_ints("axes", [0])]),
    "ReshapeFusion": lambda: _single("Reshape", ["x", "shape"], initializers=[_ints("shape", [8, 16])]),
    "ConvBNFusion": lambda: _single("BatchNormalization", ["x", "s", "b", "m", "v"],
                                    initializers=[_vec(n, 4) for n in "sbmv"]),
    "ConvMulFusion": lambda: _single("Mul", ["x", "z"]),
    "ConvAddFusion": lambda: _single("Add", ["x", "z"]),
    "FuseReluClip": lambda: _single("Relu", ["x"]),
    "MatMulAddFusion": lambda: _single("Add", ["x", "z"]),
    "GeluFusion": lambda: _single("Erf", ["x"]),
    "FastGeluFusion": lambda: _single("Tanh", ["x"]),
    "QuickGeluFusion": lambda: _single("Sigmoid", ["x"]),
    "LayerNormFusion": lambda: _single("ReduceMean", ["x"], axes=[-1]),
    "SimplifiedLayerNormFusion": lambda: _single("ReduceMean", ["x"], axes=[-1]),
    "RotaryEmbeddingFusion": lambda: _single("Neg", ["x"]),
    "AttentionFusion": lambda: _single("Softmax", ["x"], axis=-1),
    "GroupQueryAttentionFusion": lambda: _single("MultiHeadAttention", ["x", "k", "v"], domain="com.microsoft",
                                                 num_heads=4),
    "EmbedLayerNormFusion": lambda: _single("LayerNormalization", ["x", "g", "b"], initializers=[_vec("g"), _vec("b")]),
    "SkipLayerNormFusion": lambda: _single("LayerNormalization", ["x", "g", "b"], initializers=[_vec("g"), _vec("b")]),
    "BiasGeluFusion": lambda: _single("Gelu", ["x"], opset=20),
    "MatMulScaleFusion": lambda: _single("MatMul", ["x", "w"], initializers=[numpy_helper.from_array(np.ones((16, 8), np.float32), "w")]),
    "MatmulTransposeFusion": lambda: _single("MatMul", ["x", "w"], initializers=[numpy_helper.from_array(np.ones((16, 8), np.float32), "w")]),
    "GemmActivationFusion": lambda: _gemm(),
    "MatMulIntegerToFloatFusion": lambda: _single("MatMulInteger", ["a", "b"],
                                                  input_types={"a": TensorProto.UINT8, "b": TensorProto.INT8}),
    "PadFusion": lambda: _single("Pad", ["x", "pads"], initializers=[_ints("pads", [0, 0, 1, 0, 0, 1])]),
    "TransposeOptimizer": lambda: _single("Transpose", ["x"], perm=[0, 2, 1]),
    "GatherSliceToSplitFusion": lambda: _single("Slice", ["x", "s", "e"],
                                                initializers=[_ints("s", [1]), _ints("e", [3])]),
    "ConvActivationFusion": lambda: _single("Conv", ["x", "w"], initializers=[numpy_helper.from_array(np.ones((4, 2, 1), np.float32), "w")]),
    "GeluApproximation": lambda: _single("Gelu", ["x"], opset=20, approximate="none", input_types={"x": TensorProto.DOUBLE}),
}


def _gemm():
    nodes = [helper.make_node("Gemm", ["a", "w"], ["y"], name="/anchor")]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((16, 8), np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ANCHORED_RULES = sorted({rule.name for rules in LEVELS.values() for rule in rules if rule.anchors})


def test_every_anchored_rule_has_a_negative_case():
    assert sorted(NEGATIVES) == ANCHORED_RULES


@pytest.mark.parametrize("rule", ANCHORED_RULES)
def test_a_rule_that_did_not_fire_says_why_at_its_anchor(rule):
    result = optimize(NEGATIVES[rule](), "all", enable_gelu_approximation=rule == "GeluApproximation")
    assert result.report.rules[rule].fired == 0
    misses = [m for m in result.report.explain(rule) if m.anchor == "/anchor"]
    assert len(misses) == 1, f"{rule} gave no answer at its anchor: {result.report.near_misses}"
    assert misses[0].step and misses[0].reason
    assert "is not where" not in misses[0].reason, "the driver's generic answer: the rule should say why itself"


def _unanswered(path: Path, level: str) -> list[str]:
    result = optimize(str(path), level)
    answered = {(m.rule, m.anchor) for m in result.report.near_misses}
    missing = []
    for rule in rules_for_level(level):
        if not rule.anchors:
            continue
        for node in result.model.graph:
            anchor = shorten(node.name or op_key(node))
            if op_key(node) in rule.anchors and (rule.name, anchor) not in answered:
                missing.append(f"{rule.name} at {anchor}")
    return missing


FIXTURES = sorted(p.name for p in MODELS.glob("*.onnx"))


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
@pytest.mark.parametrize("name", FIXTURES)
def test_every_anchor_left_in_a_fixture_has_a_near_miss(name, level):
    assert _unanswered(MODELS / name, level) == []


ZOO_MODELS = sorted(p.name for p in ZOO.glob("*.onnx")) if ZOO.is_dir() else []


@pytest.mark.skipif(not ZOO_MODELS, reason="the zoo is not made (make fixtures)")
@pytest.mark.parametrize("name", ZOO_MODELS or ["-"])
def test_every_anchor_left_in_a_zoo_model_has_a_near_miss(name):
    for level in ("extended", "all"):
        assert _unanswered(ZOO / name, level) == [], level
