"""Fuzzing: random byte flips and random graph edits of real fixtures, through load → optimize → run.

The property the worker relies on: every outcome is a correct run or one of the clean errors that name
the problem (a load error, an unsupported or invalid graph, a node that failed on its inputs), never
another exception — which would crash a job with a traceback instead of a reason.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import runtime
from optimizer import ModelLoadError, optimize
from runtime.errors import GraphPlanError, InvalidFeedError, NodeExecutionError, UnsupportedModelError
from service.adapters.engines.feeds import FeedError, make_feeds

# Examples per strategy: 60 in `make test`; FUSIONWATCH_FUZZ_EXAMPLES=4000 for a longer hunt.
EXAMPLES = int(os.environ.get("FUSIONWATCH_FUZZ_EXAMPLES", "60"))
CLEAN_ERRORS = (ModelLoadError, UnsupportedModelError, GraphPlanError, InvalidFeedError, NodeExecutionError, FeedError)
FIXTURES = ["tests/models/resnet_tiny_opset17.onnx", "tests/models/bert_static_torchscript_opset14.onnx"]


def _through_everything(data: bytes) -> None:
    try:
        for level in ("basic", "all"):
            optimize(data, level=level)
        proto = onnx.load_from_string(data)
        feeds = make_feeds(proto, sequence_length=8)
        session = runtime.InferenceSession(data, runtime.SessionOptions(graph_optimization_level="all"))
        outputs = session.run(None, feeds)
        assert all(isinstance(o, np.ndarray | list) for o in outputs)
    except CLEAN_ERRORS as error:
        assert str(error), f"{type(error).__name__} without a message"
    except onnx.onnx_cpp2py_export.checker.ValidationError:
        pass  # onnx's own parse of a mangled file, before ours


@functools.cache
def _fixture(index: int) -> bytes:
    return open(FIXTURES[index], "rb").read()


@settings(max_examples=EXAMPLES, deadline=None)
@example(which=1, flips=[(0.0029198018212461823, 0)])  # found by a longer run: an attribute's type cleared
@given(which=st.integers(0, len(FIXTURES) - 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_random_byte_flips_end_cleanly(which, flips):
    data = bytearray(_fixture(which))
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    _through_everything(bytes(data))


EDITS = ("drop_node", "rewire_input", "drop_initializer", "change_int_attribute", "truncate", "duplicate_output_name")


# An edited graph may compute NaN or infinity from the fixtures' weights: numpy
# says so with a RuntimeWarning, and the run must still end cleanly, which is what this test checks.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
@settings(max_examples=EXAMPLES, deadline=None)
@example(which=0, edits=[("rewire_input", 207, 0), ("rewire_input", 207, -1)])  # found by a longer run: a Conv's bias
@given(which=st.integers(0, len(FIXTURES) - 1), edits=st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0, 10_000), st.integers(-3, 64)), min_size=1, max_size=4))
def test_random_graph_edits_end_cleanly(which, edits):
    model = onnx.load_from_string(_fixture(which))
    graph = model.graph
    truncate_at = None
    for edit, index, value in edits:
        nodes = graph.node
        if edit == "drop_node" and nodes:
            del nodes[index % len(nodes)]
        elif edit == "rewire_input" and nodes:
            node = nodes[index % len(nodes)]
            names = [o for n in nodes for o in n.output] + [i.name for i in graph.input]
            if node.input and names:
                node.input[value % len(node.input)] = names[(index * 7) % len(names)]
        elif edit == "drop_initializer" and graph.initializer:
            del graph.initializer[index % len(graph.initializer)]
        elif edit == "change_int_attribute":
            ints = [(n, a) for n in nodes for a in n.attribute if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)]
            if ints:
                _, attribute = ints[index % len(ints)]
                if attribute.type == onnx.AttributeProto.INT:
                    attribute.i = value
                elif attribute.ints:
                    attribute.ints[index % len(attribute.ints)] = value
        elif edit == "truncate":
            truncate_at = index
        elif edit == "duplicate_output_name" and len(graph.output) and nodes:
            nodes[index % len(nodes)].output[0] = graph.output[0].name
    data = model.SerializeToString()
    if truncate_at is not None:
        data = data[: max(1, truncate_at * len(data) // 10_000)]
    _through_everything(data)
