"""Profiles in ONNX Runtime's JSON format, so one table builder (and Perfetto) reads both.

The file is a JSON array of chrome-trace "complete" events, one per line, as ONNX Runtime's
profiler writes it:

    {"cat": "Session", "pid": 4242, "tid": 4242, "dur": 443, "ts": 3, "ph": "X",
     "name": "model_loading_uri", "args": {}}
    {"cat": "Node", ..., "name": "/mlp/MatMul_kernel_time",
     "args": {"op_name": "MatMul", "provider": "FusionwatchCPU", "node_index": "3",
              "input_type_shape": [{"float": [1, 16, 64]}], "output_type_shape": [...],
              "activation_size": "4096", "parameter_size": "16384", "output_size": "4096"}}

Times are microseconds since the session started profiling. Session events are
`model_loading_uri` (or `model_loading_array` for in-memory models), `session_initialization`,
and per run `SequentialExecutor::Execute` inside `model_run`; node events are
`<node name>_kernel_time`. Sizes are strings and a node event is written before the session
events that enclose it, both as ONNX Runtime does. `thread_scheduling_stats` and ORT's arena
counters are omitted. Subgraph nodes (If/Loop/Scan bodies) get node events too: the session
publishes its profiler in `ACTIVE_PROFILER` for the length of a run.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from runtime.plan import SINK_SLOT, Plan, Step

# Set by the session while a profiled run is in progress; subgraph executors read it.
ACTIVE_PROFILER: ContextVar[Profiler | None] = ContextVar("fusionwatch_active_profiler", default=None)

PROVIDER_NAMES = {"cpu": "FusionwatchCPU", "cuda": "FusionwatchCUDA"}

# ONNX Runtime's DataTypeImpl::ToString names where they differ from numpy's.
_ORT_TYPE_NAMES = {"float32": "float", "float64": "double", "object": "string", "str": "string"}


def provider_name(backend_name: str) -> str:
    return PROVIDER_NAMES.get(backend_name, f"Fusionwatch{backend_name.upper()}")


def _brief(value: Any) -> tuple:
    """(dtype, shape, bytes) of a value, all a node event needs of it; dtype None for a value
    ORT would not list (a sequence)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return (None, None, nbytes(value))
    return (dtype, value.shape, int(getattr(value, "nbytes", 0)))


def _type_shape(brief: tuple) -> dict[str, list[int]]:
    dtype, shape, _ = brief
    name = np.dtype(dtype).name if not isinstance(dtype, np.dtype) else dtype.name
    if name.startswith("str") or name.startswith("bytes"):
        name = "string"
    return {_ORT_TYPE_NAMES.get(name, name): [int(d) for d in shape]}


def nbytes(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(nbytes(item) for item in value)
    return int(getattr(value, "nbytes", 0))


class Profiler:
    """Collects a session's events; `write` turns them into ORT's JSON.

    A node's event is kept as a tuple of what it needs (its step, times, and each value's dtype,
    shape and size) and made into ORT's dict only when written: building the dict per node took
    about 9 us, which on a small model at level `disabled` (120 nodes, 0.47 ms a run) more than
    doubled every profiled run, and the service times runs from these profiles."""

    def __init__(self, file_prefix: str, provider: str) -> None:
        self.file_prefix = file_prefix
        self.provider = provider
        self.started_at = datetime.now()
        self.origin_ns = time.perf_counter_ns()
        self.pid = os.getpid()
        self._events: list[dict[str, Any] | tuple] = []

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event so far, in ORT's form, in the order recorded."""
        return [event if isinstance(event, dict) else self._node_event(*event) for event in self._events]

    def record(self, category: str, name: str, start_ns: int, end_ns: int, args: dict | None = None) -> None:
        self._events.append(self._event(category, name, threading.get_native_id(), start_ns, end_ns, args or {}))

    def _event(self, category: str, name: str, tid: int, start_ns: int, end_ns: int, args: dict) -> dict[str, Any]:
        return {
            "cat": category,
            "pid": self.pid,
            "tid": tid,
            "dur": (end_ns - start_ns) // 1000,
            "ts": (start_ns - self.origin_ns) // 1000,
            "ph": "X",
            "name": name,
            "args": args,
        }

    def record_node(self, plan: Plan, step: Step, start_ns: int, end_ns: int, args: list, results) -> None:
        inputs = tuple(
            (slot in plan.initializer_slots, _brief(value))
            for slot, value in zip(step.inputs, args, strict=True)
            if value is not None
        )
        outputs = tuple(
            _brief(value)
            for slot, value in zip(step.outputs, results, strict=False)
            if slot != SINK_SLOT and value is not None
        )
        self._events.append((step, threading.get_native_id(), start_ns, end_ns, inputs, outputs))

    def _node_event(self, step: Step, tid: int, start_ns: int, end_ns: int, inputs: tuple, outputs: tuple) -> dict:
        activation = sum(size for is_parameter, (_, _, size) in inputs if not is_parameter)
        parameter = sum(size for is_parameter, (_, _, size) in inputs if is_parameter)
        return self._event(
            "Node",
            f"{step.label}_kernel_time",
            tid,
            start_ns,
            end_ns,
            {
                "op_name": step.node.op_type,
                "provider": self.provider,
                "node_index": str(step.index),
                "activation_size": str(activation),
                "parameter_size": str(parameter),
                "output_size": str(sum(size for _, _, size in outputs)),
                "input_type_shape": [_type_shape(brief) for _, brief in inputs if brief[0] is not None],
                "output_type_shape": [_type_shape(brief) for brief in outputs if brief[0] is not None],
            },
        )

    def write(self) -> Path:
        """Write the trace beside `file_prefix` (ORT's naming: prefix, start time, .json)."""
        stamp = self.started_at.strftime("%Y-%m-%d_%H-%M-%S") + f"_{self.started_at.microsecond // 1000:03d}"
        path = Path(f"{self.file_prefix}_{stamp}.json")
        counter = 1
        while path.exists():  # two sessions started in the same millisecond
            path = Path(f"{self.file_prefix}_{stamp}_{counter}.json")
            counter += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ",\n".join(json.dumps(event) for event in self.events)
        path.write_text(f"[\n{lines}\n]\n")
        return path
