"""Rules that leave graphs no larger than onnxruntime's: a Pad folded into its Conv, a run of Slices
made one Split, constant subgraphs (rotary sin/cos) folded. Each: exact counts, numerics against
onnxruntime with its optimizations off, and the near misses where the rule must not fire."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from tests.oracle import assert_same_outputs


def _model(nodes, inputs, initializers=(), *, opset=17, outputs=("y",)):
    graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _array(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _misses(report, rule):
    return [f"{m.step}: {m.reason}" for m in report.near_misses if m.rule == rule]


# --- PadFusion ------------------------------------------------------------------------------------------


def _pad_conv(*, pads=(0, 0, 1, 2, 0, 0, 2, 1), mode="constant", value=0.0, conv_pads=(1, 0, 0, 1),
              auto_pad=None, second_reader=False, opset=17):
    rng = np.random.default_rng(0)
    inits = [_array("pads", np.array(pads, np.int64)), _array("w", rng.standard_normal((4, 3, 3, 3), np.float32)),
             _array("b", rng.standard_normal(4).astype(np.float32))]
    pad_inputs = ["x", "pads"]
    if value is not None:
        inits.append(_array("value", np.array(value, np.float32)))
        pad_inputs.append("value")
    conv_attrs = {"auto_pad": auto_pad} if auto_pad else {"pads": list(conv_pads)}
    nodes = [helper.make_node("Pad", pad_inputs, ["padded"], name="/pad", mode=mode),
             helper.make_node("Conv", ["padded", "w", "b"], ["y"], name="/conv", **conv_attrs)]
    outputs = ["y"]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["padded"], ["z"], name="/relu"))
        outputs.append("z")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
    return _model(nodes, [x], inits, opset=opset, outputs=outputs)


@pytest.mark.parametrize("value", [0.0, None])
def test_a_zero_pad_before_a_conv_becomes_the_convs_own_padding(value):
    model = _pad_conv(value=value)
    result = optimize(model, "basic")
    assert result.report.rules["PadFusion"].fired == 1
    assert result.report.ops_after == {"Conv": 1}
    (conv,) = list(result.model.graph)
    assert list(conv.attributes["pads"].value) == [1 + 1, 0 + 2, 0 + 2, 1 + 1]
    assert_same_outputs(model, result)


@pytest.mark.parametrize("kwargs, reason", [
    ({"mode": "reflect"}, "mode: Pad mode is 'reflect'; a Conv pads with zeros only"),
    ({"value": 1.5}, "value: the Pad's value 'value' is not a constant 0"),
    ({"pads": (1, 0, 1, 1, 0, 0, 1, 1)}, "pads: pads [1, 0, 1, 1, 0, 0, 1, 1] pad the batch or channel axis; "
                                          "a Conv pads spatial axes only"),
    ({"pads": (0, 0, -1, 1, 0, 0, 1, 1)}, "pads: pads [0, 0, -1, 1, 0, 0, 1, 1] crop (negative); a Conv's pads cannot"),
    ({"auto_pad": "SAME_UPPER"}, "auto_pad: Conv '/conv' has auto_pad SAME_UPPER; its pads are computed"),
    ({"second_reader": True}, "consumer: the Pad's output feeds 2 nodes, not one Conv alone"),
])
def test_a_pad_the_conv_cannot_express_stays_and_says_why(kwargs, reason):
    model = _pad_conv(**kwargs)
    result = optimize(model, "basic")
    assert result.report.rules["PadFusion"].fired == 0
    assert _misses(result.report, "PadFusion") == [reason]
    assert_same_outputs(model, result)


def test_a_pad_before_something_else_is_a_near_miss():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])
    model = _model([helper.make_node("Pad", ["x", "pads"], ["y"], name="/pad")], [x],
                   [_array("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))])
    assert _misses(optimize(model, "basic").report, "PadFusion") == [
        "consumer: the Pad's output feeds a graph output, not one Conv alone"]


# --- GatherSliceToSplitFusion -----------------------------------------------------------------------------

INT_MAX = 2**63 - 1


def _slices(cuts, *, axis=-1, steps=None, width=16, opset=17, axes_per_slice=None):
    """x[2, 4, width] cut by one Slice per (start, end) in `cuts`; each piece goes through a Relu."""
    nodes, inits, outputs = [], [], []
    for i, (start, end) in enumerate(cuts):
        names = [f"s{i}", f"e{i}", f"a{i}"]
        inits += [_array(f"s{i}", np.array([start], np.int64)), _array(f"e{i}", np.array([end], np.int64)),
                  _array(f"a{i}", np.array([axis if axes_per_slice is None else axes_per_slice[i]], np.int64))]
        if steps:
            inits.append(_array(f"t{i}", np.array([steps[i]], np.int64)))
            names.append(f"t{i}")
        nodes += [helper.make_node("Slice", ["x", *names], [f"p{i}"], name=f"/slice{i}"),
                  helper.make_node("Relu", [f"p{i}"], [f"y{i}"], name=f"/relu{i}")]
        outputs.append(f"y{i}")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, width])
    return _model(nodes, [x], inits, opset=opset, outputs=outputs)


@pytest.mark.parametrize("cuts, opset", [
    ([(0, 8), (8, INT_MAX)], 17),  # rotate_half
    ([(32, 48), (0, 16), (16, -16)], 17),  # Q, K, V of a fused projection, listed out of order
    ([(0, 8), (8, 16)], 11),  # split sizes as an attribute
])
def test_slices_that_cut_an_axis_into_pieces_become_one_split(cuts, opset):
    model = _slices(cuts, width=48 if len(cuts) == 3 else 16, opset=opset)
    result = optimize(model, "extended")
    assert result.report.rules["GatherSliceToSplitFusion"].fired == 1
    assert result.report.ops_after == {"Split": 1, "Relu": len(cuts)}
    assert_same_outputs(model, result)


@pytest.mark.parametrize("kwargs, reason", [
    ({"cuts": [(0, 8)]}, "pieces: 'x' is cut by this Slice alone; one Split would not save a node"),
    ({"cuts": [(0, 9), (8, 16)]}, "cover: Slice '/slice1' starts at 8: it overlaps the piece before it"),
    ({"cuts": [(0, 7), (8, 16)]}, "cover: Slice '/slice1' starts at 8: it leaves [7, 8) out"),
    ({"cuts": [(0, 8), (8, 12)]}, "cover: the Slices end at 12 of axis 2's 16"),
    ({"cuts": [(0, 8), (8, 16)], "steps": [1, 2]}, "bounds: Slice '/slice1' steps by 2"),
    ({"cuts": [(0, 2), (0, 8)], "axes_per_slice": [1, 2]}, "bounds: the Slices of 'x' cut different axes [1, 2]"),
])
def test_slices_that_do_not_partition_an_axis_stay_and_say_why(kwargs, reason):
    model = _slices(**kwargs)
    result = optimize(model, "extended")
    assert result.report.rules["GatherSliceToSplitFusion"].fired == 0
    assert set(_misses(result.report, "GatherSliceToSplitFusion")) == {reason}
    assert_same_outputs(model, result)


# --- ConstantFolding of what exporters compute from constants ----------------------------------------------


def test_rotary_angles_computed_from_constants_fold_into_their_sin_and_cos_caches():
    """Range(positions) x inverse frequencies -> Sin, Cos: all constant, so two initializers remain."""
    inverse = _array("inv_freq", (1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32).reshape(1, 4))
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["positions"], name="/range"),
        helper.make_node("Cast", ["positions"], ["positions_f"], name="/cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["positions_f", "one"], ["column"], name="/unsqueeze"),
        helper.make_node("Mul", ["column", "inv_freq"], ["angles"], name="/mul"),
        helper.make_node("Sin", ["angles"], ["sin"], name="/sin"),
        helper.make_node("Cos", ["angles"], ["cos"], name="/cos"),
        helper.make_node("Mul", ["x", "sin"], ["a"], name="/use_sin"),
        helper.make_node("Mul", ["x", "cos"], ["b"], name="/use_cos"),
        helper.make_node("Add", ["a", "b"], ["y"], name="/add"),
    ]
    inits = [_array("start", np.array(0, np.int64)), _array("limit", np.array(16, np.int64)),
             _array("delta", np.array(1, np.int64)), _array("one", np.array([1], np.int64)), inverse]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 4])], inits)
    result = optimize(model, "basic")
    assert result.report.ops_after == {"Add": 1, "Mul": 2}
    assert_same_outputs(model, result)


# --- TransposeOptimizer -----------------------------------------------------------------------------------

NHWC, NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _residual_between_layouts(*, second_perm=NCHW, extra_reader=False):
    """ConvNeXt's block end: Add(T(a), T(b)) back to channels-first, then permuted again."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="/a"),
        helper.make_node("Sigmoid", ["x"], ["b"], name="/b"),
        helper.make_node("Transpose", ["a"], ["ta"], name="/ta", perm=NCHW),
        helper.make_node("Transpose", ["b"], ["tb"], name="/tb", perm=second_perm),
        helper.make_node("Add", ["ta", "tb"], ["sum"], name="/add"),
        helper.make_node("Transpose", ["sum"], ["y"], name="/back", perm=NHWC),
        helper.make_node("Relu", ["ta"], ["z"], name="/other"),  # the first Transpose is read elsewhere too
    ]
    outputs = ["y", "z"]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["sum"], ["w"], name="/neg"))
        outputs.append("w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4, 3])
    return _model(nodes, [x], outputs=outputs)


def test_transposes_that_undo_each_other_across_an_add_go():
    model = _residual_between_layouts()
    result = optimize(model, "extended")
    assert result.report.rules["TransposeOptimizer"].fired == 1
    assert result.report.ops_after == {"Add": 1, "Relu": 2, "Sigmoid": 1, "Transpose": 1}
    assert_same_outputs(model, result)


def test_two_transposes_in_a_row_become_one_or_none():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="/r"),
             helper.make_node("Transpose", ["r"], ["t1"], name="/t1", perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["t1"], ["t2"], name="/t2", perm=[0, 1, 3, 2]),
             helper.make_node("Transpose", ["t2"], ["t3"], name="/t3", perm=[0, 1, 3, 2]),
             helper.make_node("Transpose", ["t3"], ["y"], name="/t4", perm=[0, 2, 1, 3])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])])
    result = optimize(model, "extended")
    assert result.report.ops_after == {"Relu": 1}
    assert_same_outputs(model, result)


@pytest.mark.parametrize("kwargs, reason", [
    ({"second_perm": [0, 3, 2, 1]}, "inputs: input 'tb' of Add '/add' is not transposed by the inverse of "
                            "Transpose '/back''s perm [0, 2, 3, 1]"),
    ({"extra_reader": True}, "source: the result of Add '/add' is also read elsewhere, in its own layout"),
])
def test_transposes_that_do_not_cancel_stay_and_say_why(kwargs, reason):
    model = _residual_between_layouts(**kwargs)
    result = optimize(model, "extended")
    assert result.report.rules["TransposeOptimizer"].fired == 0
    assert reason in _misses(result.report, "TransposeOptimizer")
    assert_same_outputs(model, result)
