"""One table builder reads onnxruntime's traces and ours the same way."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import runtime
from runtime.profile_table import exclusive_durations, load_trace, profile_table
from tests.oracle import MODELS, fixture_feeds

MODEL = MODELS / "bert_torchscript_opset14.onnx"


def _ort_trace(tmp_path, feeds, runs):
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "ort")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, feeds)
    return load_trace(session.end_profiling())


def _our_trace(tmp_path, feeds, runs):
    options = runtime.SessionOptions(
        graph_optimization_level="disabled", enable_profiling=True, profile_file_prefix=str(tmp_path / "ours")
    )
    session = runtime.InferenceSession(str(MODEL), options)
    for _ in range(runs):
        session.run(None, feeds)
    return load_trace(session.end_profiling())


def test_both_engines_give_the_same_table_shape(tmp_path):
    import onnx

    feeds = fixture_feeds(onnx.load(MODEL))
    ours = profile_table(_our_trace(tmp_path, feeds, 3), skip_runs=1)
    theirs = profile_table(_ort_trace(tmp_path, feeds, 3), skip_runs=1)
    assert ours.runs == theirs.runs == 2
    assert len(ours.execute_us) == len(theirs.execute_us) == 2
    assert ours.median_model_run_ms >= ours.median_execute_ms > 0
    # The unoptimized graph runs the same ops the same number of times in both engines,
    # except those onnxruntime folds away while loading even with optimizations off.
    our_calls = {t.op: t.calls_per_run for t in ours.ops}
    their_calls = {t.op: t.calls_per_run for t in theirs.ops}
    for op in ("MatMul", "Softmax", "Erf", "Add"):
        assert our_calls[op] == their_calls[op], op


def test_a_trace_without_runs_is_named_as_such():
    with pytest.raises(ValueError, match="no model_run event"):
        profile_table([{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 5}])


def test_a_subgraphs_execute_is_not_counted_as_a_run():
    """onnxruntime writes an Execute for each If branch it runs, inside the run's own."""
    events = [{"name": "model_run", "ts": 0, "dur": 100}, {"name": "SequentialExecutor::Execute", "ts": 5, "dur": 90},
              {"name": "SequentialExecutor::Execute", "ts": 20, "dur": 10},
              {"name": "model_run", "ts": 200, "dur": 100}, {"name": "SequentialExecutor::Execute", "ts": 205, "dur": 80},
              {"name": "SequentialExecutor::Execute", "ts": 230, "dur": 15}]
    table = profile_table(events)
    assert (table.runs, table.execute_us) == (2, [90, 80])


def _kernel(op, ts, dur, tid=1):
    return {"cat": "Node", "name": f"{op}_{ts}_kernel_time", "ts": ts, "dur": dur, "tid": tid, "args": {"op_name": op}}


def test_a_subgraphs_kernels_are_not_counted_again_in_the_if_that_ran_them():
    """An If's kernel time spans its branch's nodes, which are kernels of their own: the If keeps only
    what it spent outside them, a nested Loop's body is taken off the Loop only, another thread's
    kernel at the same moment is not nested."""
    events = [{"name": "model_run", "ts": 0, "dur": 1000},
              _kernel("MatMul", 10, 50),
              _kernel("If", 100, 400), _kernel("Softmax", 120, 100), _kernel("Loop", 250, 200),
              _kernel("Add", 260, 30), _kernel("Mul", 300, 40),
              _kernel("Gemm", 120, 300, tid=2), _kernel("Relu", 600, 20)]
    ops = {t.op: t.us_per_run for t in profile_table(events).ops}
    assert ops == {"MatMul": 50, "If": 400 - 100 - 200, "Softmax": 100, "Loop": 200 - 30 - 40, "Add": 30, "Mul": 40,
                   "Gemm": 300, "Relu": 20}
    assert exclusive_durations([_kernel("If", 0, 10), _kernel("Add", 0, 10)]) == [0.0, 10.0]  # both as long
