"""Profiles: ONNX Runtime's trace format, event by event, and no profiling work when off."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

import runtime.executor as executor_module
from runtime import InferenceSession, SessionOptions
from tests.runtime.runtime_toy_kernels import TOY_KERNELS
from tests.runtime.test_executor import if_model, mlp_model

NODE_ARGS = {
    "op_name",
    "provider",
    "node_index",
    "activation_size",
    "parameter_size",
    "output_size",
    "input_type_shape",
    "output_type_shape",
}
SESSION_EVENTS = {"model_loading_uri", "session_initialization", "model_run", "SequentialExecutor::Execute"}


def node_table(trace: list[dict]) -> dict[str, tuple[int, int]]:
    """The table a report builds from either runtime's profile: op -> (calls, total µs)."""
    calls: Counter = Counter()
    total: Counter = Counter()
    for event in trace:
        if event["cat"] == "Node" and event["name"].endswith("_kernel_time"):
            calls[event["args"]["op_name"]] += 1
            total[event["args"]["op_name"]] += event["dur"]
    return {op: (calls[op], total[op]) for op in calls}


def profile_both(tmp_path: Path, model, feeds, runs: int = 2):
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    ort_options = onnxruntime.SessionOptions()
    ort_options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_options.enable_profiling = True
    ort_options.profile_file_prefix = str(tmp_path / "ort")
    theirs = onnxruntime.InferenceSession(str(path), ort_options, providers=["CPUExecutionProvider"])
    ours = InferenceSession(
        str(path),
        SessionOptions(
            graph_optimization_level="disabled",
            enable_profiling=True,
            profile_file_prefix=str(tmp_path / "fw"),
        ),
        extra_kernels=TOY_KERNELS,
    )
    for _ in range(runs):
        theirs.run(None, feeds)
        ours.run(None, feeds)
    ours_path = ours.end_profiling()
    return (
        json.loads(Path(theirs.end_profiling()).read_text()),
        json.loads(Path(ours_path).read_text()),
        ours_path,
    )


def test_trace_has_onnxruntimes_events_and_fields(tmp_path):
    feeds = {"x": np.ones((1, 16, 64), np.float32)}
    theirs, ours, path = profile_both(tmp_path, mlp_model(), feeds)
    assert Path(path).name.startswith("fw_") and path.endswith(".json")

    assert Counter(e["name"] for e in ours if e["cat"] == "Session") == {
        "model_loading_uri": 1,
        "session_initialization": 1,
        "model_run": 2,
        "SequentialExecutor::Execute": 2,
    }
    assert {e["name"] for e in theirs if e["cat"] == "Session"} == SESSION_EVENTS
    for event in ours:
        assert set(event) == {"cat", "pid", "tid", "dur", "ts", "ph", "name", "args"}
        assert event["ph"] == "X" and all(isinstance(event[k], int) for k in ("pid", "tid", "dur", "ts"))

    ours_nodes = [e for e in ours if e["cat"] == "Node"]
    theirs_nodes = [e for e in theirs if e["cat"] == "Node"]
    assert (
        [e["name"] for e in ours_nodes]
        == [e["name"] for e in theirs_nodes]
        == ["mm1_kernel_time", "add1_kernel_time", "relu1_kernel_time", "mm2_kernel_time"] * 2
    )
    for mine, reference in zip(ours_nodes, theirs_nodes, strict=True):
        assert NODE_ARGS <= set(mine["args"])
        assert mine["args"]["op_name"] == reference["args"]["op_name"]
        assert mine["args"]["provider"] == "FusionwatchCPU"
        assert mine["args"]["output_type_shape"] == reference["args"]["output_type_shape"]
        assert mine["args"]["output_size"] == reference["args"]["output_size"]
        for key in ("activation_size", "parameter_size", "output_size", "node_index"):
            assert isinstance(mine["args"][key], str) and isinstance(reference["args"][key], str)
    # Same table from both files; ORT leaves prepacked weights out of input_type_shape, we list them.
    assert (
        {op: calls for op, (calls, _) in node_table(ours).items()}
        == {op: calls for op, (calls, _) in node_table(theirs).items()}
        == {"MatMul": 4, "Add": 2, "Relu": 2}
    )
    mm1 = ours_nodes[0]["args"]
    assert mm1["input_type_shape"] == [{"float": [1, 16, 64]}, {"float": [64, 32]}]
    assert (mm1["activation_size"], mm1["parameter_size"], mm1["output_size"]) == ("4096", "8192", "2048")


def test_events_nest_in_time_like_onnxruntimes(tmp_path):
    _, ours, _ = profile_both(tmp_path, mlp_model(), {"x": np.ones((1, 16, 64), np.float32)}, runs=1)
    by_name = {e["name"]: e for e in ours}
    run, execute = by_name["model_run"], by_name["SequentialExecutor::Execute"]
    loading, init = by_name["model_loading_uri"], by_name["session_initialization"]
    assert loading["ts"] + loading["dur"] <= init["ts"] + 1 and init["ts"] + init["dur"] <= run["ts"] + 1
    assert run["ts"] <= execute["ts"] and execute["ts"] + execute["dur"] <= run["ts"] + run["dur"] + 1
    nodes = [e for e in ours if e["cat"] == "Node"]
    assert all(
        execute["ts"] <= n["ts"] and n["ts"] + n["dur"] <= execute["ts"] + execute["dur"] + 1 for n in nodes
    )
    # ORT writes an event when it ends: nodes, then the executor, then the run.
    assert [e["name"] for e in ours][-2:] == ["SequentialExecutor::Execute", "model_run"]


def test_subgraph_nodes_are_profiled(tmp_path):
    feeds = {"x": np.array([1.0, 2.0, 3.0], np.float32), "flag": np.array(True), "flag2": np.array(False)}
    theirs, ours, _ = profile_both(tmp_path, if_model(), feeds, runs=1)
    names = [e["name"] for e in ours if e["cat"] == "Node"]
    assert sorted(names) == sorted(
        [
            "make_scale_kernel_time",
            "outer_if_kernel_time",
            "nested_if_kernel_time",
            "nested_add_kernel_time",
            "then_relu_kernel_time",
        ]
    )
    assert sorted(names) == sorted(e["name"] for e in theirs if e["cat"] == "Node")


def test_profiling_off_costs_nothing_and_end_profiling_returns_empty(monkeypatch):
    ours = InferenceSession(
        mlp_model(), SessionOptions(graph_optimization_level="disabled"), extra_kernels=TOY_KERNELS
    )
    x = np.ones((1, 16, 64), np.float32)
    ours.run(None, {"x": x})  # first run per shape is measured (peak bytes)
    monkeypatch.setattr(executor_module, "run_measured", pytest.fail)
    ours.run(None, {"x": x})
    assert ours.end_profiling() == ""


def test_runs_after_end_profiling_are_not_recorded(tmp_path):
    options = SessionOptions(
        graph_optimization_level="disabled", enable_profiling=True, profile_file_prefix=str(tmp_path / "p")
    )
    ours = InferenceSession(mlp_model(), options, extra_kernels=TOY_KERNELS)
    x = np.ones((1, 16, 64), np.float32)
    ours.run(None, {"x": x})
    path = ours.end_profiling()
    ours.run(None, {"x": x})
    trace = json.loads(Path(path).read_text())
    assert sum(e["cat"] == "Node" for e in trace) == 4
    assert {e["name"] for e in trace if e["cat"] == "Session"} == {
        "model_loading_array",
        "session_initialization",
        "model_run",
        "SequentialExecutor::Execute",
    }
    assert ours.end_profiling() == ""
