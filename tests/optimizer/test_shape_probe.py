"""Shapes at the probe sizes where onnx's inference names none: evaluated on stand-in arrays."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.match import MS
from optimizer.model_io import load_model
from optimizer.shape_inference import infer_shapes
from optimizer.shape_probe import (
    SAME_SHAPE_OPS,
    constant_dims,
    evaluated_dims,
    evaluated_shapes,
    pinned_shapes,
)


def _graph(nodes, initializers, x_shape):
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    infer_shapes(model)
    return model.graph, next(v for node in model.graph for v in node.outputs if v.name == "y")


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def test_a_partial_rotary_split_of_each_head_is_named_by_evaluating_it():
    # x [batch, 2, seq, 8]: the first half of each head (its bound Shape(x)[3] / 2, a Div onnx's data
    # propagation does not follow) negated, concatenated with the rest, as TorchScript's partial rotary
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "three"], ["size"], axis=0),
        helper.make_node("Div", ["size", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "zero"], ["bound"]),
        helper.make_node("Slice", ["x", "start", "bound", "last"], ["rotated"]),
        helper.make_node("Slice", ["x", "bound", "end", "last"], ["passed"]),
        helper.make_node("Neg", ["rotated"], ["negated"]),
        helper.make_node("Concat", ["negated", "passed"], ["y"], axis=-1),
    ]
    inits = [_ints("three", 3), _ints("two", 2), _ints("zero", [0]), _ints("start", [0]), _ints("end", [1 << 62]),
             _ints("last", [-1])]
    graph, y = _graph(nodes, inits, ["batch", 2, "seq", 8])
    assert not isinstance((constant_dims(graph, y) or [None] * 4)[3], int)  # inference stops at the Slices
    assert evaluated_dims(graph, y) == [None, 2, None, 8]
    assert evaluated_shapes(graph, y) == ((2, 2, 3, 8), (5, 2, 7, 8))


def test_a_size_read_from_the_data_is_refused():
    # Range(0, max(x)): its length is whatever x holds, which the stand-ins do not know
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
        helper.make_node("Cast", ["top"], ["count"], to=TensorProto.INT64),
        helper.make_node("Range", ["zero", "count", "one"], ["steps"]),
        helper.make_node("Cast", ["steps"], ["y"], to=TensorProto.FLOAT),
    ]
    graph, y = _graph(nodes, [_ints("zero", 0), _ints("one", 1)], ["batch", 4])
    assert evaluated_shapes(graph, y) is None
    assert evaluated_dims(graph, y) is None


def test_pinned_shapes_are_read_when_asked_as_one_dict_would_hold_them():
    from optimizer.shape_probe import InferredShapes

    graph = helper.make_graph(
        [], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                  helper.make_tensor_value_info("w", TensorProto.FLOAT, [9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n"])],
        value_info=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [5]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
    shapes = InferredShapes(graph, {"w": (7,)})
    # inputs over value infos, initializers over all; a symbolic dimension is no static shape
    assert dict(shapes) == {"x": (2, 3), "z": (4,), "w": (7,)}
    assert "y" not in shapes and shapes.get("y") is None and shapes.get("nothing") is None
    assert shapes["z"] == (4,) and len(shapes) == 3 and shapes
    assert not InferredShapes(helper.make_graph([], "empty", [], []), {})


@pytest.mark.parametrize("with_skip", [False, True])
def test_pinned_shapes_go_on_through_onnxruntime_ops_swapped_one_for_one_or_for_several(with_skip):
    # onnx infers neither op: onnxruntime's LayerNormalization (opset 14) stands in as one Identity,
    # written over it; SkipLayerNormalization with its residual sum read as two, which rebuild the
    # copy's node list.
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1)]
    last = "ln"
    if with_skip:
        nodes.append(helper.make_node("SkipLayerNormalization", ["ln", "x", "g", "b"], ["skip", "", "", "sum"],
                                      domain=MS))
        nodes.append(helper.make_node("Add", ["skip", "sum"], ["both"]))
        last = "both"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    model, first, second = _pinned_block(nodes)
    for name in ["ln", "y"] + (["skip", "sum"] if with_skip else []):
        assert (first[name], second[name]) == ((2, 3, 8), (5, 7, 8)), name
    assert [node.op_type for node in model.graph] == [node.op_type for node in nodes]  # only the copy changed


@pytest.mark.parametrize("domain, op_type", sorted(SAME_SHAPE_OPS))
def test_every_same_shape_op_is_swapped_in_the_pinned_copy(domain, op_type):
    # the swap is looked up by op type first: a same-shape op missing from that lookup would stop
    # inference at it, and everything after it would have no pinned shape
    _model, first, second = _pinned_block([helper.make_node(op_type, ["x", "g", "b"], ["out"], domain=domain),
                                           helper.make_node("Relu", ["out"], ["y"])])
    assert (first["y"], second["y"]) == ((2, 3, 8), (5, 7, 8))


def _pinned_block(nodes):
    """(model, first, second): `nodes` on x [b, s, 8] with 8-wide initializers g and b, up to output y,
    loaded, and y's graph inferred at both probe sizes."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), name) for name in "gb"])
    model = load_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid(MS, 1)]))
    y = next(v for node in model.graph for v in node.outputs if v.name == "y")
    first, second = pinned_shapes(model.graph, y)
    return model, first, second
