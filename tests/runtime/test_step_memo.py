"""Shape arithmetic kept per shape (runtime/step_memo.py): which steps keep their results, that a
changed shape computes afresh (one shape, another, the first again, against onnxruntime), and
that nothing a caller or a feed can change is ever kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions
from runtime.step_memo import MAX_ENTRIES
from tests.oracle import MODELS, fixture_feeds, run_onnxruntime
from tests.runtime.test_executor import make_model, tensor

INT64 = TensorProto.INT64
NO_OPT = SessionOptions(graph_optimization_level="disabled")
RTOL, ATOL = 1e-3, 1e-4


def reshape_by_shape_model():
    """y = Reshape(x, [x.shape[0] * x.shape[1], x.shape[2]]), the target worked out at run time as
    exporters write it; `target` is also a graph output."""
    consts = [
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array(1, np.int64), "i1"),
        numpy_helper.from_array(np.array(2, np.int64), "i2"),
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "i0"], ["d0"], name="d0"),
        helper.make_node("Gather", ["shape", "i1"], ["d1"], name="d1"),
        helper.make_node("Gather", ["shape", "i2"], ["d2"], name="d2"),
        helper.make_node("Mul", ["d0", "d1"], ["rows"], name="rows"),
        helper.make_node("Unsqueeze", ["rows", "axes"], ["rows_1d"], name="rows_1d"),
        helper.make_node("Unsqueeze", ["d2", "axes"], ["cols_1d"], name="cols_1d"),
        helper.make_node("Concat", ["rows_1d", "cols_1d"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    return make_model(
        nodes, [tensor("x", ["a", "b", "c"])], [tensor("y", ["r", "c"]), tensor("target", [2], INT64)], consts
    )


def memo_steps(session):
    return {step.label for step in session.plan.steps if step.memo is not None}


def test_steps_computing_from_shapes_alone_keep_their_results():
    ours = InferenceSession(reshape_by_shape_model(), NO_OPT)
    # Shape keeps its own arrays per shape; Reshape reads the feed, so it runs every time.
    assert memo_steps(ours) == {"d0", "d1", "d2", "rows", "rows_1d", "cols_1d", "target"}


@pytest.mark.parametrize("profiling", [False, True])
def test_one_shape_then_another_then_the_first_again_match_onnxruntime(profiling, tmp_path):
    model = reshape_by_shape_model()
    options = SessionOptions(graph_optimization_level="disabled", enable_profiling=profiling,
                             profile_file_prefix=str(tmp_path / "p"))  # fmt: skip
    ours = InferenceSession(model, options)
    rng = np.random.default_rng(0)
    for shape in [(2, 3, 4), (5, 1, 4), (2, 3, 4), (2, 3, 4), (5, 1, 4), (1, 1, 1)]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        expected = run_onnxruntime(model, feeds)
        y, target = ours.run(None, feeds)
        np.testing.assert_allclose(y, expected["y"], rtol=RTOL, atol=ATOL, err_msg=str(shape))
        np.testing.assert_array_equal(target, expected["target"], err_msg=str(shape))
    step = next(step for step in ours.plan.steps if step.label == "target")
    assert len(step.memo.results) == 3  # one entry per distinct shape


def test_a_kept_result_handed_out_is_the_callers_own():
    ours = InferenceSession(reshape_by_shape_model(), NO_OPT)
    x = np.zeros((2, 3, 4), np.float32)
    for _ in range(3):
        target = ours.run(None, {"x": x})[1]
        np.testing.assert_array_equal(target, [6, 4])
        assert target.flags.writeable
        target[:] = 99  # must not reach the kept result


def test_values_from_feeds_are_never_kept():
    """Gather on a fed int64 array is not shape arithmetic: a feed changed in place between runs
    gives a new result."""
    nodes = [helper.make_node("Gather", ["ids", "i"], ["y"], name="pick")]
    model = make_model(
        nodes, [tensor("ids", [3], INT64)], [tensor("y", [], INT64)],
        [numpy_helper.from_array(np.array(1, np.int64), "i")],
    )  # fmt: skip
    ours = InferenceSession(model, NO_OPT)
    assert memo_steps(ours) == set()
    ids = np.array([5, 6, 7], np.int64)
    assert ours.run(None, {"ids": ids})[0] == 6
    ids[1] = 42
    assert ours.run(None, {"ids": ids})[0] == 42


def test_a_large_result_is_made_afresh_and_steps_reading_it_keep_nothing():
    """ConstantOfShape of a large shape is computed on every run (not held between runs), so the
    Add reading it has no read-only input to key on and keeps nothing either."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Add", ["zeros", "one"], ["twos"], name="twos"),
        helper.make_node("Add", ["x", "twos"], ["y"], name="y"),
    ]  # fmt: skip
    model = make_model(
        nodes, [tensor("x", ["a", "b"])], [tensor("y", ["a", "b"])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )  # fmt: skip
    ours = InferenceSession(model, NO_OPT)
    assert memo_steps(ours) == {"zeros", "twos"}
    for shape in [(100, 100), (2, 2), (100, 100)]:
        x = np.ones(shape, np.float32)
        np.testing.assert_array_equal(ours.run(None, {"x": x})[0], np.full(shape, 3.0))
    steps = {step.label: step for step in ours.plan.steps}
    assert len(steps["zeros"].memo.results) == 1  # the 2x2 one
    assert len(steps["twos"].memo.results) == 1


def test_a_step_keeps_a_bounded_number_of_shapes():
    ours = InferenceSession(reshape_by_shape_model(), NO_OPT)
    for rows in range(1, 2 * MAX_ENTRIES + 3):
        y, target = ours.run(None, {"x": np.zeros((rows, 1, 2), np.float32)})
        np.testing.assert_array_equal(target, [rows, 2])
    step = next(step for step in ours.plan.steps if step.label == "target")
    assert 0 < len(step.memo.results) <= MAX_ENTRIES


def test_ops_outside_the_pure_list_and_what_reads_them_are_not_kept():
    """Dropout in training mode draws (seeded here, but it is no pure function of its inputs in
    general): neither it nor the Add after it keeps anything."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Dropout", ["shape_f", "ratio", "training"], ["dropped"], name="drop", seed=1),
        helper.make_node("Add", ["dropped", "shape_f"], ["y"], name="add"),
    ]
    model = make_model(
        nodes, [tensor("x", ["a"])], [tensor("y", [1])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "training")],
    )  # fmt: skip
    ours = InferenceSession(model, NO_OPT)
    assert memo_steps(ours) == {"cast"}
    ours.run(None, {"x": np.zeros(3, np.float32)})


@pytest.mark.parametrize("name", ["gpt2_torchscript_opset14.onnx", "bert_torchscript_opset14.onnx"])
@pytest.mark.parametrize("level", ["disabled", "all"])
def test_exported_models_match_onnxruntime_as_the_sequence_changes(name, level):
    model = onnx.load(str(MODELS / name))
    ours = InferenceSession(str(MODELS / name), SessionOptions(graph_optimization_level=level))
    assert len(memo_steps(ours)) > 10  # their shape arithmetic is kept
    for seq in (16, 1, 16, 5, 1):
        feeds = fixture_feeds(model, batch=1, seq=seq, seed=seq)
        for mine, (out, theirs) in zip(ours.run(None, feeds), run_onnxruntime(model, feeds).items(), strict=True):
            np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL, err_msg=f"{name} {level} {out} seq {seq}")
