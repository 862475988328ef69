"""The plan written out as one function (runtime/plan_function.py), which runs every run after a
feed shape's first: its outputs, when it lets go of intermediates, runs whose shapes change, and
errors that still name the node."""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from runtime import InferenceSession, NodeExecutionError, SessionOptions
from runtime.kernels.base import Kernel
from tests.oracle import MODELS, run_onnxruntime
from tests.runtime.runtime_toy_kernels import TOY_KERNELS
from tests.runtime.test_executor import make_model, mlp_model, tensor

DOMAIN = "test.fusionwatch"
NO_OPT = SessionOptions(graph_optimization_level="disabled")


class Track(Kernel):
    """y = x + 1 into a fresh array. Every call records which arrays the earlier calls made are
    still alive (in `alive`, by call), so a test can see when the run let go of each."""

    op_type = "Track"
    domain = DOMAIN
    since_version = 1
    made: list[weakref.ref] = []
    alive: list[list[int]] = []

    def run(self, x):
        Track.alive.append([i for i, ref in enumerate(Track.made) if ref() is not None])
        y = x + 1
        Track.made.append(weakref.ref(y))
        return (y,)


class NegativeRefused(Kernel):
    """Fails on negative input: a first run can pass and a later one fail in the same node."""

    op_type = "NegativeRefused"
    domain = DOMAIN
    since_version = 1

    def run(self, x):
        if (x < 0).any():
            raise ValueError("negative input")
        return (x * 2,)


def _session(model, options=NO_OPT):
    return InferenceSession(model, options, extra_kernels=[*TOY_KERNELS, Track, NegativeRefused])


def test_runs_after_the_first_give_the_first_runs_outputs():
    model = mlp_model()
    ours = _session(model)
    x = np.random.default_rng(3).standard_normal((1, 16, 64)).astype(np.float32)
    first = ours.run(None, {"x": x})[0]  # the measured loop
    for _ in range(3):  # the written-out function
        np.testing.assert_array_equal(ours.run(None, {"x": x})[0], first)
    np.testing.assert_allclose(first, run_onnxruntime(model, {"x": x})["y"], rtol=1e-3, atol=1e-4)


def test_function_lets_go_of_each_intermediate_after_its_last_reader():
    # x -> a -> b -> c -> y, and d = Track(a) read last: a lives until d is made, b and c die early.
    nodes = [
        helper.make_node("Track", ["x"], ["a"], name="t0", domain=DOMAIN),
        helper.make_node("Track", ["a"], ["b"], name="t1", domain=DOMAIN),
        helper.make_node("Track", ["b"], ["c"], name="t2", domain=DOMAIN),
        helper.make_node("Track", ["c"], ["y"], name="t3", domain=DOMAIN),
        helper.make_node("Track", ["a"], ["d"], name="t4", domain=DOMAIN),
    ]
    model = make_model(nodes, [tensor("x", [4])], [tensor("y", [4]), tensor("d", [4])], extra_opsets=[(DOMAIN, 1)])
    ours = _session(model)
    x = np.zeros(4, np.float32)
    ours.run(None, {"x": x})
    Track.made.clear()
    Track.alive.clear()
    y, d = ours.run(None, {"x": x})  # through the function
    np.testing.assert_array_equal(y, [4, 4, 4, 4])
    np.testing.assert_array_equal(d, [2, 2, 2, 2])
    # When t3 runs, a (0) and c (2) are alive; b (1) was let go after t2 read it. When t4 runs,
    # c is gone and y (3) is kept, as a graph output.
    assert Track.alive == [[], [0], [0, 1], [0, 2], [0, 3]]


def test_outputs_follow_the_feeds_when_shapes_change_between_runs():
    """BERT's shape arithmetic (Shape, Gather, Unsqueeze, Concat, Reshape, Slice) keeps what it
    works out per input shape; runs alternating between sequence lengths must not mix them up."""
    path = MODELS / "bert_torchscript_opset14.onnx"
    model = onnx.load(str(path))
    for level in ("disabled", "all"):
        ours = InferenceSession(str(path), SessionOptions(graph_optimization_level=level))
        rng = np.random.default_rng(5)
        for seq in (4, 9, 4, 1, 9):
            feeds = {
                "input_ids": rng.integers(0, 1000, (1, seq), dtype=np.int64),
                "attention_mask": np.ones((1, seq), np.int64),
                "token_type_ids": np.zeros((1, seq), np.int64),
            }
            for mine, theirs in zip(ours.run(None, feeds), run_onnxruntime(model, feeds).values(), strict=True):
                np.testing.assert_allclose(mine, theirs, rtol=1e-3, atol=1e-4, err_msg=f"{level} seq {seq}")


def test_failure_in_the_function_names_node_op_and_input_shapes():
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="shift"),
        helper.make_node("NegativeRefused", ["a"], ["y"], name="picky", domain=DOMAIN),
    ]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], [w], extra_opsets=[(DOMAIN, 1)])
    ours = _session(model)
    ours.run(None, {"x": np.zeros((2, 3), np.float32)})  # the measured first run passes
    with pytest.raises(NodeExecutionError) as raised:
        ours.run(None, {"x": np.full((2, 3), -5.0, np.float32)})
    message = str(raised.value)
    assert "'picky' (test.fusionwatch.NegativeRefused, kernel NegativeRefused)" in message
    assert "float32[2, 3]" in message and "ValueError: negative input" in message
    assert isinstance(raised.value.__cause__, ValueError)
    # The session is still usable after the failure.
    np.testing.assert_array_equal(ours.run(None, {"x": np.ones((2, 3), np.float32)})[0], np.full((2, 3), 4.0))


def test_kept_shape_results_are_copied_for_the_caller():
    """Shape's array is kept per input shape and handed out read-only; an output the caller gets
    is its own, writeable, and writing into it changes nothing in the next run."""
    model = make_model([helper.make_node("Shape", ["x"], ["s"])], [tensor("x", [None, 3])], [tensor("s", [2], 7)])
    ours = _session(model)
    for _ in range(3):
        shape = ours.run(None, {"x": np.zeros((2, 3), np.float32)})[0]
        np.testing.assert_array_equal(shape, [2, 3])
        shape[0] = 99
