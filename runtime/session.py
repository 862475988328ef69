"""InferenceSession: load, optimize, plan once; then run feeds. Shaped like onnxruntime's.

    from runtime import InferenceSession, SessionOptions
    session = InferenceSession("model.onnx", SessionOptions(graph_optimization_level="extended"))
    [logits] = session.run(None, {"input_ids": ids})
    session.optimize_result.report.fusions   # what our optimizer fused
    session.peak_bytes                       # largest live intermediates seen in a run
    session.kernel_choices                   # each kernel family's library, measured here, and why
    session.gemm_backend                     # "mkl-packed", "onednn" or "numpy": constant-weight products

On a GPU, as with onnxruntime (CuPy; runtime/providers.py says how the list is read):

    session = InferenceSession(path, options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    session.get_providers()                  # ["FusionwatchCUDA"], or ["FusionwatchCPU"] after a fallback

Creation does all the work that can fail on the model (loading, optimizing, finding a
kernel for every node in every subgraph), so `run` fails only on feeds or in a kernel.
Feeds are checked as ONNX Runtime checks them: exact dtype, rank, and fixed dimensions;
nothing is cast. A model given as an `ir.Model` is cloned (weights shared) before the
optimizer rewrites it, so one model can seed sessions at several levels.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from optimizer import OptimizeResult, load_model, optimize
from runtime.backends import Backend, numpy_backend
from runtime.errors import GraphPlanError, InvalidFeedError, InvalidOutputNameError
from runtime.executor import GraphExecutor
from runtime.kernel_choice import KernelChoices
from runtime.kernel_choice import choose as choose_kernels
from runtime.kernels.base import Kernel
from runtime.kernels.libraries import Using
from runtime.memory import keep_freed_memory
from runtime.options import SessionOptions
from runtime.plan import Plan, normalize_domain
from runtime.profiler import ACTIVE_PROFILER, Profiler, provider_name
from runtime.providers import backend_for
from runtime.threads import limit_blas_threads


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime's NodeArg describes it."""

    name: str
    shape: list[int | str | None] | None
    type: str  # "tensor(float)", "seq(tensor(int64))"


@dataclass(frozen=True)
class MemoryStats:
    peak_bytes: int  # most bytes of intermediates alive at once, over the runs measured
    initializer_bytes: int
    intermediate_values: int  # values some node produces
    released_early: int  # of those, how many the plan frees before the run ends
    steps: int


@dataclass(frozen=True)
class _InputSpec:
    name: str
    slot: int
    dtype: np.dtype | None  # of the (innermost) tensor; None: the model does not say
    type: str
    shape: list[int | str | None] | None  # onnx-ir keeps the innermost tensor's shape here
    ir_type: ir.TypeProtocol | None = None  # sequence and optional feeds are checked by structure
    # "optional", "sequence" or "tensor": ir_type's kind, found once. isinstance against onnx-ir's
    # types goes through typing.Protocol's check, ~4 µs a call, twice a feed on every run.
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            kind = (
                "optional" if isinstance(self.ir_type, ir.OptionalType)
                else "sequence" if isinstance(self.ir_type, ir.SequenceType)
                else "tensor"
            )  # fmt: skip
            object.__setattr__(self, "kind", kind)


def type_string(type_: ir.TypeProtocol | None) -> str:
    if type_ is None:
        return "unknown"
    if isinstance(type_, ir.TensorType):
        return f"tensor({_element_name(type_.dtype)})"
    if isinstance(type_, ir.SequenceType):
        return f"seq({type_string(type_.elem_type)})"
    if isinstance(type_, ir.OptionalType):
        return f"optional({type_string(type_.elem_type)})"
    return str(type_)


def _element_name(dtype: ir.DataType) -> str:
    """ONNX Runtime's names: float, double, int64, bool, float16, string, ..."""
    return {ir.DataType.FLOAT: "float", ir.DataType.DOUBLE: "double"}.get(dtype, dtype.name.lower())


def _dims(shape: ir.Shape | None) -> list[int | str | None] | None:
    if shape is None:
        return None
    return [dim if isinstance(dim, int) else dim.value for dim in shape]


def _node_arg(value: ir.Value) -> NodeArg:
    return NodeArg(value.name, _dims(value.shape), type_string(value.type))


class InferenceSession:
    def __init__(
        self,
        path_or_model: str | os.PathLike | bytes | onnx.ModelProto | ir.Model,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        *,
        backend: Backend | None = None,
        extra_kernels: Sequence[type[Kernel]] = (),
    ) -> None:
        """`providers` picks the backend as onnxruntime's list does (default: CPU); `backend`
        passes one directly, not both. `extra_kernels` take precedence over registered ones for
        their (domain, op); for tests."""
        self.options = options = sess_options or SessionOptions()
        options.validate()
        if providers is not None and backend is not None:
            raise ValueError("pass providers= or backend=, not both")
        if backend is None:
            backend = numpy_backend if providers is None else backend_for(providers)
        self.backend = backend
        self._provider = provider_name(backend.name)
        self._profiler = (
            Profiler(options.profile_file_prefix, self._provider) if options.enable_profiling else None
        )
        limit_blas_threads(options.intra_op_num_threads)
        if options.enable_cpu_mem_arena:
            keep_freed_memory()

        started = time.perf_counter_ns()
        model, loading_event = _load(path_or_model, options.external_data_dir)
        loaded = time.perf_counter_ns()
        self.optimize_result: OptimizeResult = optimize(
            model,
            level=options.level,
            disabled=list(options.disabled_optimizers),
            enable_gelu_approximation=options.enable_gelu_approximation,
            output=options.optimized_model_filepath,
        )
        self.model = model
        chosen = time.perf_counter_ns()
        # Kernels prepare their weights for the chosen libraries as they are built, so this comes first.
        self.kernel_choices: KernelChoices = choose_kernels(
            model,
            options.intra_op_num_threads,
            options.kernel_libraries,
            backend_name="cpu" if backend.xp is np else backend.name,
        )
        self._libraries = self.kernel_choices.libraries()
        self._using_libraries = Using(self._libraries)
        # What products against constant weights run on: "mkl-packed", "onednn", "numpy", or a GPU backend's name.
        self.gemm_backend = self.kernel_choices.gemm.library
        chose = time.perf_counter_ns()
        with self._using_libraries():
            self._executor = GraphExecutor(
                model.graph, opsets=_opsets(model), backend=backend, extra_kernels=extra_kernels
            )
        plan = self._executor.plan
        if plan.outer_slots:
            raise GraphPlanError(
                f"graph '{model.graph.name}' reads {sorted(plan.outer_slots)}, which no node, graph input "
                "or initializer defines"
            )
        self._inputs = [
            _InputSpec(
                value.name,
                plan.input_slots[value.name],
                value.dtype.numpy()
                if value.dtype is not None and value.dtype != ir.DataType.STRING
                else None,
                type_string(value.type),
                _dims(value.shape),
                value.type,
            )
            for value in model.graph.inputs
            if value.name not in model.graph.initializers
        ]
        self._overridable = {
            value.name: plan.input_slots[value.name]
            for value in model.graph.inputs
            if value.name in model.graph.initializers
        }
        self._feedable = frozenset(plan.input_slots)
        self._input_args = [
            _node_arg(value) for value in model.graph.inputs if value.name not in self._overridable
        ]
        self._output_args = [_node_arg(value) for value in model.graph.outputs]
        self._fetch_cache: dict[tuple[str, ...], list[int]] = {}
        if self._profiler is not None:
            self._profiler.record("Session", loading_event, started, loaded)
            # onnxruntime leaves these args empty; ours say which library each kernel family
            # runs on and why, and how long measuring took (within session_initialization).
            choice_args = {"kernel_choices": self.kernel_choices.as_dict(), "kernel_choice_us": (chose - chosen) // 1000}
            self._profiler.record("Session", "session_initialization", loaded, time.perf_counter_ns(), choice_args)

    # --- onnxruntime's API ----------------------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        return list(self._input_args)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._output_args)

    def get_providers(self) -> list[str]:
        return [self._provider]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Outputs named by `output_names` (all, in graph order, for None) as host numpy arrays."""
        profiler = self._profiler
        run_started = time.perf_counter_ns() if profiler is not None else 0
        fetch = self._fetch_slots(output_names)
        values = self._executor.new_frame()
        shapes = self._place_feeds(input_feed, values)
        with self._using_libraries():
            if profiler is None:
                self._executor.run_frame(values, shapes)
            else:
                token = ACTIVE_PROFILER.set(profiler)
                try:
                    execute_started = time.perf_counter_ns()
                    self._executor.run_frame(values, shapes)
                    self.backend.synchronize()
                    profiler.record(
                        "Session", "SequentialExecutor::Execute", execute_started, time.perf_counter_ns()
                    )
                finally:
                    ACTIVE_PROFILER.reset(token)
        intermediate = self._executor.plan.intermediate_slots
        outputs = [self._to_host(values[slot], copy=slot not in intermediate) for slot in fetch]
        if profiler is not None:
            profiler.record("Session", "model_run", run_started, time.perf_counter_ns())
        return outputs

    def run_watching(
        self, names: Sequence[str], input_feed: Mapping[str, Any], sink: Callable[[str, np.ndarray], None]
    ) -> None:
        """Run the feeds and hand `sink(name, array)` every value of the graph named in `names`
        (intermediates included) as its node produces it, as a host array the caller owns; values
        that exist before the run (feeds, weights, Constant nodes' outputs) are handed over first.

        What onnxruntime needs a model with extra graph outputs for (Polygraphy's "mark all"),
        without keeping anything alive past its last reader: a caller comparing every
        intermediate holds only what its sink keeps. Names the graph does not have are an
        InvalidOutputNameError; a value no node produced in this run (an optional output left
        empty) is not handed over.
        """
        plan = self._executor.plan
        wanted = set(names)
        slots = {name: slot for slot, name in enumerate(plan.slot_names)}
        unknown = sorted(wanted - slots.keys())
        if unknown:
            raise InvalidOutputNameError(f"graph '{self.model.graph.name}' has no value named {unknown[:5]}")
        watched = {slots[name]: name for name in wanted}
        values = self._executor.new_frame()
        self._place_feeds(input_feed, values)

        def to_host(name: str, value: Any) -> None:
            if value is not None and not isinstance(value, list | tuple):
                # Copied: a later kernel may reuse the buffer once the plan frees it.
                sink(name, np.array(self.backend.to_host(value), copy=True))

        # Values there before the run (feeds, weights, Constant nodes' outputs) first.
        for slot, name in watched.items():
            if slot not in plan.intermediate_slots:
                to_host(name, values[slot])
        with self._using_libraries():
            self._executor.run_frame_watching(values, watched, to_host)

    def end_profiling(self) -> str:
        """Write the profile and stop profiling; the file's path, or "" when profiling was off."""
        if self._profiler is None:
            return ""
        path = self._profiler.write()
        self._profiler = None
        return str(path)

    # --- ours -----------------------------------------------------------------------------

    @property
    def peak_bytes(self) -> int:
        return self._executor.peak_bytes

    def memory_stats(self) -> MemoryStats:
        plan = self._executor.plan
        released = sum(1 for step in plan.steps for slot in step.frees if slot in plan.intermediate_slots)
        return MemoryStats(
            peak_bytes=self._executor.peak_bytes,
            initializer_bytes=plan.initializer_bytes,
            intermediate_values=len(plan.intermediate_slots),
            released_early=released,
            steps=len(plan.steps),
        )

    @property
    def plan(self) -> Plan:
        """The execution plan (steps, slots, release points), for tests and the bench tooling."""
        return self._executor.plan

    # --- feeds and fetches ----------------------------------------------------------------

    def _fetch_slots(self, output_names: Sequence[str] | None) -> list[int]:
        plan = self._executor.plan
        if output_names is None:
            return plan.output_slots
        key = tuple(output_names)
        slots = self._fetch_cache.get(key)
        if slots is None:
            by_name = dict(zip(plan.output_names, plan.output_slots, strict=True))
            unknown = [name for name in key if name not in by_name]
            if unknown:
                raise InvalidOutputNameError(
                    f"unknown output name(s) {unknown}; the model's outputs are {plan.output_names}"
                )
            slots = self._fetch_cache[key] = [by_name[name] for name in key]
        return slots

    def _place_feeds(self, feeds: Mapping[str, Any], values: list[Any]) -> tuple:
        """Check every feed against its input and put it in its slot; returns the feed shapes."""
        unknown = [name for name in feeds if name not in self._feedable]
        if unknown:
            raise InvalidFeedError(
                f"unknown input name(s) {unknown}; the model's inputs are {sorted(self._feedable)}"
            )
        shapes = []
        for spec in self._inputs:
            if spec.name not in feeds:
                missing = [s.name for s in self._inputs if s.name not in feeds]
                raise InvalidFeedError(
                    f"missing input(s) {missing}; the model's inputs are {[s.name for s in self._inputs]}, "
                    f"the feed has {list(feeds)}"
                )
            value = _check_feed(spec, feeds[spec.name])
            values[spec.slot] = self._from_host(value)
            shapes.append(_shape_key(value))
        for name, slot in self._overridable.items():
            if name in feeds:
                values[slot] = self.backend.from_host(np.asarray(feeds[name]))
                shapes.append((name, values[slot].shape))
        return tuple(shapes)

    def _from_host(self, value: Any) -> Any:
        """A checked feed on the backend: arrays moved, sequences item by item, None kept."""
        if isinstance(value, list):
            return [self._from_host(item) for item in value]
        return self.backend.from_host(value) if isinstance(value, np.ndarray) else value

    def _to_host(self, value: Any, copy: bool) -> Any:
        """A numpy array the caller owns and may write into: outputs that are weights or feeds
        come back as copies. A sequence output comes back as a list of arrays; an empty optional
        as None."""
        if value is None:
            return None
        if isinstance(value, list | tuple):
            return [self._to_host(item, copy) for item in value]
        if isinstance(value, np.generic):  # a kernel returned a numpy scalar
            return np.asarray(value)
        array = self.backend.to_host(value)
        # Weights and feeds are copied, and so are read-only results (a kernel's kept Shape
        # array, Expand's broadcast view), so that the caller may write into what it gets.
        return array.copy() if copy and array is value or not array.flags.writeable else array


def _check_feed(spec: _InputSpec, value: Any) -> Any:
    """The feed as the run takes it, or InvalidFeedError. Sequence feeds are lists checked item
    by item; an optional feed may be None (empty) or a value of its element type."""
    if spec.kind == "optional":
        if value is None:
            return None
        return _check_feed(replace(spec, ir_type=spec.ir_type.elem_type, kind=""), value)
    if spec.kind == "sequence":
        if not isinstance(value, list | tuple):
            raise InvalidFeedError(
                f"input '{spec.name}': expected {spec.type} as a list of arrays, got {type(value).__name__}"
            )
        item_spec = replace(spec, ir_type=spec.ir_type.elem_type, kind="")
        return [_check_feed(item_spec, item) for item in value]
    if value is None:
        raise InvalidFeedError(f"input '{spec.name}': expected {spec.type}, got None")
    array = value if hasattr(value, "dtype") and hasattr(value, "shape") else np.asarray(value)
    if spec.dtype is not None and array.dtype != spec.dtype:
        got = (
            f"tensor({_element_name(ir.DataType.from_numpy(array.dtype))})"
            if _is_onnx_dtype(array.dtype)
            else str(array.dtype)
        )
        raise InvalidFeedError(f"input '{spec.name}': expected {spec.type}, got {got}")
    if spec.shape is not None:
        if array.ndim != len(spec.shape):
            raise InvalidFeedError(
                f"input '{spec.name}': expected rank {len(spec.shape)} (shape {spec.shape}), "
                f"got rank {array.ndim} (shape {list(array.shape)})"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, array.shape, strict=True)):
            if isinstance(want, int) and want != got:
                raise InvalidFeedError(
                    f"input '{spec.name}': dimension {axis} is {got}, expected {want} "
                    f"(shape {spec.shape}, got {list(array.shape)})"
                )
    return array


def _opsets(model: ir.Model) -> dict[str, int]:
    """The model's opset imports (ONNX's own domain under either of its names, "" or "ai.onnx"), and
    onnxruntime's own domain at version 1 where the model uses it without importing it (hand-made
    graphs do): onnxruntime reads every domain it knows so."""
    return {"com.microsoft": 1} | {normalize_domain(domain): version for domain, version in model.opset_imports.items()}


def _shape_key(value: Any) -> Any:
    """What identifies a feed's shape for peak-memory measurement (sequences by their items)."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(_shape_key(item) for item in value)
    return value.shape


def _is_onnx_dtype(dtype: np.dtype) -> bool:
    try:
        ir.DataType.from_numpy(dtype)
    except (TypeError, ValueError):
        return False
    return True


def _load(source: Any, external_data_dir: str | os.PathLike | None) -> tuple[ir.Model, str]:
    """The model to optimize (never the caller's own object) and ORT's name for the load event.

    Every form goes through the optimizer's checked loader: a path's external data must stay in
    its directory, and bytes or a ModelProto may use external data only from `external_data_dir`.
    """
    if isinstance(source, ir.Model):
        return load_model(source).clone(), "model_loading_array"
    if isinstance(source, bytes | onnx.ModelProto):
        return load_model(source, base_dir=external_data_dir), "model_loading_array"
    if isinstance(source, str | os.PathLike):
        return load_model(Path(source)), "model_loading_uri"
    raise TypeError(
        f"InferenceSession takes a path, bytes, onnx.ModelProto or ir.Model, not {type(source).__name__}"
    )
