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


def type_shape(value: Any) -> dict[str, list[int]] | None:
    """`{"float": [1, 16, 64]}` for a tensor; None for anything ORT would not list (sequences)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return None
    name = np.dtype(dtype).name if not isinstance(dtype, np.dtype) else dtype.name
    if name.startswith("str") or name.startswith("bytes"):
        name = "string"
    return {_ORT_TYPE_NAMES.get(name, name): [int(d) for d in value.shape]}


def nbytes(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(nbytes(item) for item in value)
    return int(getattr(value, "nbytes", 0))


class Profiler:
    def __init__(self, file_prefix: str, provider: str) -> None:
        self.file_prefix = file_prefix
        self.provider = provider
        self.started_at = datetime.now()
        self.origin_ns = time.perf_counter_ns()
        self.pid = os.getpid()
        self.events: list[dict[str, Any]] = []

    def record(self, category: str, name: str, start_ns: int, end_ns: int, args: dict | None = None) -> None:
        self.events.append(
            {
                "cat": category,
                "pid": self.pid,
                "tid": threading.get_native_id(),
                "dur": (end_ns - start_ns) // 1000,
                "ts": (start_ns - self.origin_ns) // 1000,
                "ph": "X",
                "name": name,
                "args": args or {},
            }
        )

    def record_node(self, plan: Plan, step: Step, start_ns: int, end_ns: int, args: list, results) -> None:
        activation = parameter = 0
        input_shapes = []
        for slot, value in zip(step.inputs, args, strict=True):
            if value is None:
                continue
            if slot in plan.initializer_slots:
                parameter += nbytes(value)
            else:
                activation += nbytes(value)
            shape = type_shape(value)
            if shape is not None:
                input_shapes.append(shape)
        outputs = [
            value
            for slot, value in zip(step.outputs, results, strict=False)
            if slot != SINK_SLOT and value is not None
        ]
        output_shapes = [shape for shape in map(type_shape, outputs) if shape is not None]
        self.record(
            "Node",
            f"{step.label}_kernel_time",
            start_ns,
            end_ns,
            {
                "op_name": step.node.op_type,
                "provider": self.provider,
                "node_index": str(step.index),
                "activation_size": str(activation),
                "parameter_size": str(parameter),
                "output_size": str(sum(nbytes(value) for value in outputs)),
                "input_type_shape": input_shapes,
                "output_type_shape": output_shapes,
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
