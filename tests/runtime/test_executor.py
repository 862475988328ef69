"""The plan and the loop: order, kernel choice, release points, peak bytes, subgraphs, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime.executor as executor_module
from runtime import (
    GraphExecutor,
    GraphPlanError,
    InferenceSession,
    NodeExecutionError,
    SessionOptions,
    UnsupportedModelError,
)
from runtime.kernels.base import Kernel
from runtime.plan import NONE_SLOT, SINK_SLOT
from tests.runtime.runtime_toy_kernels import TEST_DOMAIN_KERNELS, TOY_KERNELS

FLOAT = TensorProto.FLOAT
KERNELS = TOY_KERNELS + TEST_DOMAIN_KERNELS
NO_OPT = SessionOptions(graph_optimization_level="disabled")


def make_model(nodes, inputs, outputs, initializers=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def tensor(name, shape, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model, feeds):
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def session(model, options=NO_OPT):
    return InferenceSession(model, options, extra_kernels=KERNELS)


def mlp_model():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    return make_model(nodes, [tensor("x", [1, 16, 64])], [tensor("y", [1, 16, 8])], [w1, b1, w2])


def test_mlp_matches_onnxruntime():
    model = mlp_model()
    x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)
    ours = session(model)
    for _ in range(2):  # the measured first run and the plain loop after it
        [y] = ours.run(None, {"x": x})
        np.testing.assert_allclose(y, ort_run(model, {"x": x})[0], rtol=1e-3, atol=1e-4)


def test_second_run_with_same_shapes_takes_the_plain_loop(monkeypatch):
    model = mlp_model()
    x = np.ones((1, 16, 64), np.float32)
    ours = session(model)
    calls = []
    measured = executor_module.run_measured
    monkeypatch.setattr(executor_module, "run_measured", lambda *a: calls.append(1) or measured(*a))
    first = ours.run(None, {"x": x})[0]
    second = ours.run(None, {"x": x})[0]
    assert calls == [1]
    np.testing.assert_array_equal(first, second)


def test_plan_releases_each_intermediate_after_its_last_reader():
    # x -> a=Relu(x) -> b=Add(a, w) -> c=Mul(a, b) -> y=Relu(c); b also read by y2=Add(b, c)
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="n0"),
        helper.make_node("Add", ["a", "w"], ["b"], name="n1"),
        helper.make_node("Mul", ["a", "b"], ["c"], name="n2"),
        helper.make_node("Relu", ["c"], ["y"], name="n3"),
        helper.make_node("Add", ["b", "c"], ["y2"], name="n4"),
    ]
    model = make_model(nodes, [tensor("x", [4])], [tensor("y", [4]), tensor("y2", [4])], [w])
    plan = session(model).plan
    slot = {name: i for i, name in enumerate(plan.slot_names)}
    frees = {step.node.name: {plan.slot_names[s] for s in step.frees} for step in plan.steps}
    assert frees == {"n0": set(), "n1": set(), "n2": {"a"}, "n3": set(), "n4": {"b", "c"}}
    never_freed = {slot["x"], slot["w"], slot["y"], slot["y2"]}
    assert never_freed.isdisjoint(s for step in plan.steps for s in step.frees)


def test_peak_bytes_counts_live_intermediates_once_and_skips_views_of_feeds():
    # Relu chain of 1000 floats: at most two 4000-byte intermediates are alive at once.
    shape = numpy_helper.from_array(np.array([10, 100], np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["x2"], name="view_of_feed"),
        helper.make_node("Relu", ["x2"], ["r1"], name="r1"),
        helper.make_node("Relu", ["r1"], ["r2"], name="r2"),
        helper.make_node("Reshape", ["r2", "shape"], ["r2_view"], name="view_of_r2"),
        helper.make_node("Relu", ["r2_view"], ["y"], name="r3"),
    ]
    model = make_model(nodes, [tensor("x", [1000])], [tensor("y", [10, 100])], [shape])
    ours = session(model)
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    [y] = ours.run(None, {"x": x})
    np.testing.assert_allclose(y, ort_run(model, {"x": x})[0], rtol=1e-3, atol=1e-4)
    assert ours.peak_bytes == 8000
    stats = ours.memory_stats()
    assert (stats.intermediate_values, stats.released_early, stats.steps) == (5, 4, 5)
    assert stats.initializer_bytes == 16


def test_omitted_optional_inputs_and_outputs_use_the_none_and_sink_slots():
    nodes = [helper.make_node("Split", ["x", ""], ["a", "", "c"], name="split", axis=0)]
    model = make_model(nodes, [tensor("x", [6])], [tensor("a", [2]), tensor("c", [2])])
    ours = session(model)
    step = ours.plan.steps[0]
    assert step.inputs[1] == NONE_SLOT and step.outputs[1] == SINK_SLOT and SINK_SLOT in step.frees
    x = np.arange(6, dtype=np.float32)
    a, c = ours.run(None, {"x": x})
    np.testing.assert_array_equal(a, [0, 1])
    np.testing.assert_array_equal(c, [4, 5])


def test_kernel_version_follows_the_model_opset():
    for opset, expected in ((13, "Relu"), (14, "Relu_14"), (20, "Relu_14")):
        model = make_model(
            [helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])], opset=opset
        )
        assert type(session(model).plan.steps[0].kernel).__name__ == expected


def test_all_unsupported_ops_reported_once_at_creation():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("NoSuchOp", ["a"], ["b"], name="first_missing"),
        helper.make_node("NoSuchOp", ["b"], ["c"], name="second_missing"),
        helper.make_node("FusedThing", ["c"], ["d"], name="contrib_missing", domain="com.microsoft"),
        helper.make_node("Gelu", ["d"], ["y"], name="tanh_gelu", approximate="tanh"),
    ]
    model = make_model(
        nodes, [tensor("x", [2])], [tensor("y", [2])], opset=20, extra_opsets=[("com.microsoft", 1)]
    )
    with pytest.raises(UnsupportedModelError) as raised:
        session(model)
    entries = {(e.domain, e.op_type, e.opset): e for e in raised.value.unsupported}
    assert set(entries) == {("", "NoSuchOp", 20), ("com.microsoft", "FusedThing", 1), ("", "Gelu", 20)}
    assert entries[("", "NoSuchOp", 20)].nodes == ["first_missing", "second_missing"]
    assert "approximate='tanh'" in entries[("", "Gelu", 20)].reason
    message = str(raised.value)
    assert "ai.onnx.NoSuchOp (opset 20)" in message and "com.microsoft.FusedThing (opset 1)" in message
    assert "'first_missing', 'second_missing'" in message and "'tanh_gelu'" in message
    assert isinstance(raised.value, ValueError)


def test_unsupported_op_inside_a_subgraph_fails_at_creation():
    inner = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["t"], name="deep_missing")], "then", [], [tensor("t", [2])]
    )
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [tensor("e", [2])])
    nodes = [helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=inner, else_branch=other)]
    model = make_model(nodes, [tensor("x", [2]), tensor("flag", [], TensorProto.BOOL)], [tensor("y", [2])])
    with pytest.raises(UnsupportedModelError, match="deep_missing"):
        session(model)


def if_model():
    """Main graph computes `scale`; branches read it (and `x`) from the outer scope; the then
    branch nests another If that reads `scale` two levels up."""
    nested_then = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["nt"], name="nested_mul")],
        "nested_then",
        [],
        [tensor("nt", [3])],
    )
    nested_else = helper.make_graph(
        [helper.make_node("Add", ["x", "scale"], ["ne"], name="nested_add")],
        "nested_else",
        [],
        [tensor("ne", [3])],
    )
    then_branch = helper.make_graph(
        [
            helper.make_node(
                "If", ["flag2"], ["inner"], name="nested_if", then_branch=nested_then, else_branch=nested_else
            ),
            helper.make_node("Relu", ["inner"], ["t"], name="then_relu"),
        ],
        "then",
        [],
        [tensor("t", [3])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["scale", "scale"], ["e"], name="else_mul")], "else", [], [tensor("e", [3])]
    )
    nodes = [
        helper.make_node("Add", ["x", "x"], ["scale"], name="make_scale"),
        helper.make_node(
            "If", ["flag"], ["y"], name="outer_if", then_branch=then_branch, else_branch=else_branch
        ),
    ]
    inputs = [tensor("x", [3]), tensor("flag", [], TensorProto.BOOL), tensor("flag2", [], TensorProto.BOOL)]
    return make_model(nodes, inputs, [tensor("y", [3])])


@pytest.mark.parametrize("flag, flag2", [(True, True), (True, False), (False, True)])
def test_if_subgraphs_read_outer_scope_at_any_depth(flag, flag2):
    model = if_model()
    feeds = {"x": np.array([-1.0, 0.5, 2.0], np.float32), "flag": np.array(flag), "flag2": np.array(flag2)}
    ours = session(model)
    outer_if = ours.plan.steps[1]
    assert set(outer_if.implicit_inputs) == {"x", "scale", "flag2"}
    np.testing.assert_allclose(ours.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-3, atol=1e-4)


def test_scale_released_after_the_if_that_reads_it_implicitly():
    plan = session(if_model()).plan
    scale = plan.slot_names.index("scale")
    assert [step.node.name for step in plan.steps if scale in step.frees] == ["outer_if"]


def test_graph_executor_runs_a_subgraph_with_an_outer_scope():
    model = ir.serde.deserialize_model(if_model())
    else_graph = next(n for n in model.graph if n.op_type == "If").attributes["else_branch"].as_graph()
    body = GraphExecutor(else_graph, opsets={"": 17}, extra_kernels=KERNELS)
    assert body.outer_scope_names == ["scale"] and body.input_names == [] and body.output_names == ["e"]
    [e] = body.run({}, {"scale": np.array([1.0, 2.0, 3.0], np.float32)})
    np.testing.assert_array_equal(e, [1.0, 4.0, 9.0])
    with pytest.raises(GraphPlanError, match="reads 'scale' from its enclosing scope"):
        body.run({}, {})


def test_graph_executor_runs_a_graph_with_domains_spelled_either_way():
    graph = ir.serde.deserialize_graph(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g", [tensor("x", [2])], [tensor("y", [2])]
        )
    )
    relu = GraphExecutor(graph, opsets={"ai.onnx": 17}, extra_kernels=KERNELS)
    np.testing.assert_array_equal(relu.run({"x": np.array([-1.0, 2.0], np.float32)})[0], [0.0, 2.0])


def test_unsorted_graph_is_ordered_before_running():
    nodes = [
        helper.make_node("Relu", ["a"], ["y"], name="second"),
        helper.make_node("Add", ["x", "x"], ["a"], name="first"),
    ]
    model = make_model(nodes, [tensor("x", [2])], [tensor("y", [2])])
    ours = session(model)
    assert [step.node.name for step in ours.plan.steps] == ["first", "second"]
    np.testing.assert_array_equal(ours.run(None, {"x": np.array([-1.0, 1.0], np.float32)})[0], [0.0, 2.0])


def test_cycle_is_a_plan_error():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="p"),
        helper.make_node("Relu", ["a"], ["b"], name="q"),
    ]
    model = make_model(nodes, [tensor("x", [2])], [tensor("b", [2])])
    with pytest.raises(ValueError, match="cycle"):  # the optimizer sorts first and says so
        session(model)
    graph = ir.serde.deserialize_model(model).graph
    with pytest.raises(GraphPlanError, match="graph 'g' cannot be ordered"):
        GraphExecutor(graph, opsets={"": 17}, extra_kernels=KERNELS)


def test_undefined_value_is_refused_at_creation():
    """The loader refuses it before planning (optimizer/model_io.py), naming the node and the value."""
    from optimizer import ModelLoadError

    model = make_model(
        [helper.make_node("Add", ["x", "ghost"], ["y"])], [tensor("x", [2])], [tensor("y", [2])]
    )
    with pytest.raises(ModelLoadError, match="reads 'ghost', which no graph input, initializer or node provides"):
        session(model)


def test_kernel_failure_names_node_op_and_input_shapes():
    nodes = [helper.make_node("Explode", ["x"], ["y"], name="bad_node", domain="test.fusionwatch")]
    model = make_model(
        nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], extra_opsets=[("test.fusionwatch", 1)]
    )
    ours = session(model)
    x = np.zeros((2, 3), np.float32)
    for _ in range(2):  # measured first run and plain loop give the same error
        with pytest.raises(NodeExecutionError) as raised:
            ours.run(None, {"x": x})
        assert "'bad_node' (test.fusionwatch.Explode, kernel Explode)" in str(raised.value)
        assert "float32[2, 3]" in str(raised.value) and "FloatingPointError: boom" in str(raised.value)
        assert isinstance(raised.value.__cause__, FloatingPointError)


def test_kernel_breaking_the_output_contract_is_caught_on_first_run():
    nodes = [helper.make_node("BareOutput", ["x"], ["y"], name="bare", domain="test.fusionwatch")]
    model = make_model(
        nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], extra_opsets=[("test.fusionwatch", 1)]
    )
    with pytest.raises(
        NodeExecutionError, match="kernel BareOutput for node 'bare' returned ndarray, not a tuple"
    ):
        session(model).run(None, {"x": np.zeros((2, 3), np.float32)})


def test_kernel_bug_in_init_names_the_node():
    class BrokenInit(Kernel):
        op_type = "Relu"
        since_version = 1

        def __init__(self, node, opset, backend):
            raise KeyError("oops")

    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [tensor("x", [2])], [tensor("y", [2])]
    )
    with pytest.raises(GraphPlanError, match="building kernel BrokenInit for node 'r'"):
        InferenceSession(model, NO_OPT, extra_kernels=[BrokenInit])


def test_onnx_model_stays_valid_for_oracle():
    onnx.checker.check_model(mlp_model())
    onnx.checker.check_model(if_model())


# --- sequence and optional values (ONNX conformance cases feed and fetch them) ------------

from runtime import InvalidFeedError  # noqa: E402  (this section was appended)


class PassThrough(Kernel):
    op_type = "Identity"
    since_version = 1

    def run(self, x):
        return (x,)


class HasElement(Kernel):
    op_type = "OptionalHasElement"
    since_version = 15

    def run(self, x=None):
        return (np.array(x is not None),)


def sequence_identity_model():
    seq = helper.make_value_info(
        "s", helper.make_sequence_type_proto(helper.make_tensor_type_proto(FLOAT, [None, 2]))
    )
    out = helper.make_value_info(
        "t", helper.make_sequence_type_proto(helper.make_tensor_type_proto(FLOAT, None))
    )
    return make_model([helper.make_node("Identity", ["s"], ["t"])], [seq], [out], opset=16)


def test_sequence_feed_runs_as_a_list_and_comes_back_as_host_arrays():
    ours = InferenceSession(sequence_identity_model(), NO_OPT, extra_kernels=[PassThrough])
    items = [np.ones((1, 2), np.float32), np.zeros((3, 2), np.float32)]  # ragged: not stackable
    [result] = ours.run(None, {"s": items})
    assert isinstance(result, list) and len(result) == 2
    for got, want in zip(result, items, strict=True):
        assert isinstance(got, np.ndarray) and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_sequence_feed_is_checked_item_by_item():
    ours = InferenceSession(sequence_identity_model(), NO_OPT, extra_kernels=[PassThrough])
    with pytest.raises(InvalidFeedError, match=r"input 's': expected seq\(tensor\(float\)\) as a list"):
        ours.run(None, {"s": np.ones((2, 2), np.float32)})
    with pytest.raises(
        InvalidFeedError, match=r"input 's': expected seq\(tensor\(float\)\), got tensor\(int64\)"
    ):
        ours.run(None, {"s": [np.ones((1, 2), np.int64)]})
    with pytest.raises(InvalidFeedError, match=r"input 's': dimension 1 is 3, expected 2"):
        ours.run(None, {"s": [np.ones((1, 3), np.float32)]})


def optional_model(op_type, output):
    optional_input = helper.make_value_info(
        "o", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.INT32, [3]))
    )
    return make_model([helper.make_node(op_type, ["o"], ["y"])], [optional_input], [output], opset=18)


def test_optional_feed_may_be_empty_or_an_array_of_its_element_type():
    model = optional_model("OptionalHasElement", tensor("y", [], TensorProto.BOOL))
    ours = InferenceSession(model, NO_OPT, extra_kernels=[HasElement])
    assert ours.run(None, {"o": None})[0].item() is False
    assert ours.run(None, {"o": np.arange(3, dtype=np.int32)})[0].item() is True
    with pytest.raises(
        InvalidFeedError, match=r"input 'o': expected optional\(tensor\(int32\)\), got tensor\(float\)"
    ):
        ours.run(None, {"o": np.zeros(3, np.float32)})


def test_empty_optional_passes_the_output_contract_only_where_the_output_is_optional():
    optional_out = helper.make_value_info(
        "y", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.INT32, [3]))
    )
    ours = InferenceSession(optional_model("Identity", optional_out), NO_OPT, extra_kernels=[PassThrough])
    assert ours.run(None, {"o": None}) == [None]  # first (measured) run checks the contract
    assert ours.run(None, {"o": None}) == [None]
    tensor_out = optional_model("Identity", tensor("y", [3], TensorProto.INT32))
    with pytest.raises(NodeExecutionError, match="returned None for output 0 'y'"):
        InferenceSession(tensor_out, NO_OPT, extra_kernels=[PassThrough]).run(None, {"o": None})


def test_constant_nodes_are_placed_once_like_initializers(tmp_path):
    # As onnxruntime does on load: no step runs a Constant, nor does its profile name one; its value
    # reaches readers and graph outputs, and a caller changing a returned output changes nothing after.
    nodes = [
        helper.make_node("Constant", [], ["c"], name="c", value=numpy_helper.from_array(np.array([1.0, 2.0], np.float32))),
        helper.make_node("Add", ["x", "c"], ["y"], name="add"),
    ]
    model = make_model(nodes, [tensor("x", [2])], [tensor("y", [2]), tensor("c", [2])])
    options = SessionOptions(graph_optimization_level="disabled", enable_profiling=True,
                             profile_file_prefix=str(tmp_path / "trace"))
    ours = InferenceSession(model.SerializeToString(), options)
    assert [step.node.name for step in ours.plan.steps] == ["add"]
    x = np.array([10.0, 20.0], np.float32)
    y, c = ours.run(None, {"x": x})
    np.testing.assert_array_equal(y, [11.0, 22.0])
    c[:] = 0  # the caller's copy
    np.testing.assert_array_equal(ours.run(None, {"x": x})[0], [11.0, 22.0])
    np.testing.assert_array_equal(ours.run(None, {"x": x})[1], [1.0, 2.0])
    events = json.loads(Path(ours.end_profiling()).read_text())
    assert {e["args"]["op_name"] for e in events if e["cat"] == "Node"} == {"Add"}
