"""Running a planned graph: a plain loop over precomputed steps.

    executor = GraphExecutor(model.graph, opsets={"": 17})
    outputs = executor.run({"x": x})  # a list, in graph-output order

Everything that can be decided before a run is decided in runtime/plan.py: node order,
kernel instances, value slots, release points. A run copies the plan's slot template,
places the feeds, and loops: gather the step's input slots, call the pre-bound kernel,
store its outputs, drop the values nothing reads any more.

Subgraphs, for control-flow kernels (If, Loop, Scan): the plan builds such a kernel with a
planner for its subgraphs, an executor in the same scope (opsets, backend, extra kernels), so
kernels never import this module (runtime/kernels/base.py, `SubgraphKernel`):

    class If(SubgraphKernel):
        def __init__(self, node, opset, backend=numpy_backend, *, plan_subgraph):
            super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
            self.then_branch = self.subgraph("then_branch")
            self.else_branch = self.subgraph("else_branch")

        def run(self, cond, *, outer_scope):
            branch = self.then_branch if bool(cond) else self.else_branch
            return tuple(branch.run({}, outer_scope))

- A node with a graph attribute has its kernel called as `run(*inputs, outer_scope=mapping)`;
  `mapping` holds, by name, every value its subgraphs (at any depth) read from enclosing
  graphs. Pass it on unchanged to the subgraph's `run`.
- Subgraphs are planned in the kernel's `__init__`, at session creation, so a missing op
  inside a body fails there, not mid-run.
- `run(feeds, outer_scope)` takes feeds by the subgraph's input names (`input_names`, in
  order, e.g. Loop's iteration number, condition and carried values) and returns outputs in
  `output_names` order. Subgraph feeds are not type-checked: bodies often leave them untyped.
- An executor is safe to call re-entrantly and from several threads: each run has its own
  slot list. Kernels must keep `run` free of per-call state for the same reason.

Speed: most runs go through the plan written out as one function (runtime/plan_function.py:
a line per step, intermediates in local variables). The first run for each distinct set of
feed shapes, and every run while profiling, goes through `run_measured` instead, the plain
loop over the plan, which also checks each kernel's output contract, measures the peak bytes
of live intermediates, and times nodes for the profiler; so the common path pays for none of
that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import onnx_ir as ir

from runtime.backends import Backend, numpy_backend
from runtime.errors import GraphPlanError, InvalidFeedError, NodeExecutionError, domain_label
from runtime.kernels.base import Kernel
from runtime.plan import SINK_SLOT, Plan, Scope, Step, build_plan, normalize_domain
from runtime.plan_function import PlanFunction
from runtime.profiler import ACTIVE_PROFILER, Profiler

# Peak bytes are measured once per distinct feed shapes; a Loop whose carried tensors grow
# every iteration would otherwise measure every run and keep every signature.
MAX_MEASURED_SHAPES = 64


class GraphExecutor:
    """Plans `graph` once and runs it on feeds by name; see the module docstring."""

    def __init__(
        self,
        graph: ir.Graph,
        opsets: Mapping[str, int],
        backend: Backend | None = None,
        extra_kernels: Sequence[type[Kernel]] | None = None,
    ) -> None:
        opsets = {normalize_domain(domain): version for domain, version in opsets.items()}
        self._start(graph, Scope(opsets, backend or numpy_backend, tuple(extra_kernels or ())))

    @classmethod
    def in_scope(cls, scope: Scope, graph: ir.Graph) -> GraphExecutor:
        """An executor for a subgraph, planned in its enclosing graph's scope."""
        executor = cls.__new__(cls)
        executor._start(graph, scope)
        return executor

    def _start(self, graph: ir.Graph, scope: Scope) -> None:
        self.scope = scope
        self.graph = graph
        self.plan: Plan = build_plan(graph, scope, partial(GraphExecutor.in_scope, scope))
        plan = self.plan
        self._function = PlanFunction(
            plan.steps, [run for run, *_ in plan.loop], plan.intermediate_slots, plan.output_slots
        )
        self.peak_bytes = 0
        self._measured_shapes: set[tuple] = set()

    @property
    def input_names(self) -> list[str]:
        return list(self.plan.input_slots)

    @property
    def output_names(self) -> list[str]:
        return list(self.plan.output_names)

    @property
    def outer_scope_names(self) -> list[str]:
        """Values this graph reads from enclosing graphs; `run` needs each in `outer_scope`."""
        return list(self.plan.outer_slots)

    def run(self, feeds: Mapping[str, Any], outer_scope: Mapping[str, Any] | None = None) -> list[Any]:
        plan = self.plan
        unknown = [name for name in feeds if name not in plan.input_slots]
        if unknown:
            raise InvalidFeedError(
                f"graph '{self.graph.name}': unknown input(s) {unknown}; its inputs are {self.input_names}"
            )
        values = self.new_frame()
        for name, slot in plan.input_slots.items():
            if name in feeds:
                values[slot] = feeds[name]
            elif slot not in plan.initializer_slots:
                raise InvalidFeedError(
                    f"graph '{self.graph.name}': missing input '{name}'; its inputs are {self.input_names}"
                )
        if plan.outer_slots:
            outer_scope = outer_scope or {}
            for name, slot in plan.outer_slots.items():
                if name not in outer_scope:
                    raise GraphPlanError(
                        f"graph '{self.graph.name}' reads '{name}' from its enclosing scope, but outer_scope "
                        f"has no such value (it has {sorted(outer_scope)})"
                    )
                values[slot] = outer_scope[name]
        self.run_frame(values, tuple(getattr(feeds[name], "shape", None) for name in feeds))
        return [values[slot] for slot in plan.output_slots]

    def new_frame(self) -> list[Any]:
        """A run's slot list: initializers in place, everything else still None."""
        return self.plan.template.copy()

    def run_frame(self, values: list[Any], shapes: tuple) -> None:
        """Execute every step on a filled frame; `shapes` identifies the feeds' shapes."""
        profiler = ACTIVE_PROFILER.get()
        measured = self._measured_shapes
        first_run = shapes not in measured and len(measured) < MAX_MEASURED_SHAPES
        if profiler is None and not first_run:
            try:
                self._function.run(values)
            except Exception as error:
                failed = self._function.failed_step(error.__traceback__)
                if failed is None:
                    raise
                index, local_values = failed
                step = self.plan.steps[index]
                args = [local_values.get(f"x{slot}", values[slot]) for slot in step.inputs]
                raise _node_failure(step, args, error) from error
            return
        peak = run_measured(self.plan, values, profiler, self.scope.backend, first_run)
        if first_run:
            self.peak_bytes = max(self.peak_bytes, peak)
            measured.add(shapes)

    def run_frame_watching(self, values: list[Any], watched: Mapping[int, str], sink: Callable[[str, Any], None]) -> None:
        """Execute every step on a filled frame, handing `sink(name, value)` each watched slot's value
        as its node produces it. The plan's frees go on unchanged, so a caller that looks at every
        intermediate keeps only what its sink keeps. Not profiled, not measured."""
        _run_watching(self.plan, values, watched, sink)


def _run_watching(plan: Plan, values: list[Any], watched: Mapping[int, str], sink: Callable[[str, Any], None]) -> None:
    for step, (run, inputs, outputs, frees) in zip(plan.steps, plan.loop, strict=True):
        args = [values[i] for i in inputs]
        try:
            results = run(*args)
        except Exception as error:
            raise _node_failure(step, args, error) from error
        for slot, value in zip(outputs, results, strict=False):  # a kernel may return optional outputs its node does not name
            values[slot] = value
            if slot in watched:
                sink(watched[slot], value)
        for slot in frees:
            values[slot] = None


def run_measured(
    plan: Plan, values: list[Any], profiler: Profiler | None, backend: Backend, first_run: bool = True
) -> int:
    """The plain loop over the plan plus, on a feed shape's `first_run`, contract checks and peak
    live bytes, and when profiling, node events; the peak (0 but on a first run). When profiling, each node
    waits for its device work, so a GPU node's time is its own. The checks and the peak are a
    first run's only, as without profiling: walking every live value after every node cost a
    profiled run of a small model as much as its kernels (0.43 ms of 0.47 on 120 nodes)."""
    clock = time.perf_counter_ns
    synchronize = backend.synchronize if profiler is not None else None
    # Buffers that exist before the run (weights, feeds) are not the run's allocations, even
    # when an intermediate is a view of one (Reshape of a weight).
    preexisting = {
        id(root)
        for slot, value in enumerate(values)
        if value is not None and slot not in plan.intermediate_slots
        for root in _root_buffers(value)
    } if first_run else set()  # fmt: skip
    live: dict[int, Any] = {}
    peak = 0
    for step, (run, inputs, outputs, frees) in zip(plan.steps, plan.loop, strict=True):
        args = [values[i] for i in inputs]
        try:
            start = clock()
            results = run(*args)
            if synchronize is not None:
                synchronize()
            end = clock()
        except Exception as error:
            raise _node_failure(step, args, error) from error
        if first_run:
            _check_results(step, results)
        for slot, value in zip(outputs, results, strict=False):
            values[slot] = value
            if first_run and slot != SINK_SLOT:
                live[slot] = value
        if profiler is not None:
            profiler.record_node(plan, step, start, end, args, results)
        if first_run:
            peak = max(peak, _live_bytes(live.values(), preexisting))
        for slot in frees:
            values[slot] = None
            live.pop(slot, None)
    return peak


def _root_buffers(value: Any) -> Iterable[Any]:
    """The arrays that own the memory behind `value` (a view's base chain ends at its owner)."""
    if isinstance(value, list | tuple):  # sequence values
        for item in value:
            yield from _root_buffers(item)
        return
    root = value
    while getattr(root, "base", None) is not None and hasattr(root.base, "nbytes"):
        root = root.base
    yield root


def _live_bytes(live: Iterable[Any], preexisting: set[int]) -> int:
    seen: set[int] = set()
    total = 0
    for value in live:
        for root in _root_buffers(value):
            key = id(root)
            if key not in seen and key not in preexisting:
                seen.add(key)
                total += int(getattr(root, "nbytes", 0))
    return total


def _check_results(step: Step, results: Any) -> None:
    """A kernel returns a tuple with a value for every output its node names."""
    kernel = type(step.kernel).__name__
    if not isinstance(results, tuple | list):
        raise NodeExecutionError(
            f"kernel {kernel} for node {step.label!r} returned {type(results).__name__}, not a tuple of outputs"
        )
    if len(results) < len(step.outputs):
        raise NodeExecutionError(
            f"kernel {kernel} for node {step.label!r} returned {len(results)} output(s); "
            f"the node has {len(step.outputs)}"
        )
    for position, (slot, value) in enumerate(zip(step.outputs, results, strict=False)):
        # None is an empty optional, which only an output typed optional(...) may hold. An
        # untyped output (subgraph intermediates usually are: nothing infers types at
        # level "disabled") may be one too: an Optional node's, or a Loop's carrying one.
        output_type = step.node.outputs[position].type
        optional = output_type is None or isinstance(output_type, ir.OptionalType)
        if value is None and slot != SINK_SLOT and not optional:
            raise NodeExecutionError(
                f"kernel {kernel} for node {step.label!r} returned None for output {position} "
                f"'{step.node.outputs[position].name}'"
            )


def _describe_value(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list | tuple):
        return f"sequence of {len(value)}"
    dtype = getattr(value, "dtype", type(value).__name__)
    return f"{dtype}{list(getattr(value, 'shape', ()))}"


def _node_failure(step: Step, args: list[Any], error: Exception) -> NodeExecutionError:
    node = step.node
    op = f"{domain_label(node.domain)}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    inputs = ", ".join(_describe_value(value) for value in args)
    return NodeExecutionError(
        f"node {step.label!r} ({op}, kernel {type(step.kernel).__name__}) failed on inputs ({inputs}): "
        f"{type(error).__name__}: {error}"
    )
