"""Control flow, sequences and optionals: ONNX's backend node cases, then onnxruntime as oracle.

These models carry subgraphs and sequence values, which a lone kernel cannot run (its body
needs the planned scope, its feeds may be lists), so every case goes through an
InferenceSession with optimizations off, exactly as runtime/conformance.py judges it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from runtime import InferenceSession, SessionOptions
from runtime.conformance import Case, check, collect_cases, is_claimed
from runtime.errors import UnsupportedModelError
from runtime.kernels import control_flow
from tests.runtime.node_cases import assert_same_output, run_onnxruntime

NO_OPTIMIZATION = SessionOptions(graph_optimization_level="disabled")
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
OUR_OPS = {kernel.op_type for kernel in control_flow.KERNELS}


def _ops(graph: onnx.GraphProto) -> set[str]:
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found |= _ops(attribute.g)
    return found


# Every claimed case whose model uses one of our ops at any depth (expanded functions included).
CASES: list[Case] = [
    case for case in collect_cases() if _ops(case.model.graph) & OUR_OPS and is_claimed(case)
]


def test_every_case_of_our_ops_is_claimed():
    """Each case whose tested op is ours runs (none falls back to 'no kernel')."""
    ours = [case for case in collect_cases() if case.op[0] == "" and case.op[1] in OUR_OPS]
    assert len(ours) == 38
    assert [case.name for case in ours if not is_claimed(case)] == []


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_node_case(case):
    result = check(case)
    assert result.passed, result.reason


# ---- onnxruntime as the oracle ------------------------------------------------------------


def value(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def model_of(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "control_flow", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def assert_same_as_onnxruntime(model, inputs):
    """Our session (optimizations off) and onnxruntime agree on every output: type, shape,
    and values within fp32 tolerance (exactly for non-floats); sequences item by item."""
    feeds = {f"x{i}": array for i, array in enumerate(inputs)}
    ours = InferenceSession(model, NO_OPTIMIZATION).run(None, feeds)
    theirs = run_onnxruntime(model, inputs)
    assert len(ours) == len(theirs)
    for actual, expected in zip(ours, theirs, strict=True):
        assert_same_output(actual, expected)
    return ours


RNG = np.random.default_rng(0)


def scalar(v, dtype):
    return np.array(v, dtype=dtype)


@pytest.mark.parametrize("trip_count", [0, 1, 4])
def test_loop_reads_outer_scope_value(trip_count):
    """A for-loop (no condition input) whose body scales its carried value by the graph
    input x2, never passed to it explicitly, and scans the running value."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Mul", ["acc_in", "x2"], ["scaled"]),
            helper.make_node("Cast", ["i"], ["i_float"], to=FLOAT),
            helper.make_node("Add", ["scaled", "i_float"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["trace"]),
        ],
        "body",
        [value("i", INT64, []), value("cond_in", BOOL, []), value("acc_in", FLOAT, [3])],
        [value("cond_out", BOOL, []), value("acc_out", FLOAT, [3]), value("trace", FLOAT, [3])],
    )
    model = model_of(
        [helper.make_node("Loop", ["x0", "", "x1"], ["final", "traces"], body=body)],
        [value("x0", INT64, []), value("x1", FLOAT, [3]), value("x2", FLOAT, [3])],
        [value("final", FLOAT, [3]), value("traces", FLOAT, [None, 3])],
    )
    x1 = RNG.standard_normal(3).astype(np.float32)
    x2 = RNG.standard_normal(3).astype(np.float32)
    final, traces = assert_same_as_onnxruntime(model, [scalar(trip_count, np.int64), x1, x2])
    assert traces.shape == (trip_count, 3)


def test_loop_body_declaring_its_iteration_number_and_condition_as_one_element_tensors():
    """Opset-9 era bodies (onnxruntime's fp16model_loop.onnx) declare both as [1]: they get them so,
    as onnxruntime gives them, and a Squeeze of axis 0 reads the iteration number."""
    body = helper.make_graph(
        [
            helper.make_node("Squeeze", ["i"], ["i_scalar"], axes=[0]),
            helper.make_node("Gather", ["x1", "i_scalar"], ["row"], axis=0),
            helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [value("i", INT64, [1]), value("cond_in", BOOL, [1]), value("acc_in", FLOAT, [3])],
        [value("cond_out", BOOL, [1]), value("acc_out", FLOAT, [3])],
    )
    model = model_of(
        [helper.make_node("Loop", ["x0", "x2", "x3"], ["total"], body=body)],
        [value("x0", INT64, []), value("x1", FLOAT, [4, 3]), value("x2", BOOL, [1]), value("x3", FLOAT, [3])],
        [value("total", FLOAT, [3])],
        opset=11,
    )
    x1 = RNG.standard_normal((4, 3)).astype(np.float32)
    (total,) = assert_same_as_onnxruntime(model, [scalar(4, np.int64), x1, np.array([True]), np.zeros(3, np.float32)])
    np.testing.assert_allclose(total, x1.sum(axis=0), rtol=1e-6)


def test_while_loop_stops_on_body_condition():
    """No trip count: the body's condition output (sum still below x1) ends the loop."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "acc_in"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "x1"], ["cond_out"]),
        ],
        "body",
        [value("i", INT64, []), value("cond_in", BOOL, []), value("acc_in", FLOAT, [2])],
        [value("cond_out", BOOL, []), value("acc_out", FLOAT, [2])],
    )
    model = model_of(
        [
            helper.make_node("Constant", [], ["go"], value=helper.make_tensor("go", BOOL, [], [True])),
            helper.make_node("Loop", ["", "go", "x0"], ["final"], body=body),
        ],
        [value("x0", FLOAT, [2]), value("x1", FLOAT, [])],
        [value("final", FLOAT, [2])],
    )
    [final] = assert_same_as_onnxruntime(model, [np.array([0.5, 0.25], np.float32), scalar(40.0, np.float32)])
    np.testing.assert_array_equal(final, [32.0, 16.0])  # doubled until the sum reaches 40


def test_if_nested_inside_loop_reads_body_and_graph_values():
    """An If in a Loop body: its branches read a body value (the carried tensor) and a
    top-level graph input (x2) two scopes up; the condition changes per iteration."""
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x2"], ["then_out"])],
        "then",
        [],
        [value("then_out", FLOAT, [4])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "x2"], ["else_out"])],
        "else",
        [],
        [value("else_out", FLOAT, [4])],
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", INT64, [], [2])),
            helper.make_node("Less", ["i", "two"], ["early"]),
            helper.make_node("If", ["early"], ["acc_out"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Identity", ["early"], ["took_then"]),
        ],
        "body",
        [value("i", INT64, []), value("cond_in", BOOL, []), value("acc_in", FLOAT, [4])],
        [value("cond_out", BOOL, []), value("acc_out", FLOAT, [4]), value("took_then", BOOL, [])],
    )
    model = model_of(
        [helper.make_node("Loop", ["x0", "x3", "x1"], ["final", "branches"], body=body)],
        [value("x0", INT64, []), value("x1", FLOAT, [4]), value("x2", FLOAT, [4]), value("x3", BOOL, [])],
        [value("final", FLOAT, [4]), value("branches", BOOL, [None])],
    )
    inputs = [
        scalar(5, np.int64),
        RNG.standard_normal(4).astype(np.float32),
        RNG.standard_normal(4).astype(np.float32),
        scalar(True, np.bool_),
    ]
    _, branches = assert_same_as_onnxruntime(model, inputs)
    np.testing.assert_array_equal(branches, [True, True, False, False, False])


@pytest.mark.parametrize(
    "input_axes, input_directions, output_axes, output_directions",
    [
        ([1, 0], [1, 0], [0], [0]),
        ([-1, 0], [0, 1], [1], [1]),
        ([1, 0], [1, 1], [-1], [1]),
    ],
)
def test_scan_axes_and_directions(input_axes, input_directions, output_axes, output_directions):
    """Two scan inputs of length 5 along different axes (walked in either direction), one
    running-sum state, one scan output stacked along a chosen axis, possibly reversed."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["a", "b"], ["ab"]),
            helper.make_node("Add", ["sum_in", "ab"], ["sum_out"]),
            helper.make_node("Identity", ["sum_out"], ["trace"]),
        ],
        "body",
        [value("sum_in", FLOAT, [3]), value("a", FLOAT, [3]), value("b", FLOAT, [3])],
        [value("sum_out", FLOAT, [3]), value("trace", FLOAT, [3])],
    )
    model = model_of(
        [
            helper.make_node(
                "Scan",
                ["x0", "x1", "x2"],
                ["total", "traces"],
                body=body,
                num_scan_inputs=2,
                scan_input_axes=input_axes,
                scan_input_directions=input_directions,
                scan_output_axes=output_axes,
                scan_output_directions=output_directions,
            )
        ],
        [value("x0", FLOAT, [3]), value("x1", FLOAT, [3, 5]), value("x2", FLOAT, [5, 3])],
        [value("total", FLOAT, [3]), value("traces", FLOAT, [None, None])],
    )
    inputs = [RNG.standard_normal(shape).astype(np.float32) for shape in ([3], [3, 5], [5, 3])]
    _, traces = assert_same_as_onnxruntime(model, inputs)
    assert traces.shape == ((5, 3) if output_axes == [0] else (3, 5))


@pytest.mark.parametrize("directions", [[0], [1]])
def test_scan_8_batches_with_sequence_lengths(directions):
    """Opset 8's Scan: a batch axis first, per-entry lengths (scan outputs zero past them)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["sum_in", "step"], ["sum_out"]),
            helper.make_node("Identity", ["sum_out"], ["trace"]),
        ],
        "body",
        [value("sum_in", FLOAT, [2]), value("step", FLOAT, [2])],
        [value("sum_out", FLOAT, [2]), value("trace", FLOAT, [2])],
    )
    model = model_of(
        [
            helper.make_node(
                "Scan",
                ["x0", "x1", "x2"],
                ["total", "traces"],
                body=body,
                num_scan_inputs=1,
                directions=directions,
            )
        ],
        [value("x0", INT64, [3]), value("x1", FLOAT, [3, 2]), value("x2", FLOAT, [3, 4, 2])],
        [value("total", FLOAT, [3, 2]), value("traces", FLOAT, [3, 4, 2])],
        opset=8,
    )
    inputs = [
        np.array([4, 2, 1], np.int64),
        RNG.standard_normal((3, 2)).astype(np.float32),
        RNG.standard_normal((3, 4, 2)).astype(np.float32),
    ]
    _, traces = assert_same_as_onnxruntime(model, inputs)
    assert not traces[1, 2:].any() and not traces[2, 1:].any()


def test_loop_carried_tensor_grows_every_iteration():
    """The carried tensor gains one element per iteration (Concat), and a second carried
    value is a sequence built alongside it; shapes differ on every body run."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Cast", ["i"], ["i_float"], to=FLOAT),
            helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("axes", INT64, [1], [0])),
            helper.make_node("Unsqueeze", ["i_float", "axes"], ["item"]),
            helper.make_node("Mul", ["item", "x1"], ["scaled"]),
            helper.make_node("Concat", ["grown_in", "scaled"], ["grown_out"], axis=0),
            helper.make_node("SequenceInsert", ["seq_in", "grown_out"], ["seq_out"]),
        ],
        "body",
        [
            value("i", INT64, []),
            value("cond_in", BOOL, []),
            value("grown_in", FLOAT, [None]),
            helper.make_tensor_sequence_value_info("seq_in", FLOAT, [None]),
        ],
        [
            value("cond_out", BOOL, []),
            value("grown_out", FLOAT, [None]),
            helper.make_tensor_sequence_value_info("seq_out", FLOAT, [None]),
        ],
    )
    model = model_of(
        [
            helper.make_node("SequenceEmpty", [], ["empty"], dtype=FLOAT),
            helper.make_node("Loop", ["x0", "", "x2", "empty"], ["grown", "history"], body=body),
            helper.make_node("SequenceLength", ["history"], ["count"]),
        ],
        [value("x0", INT64, []), value("x1", FLOAT, [1]), value("x2", FLOAT, [2])],
        [
            value("grown", FLOAT, [None]),
            helper.make_tensor_sequence_value_info("history", FLOAT, [None]),
            value("count", INT64, []),
        ],
    )
    inputs = [scalar(6, np.int64), np.array([1.5], np.float32), np.array([-1.0, 2.0], np.float32)]
    grown, history, count = assert_same_as_onnxruntime(model, inputs)
    assert grown.shape == (8,) and [item.shape for item in history] == [(n,) for n in range(3, 9)]
    assert int(count) == 6


def test_loop_carries_an_empty_optional_made_by_an_untyped_node():
    """`Optional()` with no input is an empty optional (None). Its output has no declared
    type (nothing infers types with optimizations off); the Loop carries it unchanged and
    the body asks whether it holds something on every iteration."""
    element = helper.make_tensor_type_proto(FLOAT, [2])
    optional = helper.make_optional_type_proto(element)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("OptionalHasElement", ["opt_in"], ["has"]),
            helper.make_node("Identity", ["opt_in"], ["opt_out"]),
            helper.make_node("Cast", ["has"], ["has_float"], to=FLOAT),
        ],
        "body",
        [value("i", INT64, []), value("cond_in", BOOL, []), helper.make_value_info("opt_in", optional)],
        [
            value("cond_out", BOOL, []),
            helper.make_value_info("opt_out", optional),
            value("has_float", FLOAT, []),
        ],
    )
    model = model_of(
        [
            helper.make_node("Optional", [], ["nothing"], type=element),
            helper.make_node("Loop", ["x0", "", "nothing"], ["final", "trace"], body=body),
            helper.make_node("OptionalHasElement", ["final"], ["final_has"]),
        ],
        [value("x0", INT64, [])],
        [value("trace", FLOAT, [None]), value("final_has", BOOL, [])],
        opset=18,
    )
    trace, final_has = assert_same_as_onnxruntime(model, [scalar(3, np.int64)])
    np.testing.assert_array_equal(trace, [0.0, 0.0, 0.0])
    assert not final_has


def test_sequence_ops_against_onnxruntime():
    """Split, erase, insert (negative position), at, length and both concat modes in one graph."""
    nodes = [
        helper.make_node("SplitToSequence", ["x0", "x1"], ["pieces"], axis=1),  # scalar split: 2, 2, 1
        helper.make_node("SequenceErase", ["pieces", "x2"], ["erased"]),
        helper.make_node("Slice", ["x0", "x3", "x4", "x5"], ["head"]),
        helper.make_node("SequenceInsert", ["erased", "head", "x2"], ["inserted"]),
        helper.make_node("SequenceAt", ["inserted", "x2"], ["picked"]),
        helper.make_node("SequenceLength", ["inserted"], ["length"]),
        helper.make_node("ConcatFromSequence", ["inserted"], ["joined"], axis=-1),
        helper.make_node("SplitToSequence", ["x0"], ["rows"], axis=0, keepdims=0),
        helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=-1, new_axis=1),
        helper.make_node("SequenceConstruct", ["picked", "head"], ["pair"]),
    ]
    model = model_of(
        nodes,
        [
            value("x0", FLOAT, [4, 5]),
            value("x1", INT64, []),
            value("x2", INT64, []),
            value("x3", INT64, [1]),
            value("x4", INT64, [1]),
            value("x5", INT64, [1]),
        ],
        [
            helper.make_tensor_sequence_value_info("inserted", FLOAT, [4, None]),
            value("picked", FLOAT, [4, None]),
            value("length", INT64, []),
            value("joined", FLOAT, [4, None]),
            value("stacked", FLOAT, [5, 4]),
            helper.make_tensor_sequence_value_info("pair", FLOAT, [4, None]),
        ],
    )
    inputs = [
        RNG.standard_normal((4, 5)).astype(np.float32),
        scalar(2, np.int64),
        scalar(-2, np.int64),
        np.array([0], np.int64),
        np.array([3], np.int64),
        np.array([1], np.int64),
    ]
    inserted, _, length, joined, stacked, _ = assert_same_as_onnxruntime(model, inputs)
    assert [item.shape for item in inserted] == [(4, 3), (4, 2), (4, 1)] and int(length) == 3
    assert joined.shape == (4, 6) and stacked.shape == (5, 4)


def test_sequence_insert_leaves_its_input_sequence_alone():
    """Sequences are shared between readers: inserting builds a new list."""
    [kernel_class] = [k for k in control_flow.KERNELS if k.op_type == "SequenceInsert"]
    node = helper.make_node("SequenceInsert", ["s", "t"], ["out"])
    kernel = kernel_class(ir.serde.deserialize_node(node), 11)
    original = [np.zeros(2, np.float32)]
    [result] = kernel.run(original, np.ones(2, np.float32))
    assert len(original) == 1 and len(result) == 2


def test_missing_op_inside_loop_body_fails_at_session_creation():
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node(
                "Frobnicate", ["acc_in"], ["acc_out"], name="body_frobnicate", domain="test.missing"
            ),
        ],
        "body",
        [value("i", INT64, []), value("cond_in", BOOL, []), value("acc_in", FLOAT, [2])],
        [value("cond_out", BOOL, []), value("acc_out", FLOAT, [2])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["x0", "", "x1"], ["final"], body=body, name="outer_loop")],
        "missing_in_body",
        [value("x0", INT64, []), value("x1", FLOAT, [2])],
        [value("final", FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.missing", 1)]
    )
    model.ir_version = 8
    with pytest.raises(UnsupportedModelError) as raised:
        InferenceSession(model, NO_OPTIMIZATION)
    [entry] = raised.value.unsupported
    assert (entry.domain, entry.op_type, entry.nodes) == ("test.missing", "Frobnicate", ["body_frobnicate"])
    assert "body_frobnicate" in str(raised.value)
