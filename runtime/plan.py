"""Execution planning, done once per graph so that running it is a plain loop over lists.

Planning turns an `ir.Graph` into:
- a node order that is topological (the graph's own order when it already is);
- one kernel instance per node, chosen for the model's opset of the node's domain;
- a slot index for every value, so a run keeps its values in a list rather than a dict;
- for every step, the slots it frees: intermediates whose last reader it is (initializers,
  graph inputs and graph outputs are never freed), so peak memory stays near ONNX Runtime's.

Missing kernels are found here, for the graph and all its subgraphs, and reported together
in one `UnsupportedModelError`: a model either runs start to finish or fails before running.

Subgraphs (If/Loop/Scan bodies) may read values of enclosing graphs by name. Planning
computes each such node's *implicit inputs* (the outer names its subgraphs read, at any
depth), reads them like ordinary inputs, and hands them to the kernel as
`run(*inputs, outer_scope={name: value})` (every node with a graph attribute is called so,
with an empty mapping when its subgraphs read nothing outside). Such a kernel is a
`SubgraphKernel`, built with `plan_subgraph`, the planner `build_plan` is handed (the executor's,
in the same scope); it passes the mapping on to the subgraphs it planned with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from runtime.backends import Backend
from runtime.errors import GraphPlanError, UnsupportedModelError, UnsupportedOp
from runtime.kernels import registry
from runtime.kernels.base import Kernel, PlanSubgraph, SubgraphKernel
from runtime.kernels.base import UnsupportedOp as KernelUnsupported
from runtime.step_memo import StepMemo, shape_steps

NONE_SLOT = 0  # always None: every omitted optional input reads it
SINK_SLOT = 1  # omitted optional outputs land here and are released by the same step


@dataclass(frozen=True)
class Scope:
    """What planning a graph needs beyond the graph: opsets, backend and test-only kernels."""

    opsets: dict[str, int]
    backend: Backend
    extra_kernels: tuple[type[Kernel], ...] = ()


@dataclass(frozen=True)
class Step:
    """One node, ready to run: its kernel and the slots it reads, writes and frees."""

    index: int
    node: ir.Node
    kernel: Kernel
    inputs: tuple[int, ...]  # declared inputs in order, then the implicit (outer-scope) ones
    outputs: tuple[int, ...]
    frees: tuple[int, ...]
    implicit_inputs: tuple[str, ...]
    # Set where the step computes from shapes and constants alone (runtime/step_memo.py).
    memo: StepMemo | None = None

    @property
    def label(self) -> str:
        """The node's name, or a stable stand-in for unnamed nodes (profiles and errors need one)."""
        return self.node.name or f"{self.node.op_type}_{self.index}"


@dataclass
class Plan:
    steps: list[Step]
    # (run, inputs, outputs, frees) per step: all the executor's hot loop touches.
    loop: list[tuple[Callable[..., Any], tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    slot_names: list[str]
    template: list[Any]  # a fresh run's slots: initializers in place, None elsewhere
    input_slots: dict[str, int]  # every graph input, initializer-backed ones included
    outer_slots: dict[str, int]  # values read from enclosing graphs
    output_names: list[str]
    output_slots: list[int]
    initializer_slots: frozenset[int]
    intermediate_slots: frozenset[int]  # values some node produces
    initializer_bytes: int

    @property
    def slot_count(self) -> int:
        return len(self.slot_names)


# --- kernel lookup ----------------------------------------------------------------------


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def find_kernel(scope: Scope, domain: str, op_type: str, opset: int) -> type[Kernel] | None:
    """The registry's choice, unless an extra (test-only) kernel claims this op at this opset."""
    domain = normalize_domain(domain)
    best = None
    for kernel in scope.extra_kernels:
        if (
            normalize_domain(kernel.domain) == domain
            and kernel.op_type == op_type
            and kernel.since_version <= opset
        ):
            if best is None or kernel.since_version > best.since_version:
                best = kernel
    return best or registry.find_kernel(domain, op_type, opset)


class _Unsupported:
    """Accumulates unsupported ops across a graph and its subgraphs, merged per (op, reason)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, int | None, str], UnsupportedOp] = {}

    def add(self, domain: str, op_type: str, opset: int | None, nodes: Iterable[str], reason: str) -> None:
        key = (normalize_domain(domain), op_type, opset, reason)
        entry = self.entries.setdefault(key, UnsupportedOp(key[0], op_type, opset, [], reason))
        entry.nodes.extend(name for name in nodes if name not in entry.nodes)

    def raise_if_any(self) -> None:
        if self.entries:
            raise UnsupportedModelError(list(self.entries.values()))


def _node_label(node: ir.Node, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def _check_kernels_exist(graph: ir.Graph, scope: Scope, unsupported: _Unsupported) -> None:
    """Record every node, in this graph and all subgraphs, whose op has no kernel."""
    for index, node in enumerate(ir.traversal.RecursiveGraphIterator(graph)):
        opset = scope.opsets.get(normalize_domain(node.domain))
        if opset is None:
            unsupported.add(node.domain, node.op_type, None, [_node_label(node, index)], "no opset imported")
        elif find_kernel(scope, node.domain, node.op_type, opset) is None:
            unsupported.add(node.domain, node.op_type, opset, [_node_label(node, index)], "no kernel")


# --- graph structure --------------------------------------------------------------------


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    graphs: list[ir.Graph] = []
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            graphs.append(attribute.as_graph())
        elif attribute.type == ir.AttributeType.GRAPHS:
            graphs.extend(attribute.as_graphs())
    return graphs


def _defined_names(graph: ir.Graph) -> set[str]:
    names = {value.name for value in graph.inputs}
    names.update(graph.initializers)
    names.update(value.name for node in graph for value in node.outputs if value.name)
    return names


def outer_names(graph: ir.Graph) -> list[str]:
    """Names `graph` (or any graph nested in it) reads but does not define, in first-read order."""
    defined = _defined_names(graph)
    found: dict[str, None] = {}
    for node in graph:
        for value in node.inputs:
            if value is not None and value.name and value.name not in defined:
                found[value.name] = None
        for name in implicit_inputs(node):
            if name not in defined:
                found[name] = None
    for value in graph.outputs:
        if value.name not in defined:
            found[value.name] = None
    return list(found)


def implicit_inputs(node: ir.Node) -> list[str]:
    """What a node's subgraphs read from enclosing scopes (ONNX Runtime's 'implicit inputs')."""
    found: dict[str, None] = {}
    for graph in subgraphs(node):
        found.update(dict.fromkeys(outer_names(graph)))
    return list(found)


def topological_nodes(graph: ir.Graph) -> list[ir.Node]:
    """The graph's nodes in an order where every value is produced before it is read."""
    nodes = list(graph)
    position = {value.name: i for i, node in enumerate(nodes) for value in node.outputs if value.name}
    in_order = all(
        position.get(name, -1) < i
        for i, node in enumerate(nodes)
        for name in [v.name for v in node.inputs if v is not None] + implicit_inputs(node)
    )
    if in_order:
        return nodes
    try:
        graph.sort()
    except ValueError as error:
        raise GraphPlanError(f"graph '{graph.name}' cannot be ordered for execution: {error}") from error
    return list(graph)


# --- the plan ---------------------------------------------------------------------------


def build_plan(graph: ir.Graph, scope: Scope, plan_subgraph: PlanSubgraph) -> Plan:
    """Everything a run needs, computed once. `plan_subgraph` plans a control-flow node's
    subgraphs in `scope`. Raises UnsupportedModelError or GraphPlanError."""
    nodes = topological_nodes(graph)
    unsupported = _Unsupported()
    _check_kernels_exist(graph, scope, unsupported)
    kernels = _build_kernels(nodes, scope, plan_subgraph, unsupported)
    unsupported.raise_if_any()

    slot_names = ["<omitted input>", "<omitted output>"]
    slots: dict[str, int] = {}

    def new_slot(name: str) -> int:
        slots[name] = len(slot_names)
        slot_names.append(name)
        return slots[name]

    input_slots = {value.name: new_slot(value.name) for value in graph.inputs}
    initializer_slots = {name: slots.get(name) or new_slot(name) for name in graph.initializers}
    outer_slots: dict[str, int] = {}
    producer_of = {value.name: i for i, node in enumerate(nodes) for value in node.outputs if value.name}

    def read_slot(name: str, reader: int) -> int:
        if name in slots:
            return slots[name]
        if name in producer_of:  # produced by this node or a later one: the order is wrong
            raise GraphPlanError(
                f"node {_node_label(nodes[reader], reader)!r} reads '{name}' before "
                f"{_node_label(nodes[producer_of[name]], producer_of[name])!r} produces it"
            )
        outer_slots[name] = new_slot(name)
        return outer_slots[name]

    step_inputs: list[tuple[int, ...]] = []
    step_outputs: list[tuple[int, ...]] = []
    step_implicit: list[tuple[str, ...]] = []
    for index, node in enumerate(nodes):
        implicit = tuple(implicit_inputs(node))
        declared = [NONE_SLOT if v is None or not v.name else read_slot(v.name, index) for v in node.inputs]
        step_inputs.append(tuple(declared + [read_slot(name, index) for name in implicit]))
        step_implicit.append(implicit)
        outputs = []
        for value in node.outputs:
            if not value.name:
                outputs.append(SINK_SLOT)
            elif value.name in slots:
                raise GraphPlanError(
                    f"node {_node_label(node, index)!r} writes '{value.name}', which is already "
                    "defined (graph input, initializer or another node's output)"
                )
            else:
                outputs.append(new_slot(value.name))
        step_outputs.append(tuple(outputs))

    output_names = [value.name for value in graph.outputs]
    output_slots = [slots[name] if name in slots else read_slot(name, len(nodes)) for name in output_names]
    intermediate = frozenset(slot for outputs in step_outputs for slot in outputs if slot != SINK_SLOT)
    frees = _release_points(step_inputs, step_outputs, intermediate, set(output_slots))

    template: list[Any] = [None] * len(slot_names)
    initializer_bytes = 0
    for name, slot in initializer_slots.items():
        tensor = graph.initializers[name].const_value
        if tensor is None:
            raise GraphPlanError(f"initializer '{name}' of graph '{graph.name}' has no data")
        array = tensor.numpy()
        initializer_bytes += array.nbytes
        template[slot] = scope.backend.from_host(array)

    # A Constant node's value is an initializer's: it is placed in the template once, as
    # onnxruntime turns Constant nodes into initializers when it loads a graph, and no step runs
    # it. TorchScript exports are full of them (107 of the BERT fixture's 335 nodes at level
    # `disabled`), each a call and, in a profiled run, an event per run that onnxruntime's
    # profile of the same model does not have.
    constant_slots: set[int] = set()
    for i, node in enumerate(nodes):
        if _is_constant(node, kernels[i]):
            (slot,) = step_outputs[i]
            if slot != SINK_SLOT:
                (template[slot],) = kernels[i].run()
                constant_slots.add(slot)
    intermediate = intermediate - constant_slots
    frees = [tuple(slot for slot in released if slot not in constant_slots) for released in frees]
    # Values every run sees unchanged: weights no feed can replace, and Constant nodes' values.
    fixed = constant_slots | {slot for name, slot in initializer_slots.items() if name not in input_slots}
    for i, node in enumerate(nodes):
        if kernels[i] is not None and not _is_constant(node, kernels[i]):
            kernels[i].bind_constants(tuple(template[slot] if slot in fixed else None for slot in step_inputs[i]))

    steps = [
        Step(i, node, kernels[i], step_inputs[i], step_outputs[i], frees[i], step_implicit[i])
        for i, node in enumerate(nodes)
        if not _is_constant(node, kernels[i])
    ]
    if scope.backend.xp is np:  # kept results are read-only numpy arrays (runtime/step_memo.py)
        steps = _with_shape_memos(steps, fixed | {NONE_SLOT})
    loop = [(step.memo.run if step.memo else _bound_run(step), step.inputs, step.outputs, step.frees) for step in steps]
    return Plan(
        steps=steps,
        loop=loop,
        slot_names=slot_names,
        template=template,
        input_slots=input_slots,
        outer_slots=outer_slots,
        output_names=output_names,
        output_slots=output_slots,
        initializer_slots=frozenset(initializer_slots.values()) | frozenset(constant_slots),
        intermediate_slots=intermediate,
        initializer_bytes=initializer_bytes,
    )


def _with_shape_memos(steps: list[Step], fixed: set[int]) -> list[Step]:
    """The steps, those that compute from shapes and constants alone given a `StepMemo`."""
    ops = [(step.node.op_type, normalize_domain(step.node.domain) == "" and not subgraphs(step.node)) for step in steps]
    marked = shape_steps(ops, [step.inputs for step in steps], [step.outputs for step in steps], fixed)
    return [
        replace(
            step, memo=StepMemo(step.kernel.run, tuple(p for p, slot in enumerate(step.inputs) if slot not in fixed))
        )
        if memo
        else step
        for step, memo in zip(steps, marked, strict=True)
    ]


def _is_constant(node: ir.Node, kernel: Kernel | None) -> bool:
    """An ONNX Constant node (its value fixed by its attributes), run by our own kernel."""
    return node.op_type == "Constant" and normalize_domain(node.domain) == "" and type(kernel).__name__ == "Constant"


def _build_kernels(
    nodes: Sequence[ir.Node], scope: Scope, plan_subgraph: PlanSubgraph, unsupported: _Unsupported
) -> list[Kernel | None]:
    """One kernel per node; attribute combinations a kernel rejects are collected, not raised."""
    kernels: list[Kernel | None] = []
    for index, node in enumerate(nodes):
        opset = scope.opsets.get(normalize_domain(node.domain))
        kernel_class = None if opset is None else find_kernel(scope, node.domain, node.op_type, opset)
        if kernel_class is None:  # already recorded by _check_kernels_exist
            kernels.append(None)
            continue
        label = _node_label(node, index)
        try:
            if issubclass(kernel_class, SubgraphKernel):
                kernels.append(kernel_class(node, opset, scope.backend, plan_subgraph=plan_subgraph))
            else:
                kernels.append(kernel_class(node, opset, scope.backend))
        except KernelUnsupported as error:
            unsupported.add(node.domain, node.op_type, opset, [label], str(error))
            kernels.append(None)
        except UnsupportedModelError as error:  # from a subgraph the kernel planned
            for entry in error.unsupported:
                unsupported.add(entry.domain, entry.op_type, entry.opset, entry.nodes, entry.reason)
            kernels.append(None)
        except (ValueError, TypeError, IndexError, RuntimeError, ArithmeticError) as error:
            # Attributes or constant inputs that contradict each other (an invalid model): the node
            # is named, the session is not created.
            raise GraphPlanError(f"{label} cannot be prepared: {type(error).__name__}: {error}") from error
        except Exception as error:
            raise GraphPlanError(
                f"building kernel {kernel_class.__name__} for node {label!r} ({node.op_type}) failed: "
                f"{type(error).__name__}: {error}"
            ) from error
    return kernels


def _release_points(
    step_inputs: list[tuple[int, ...]],
    step_outputs: list[tuple[int, ...]],
    intermediate: frozenset[int],
    kept: set[int],
) -> list[tuple[int, ...]]:
    """For each step, the intermediates to drop after it: those it is the last to touch."""
    last_touch: dict[int, int] = {}
    for index, (inputs, outputs) in enumerate(zip(step_inputs, step_outputs, strict=True)):
        for slot in (*outputs, *inputs):
            last_touch[slot] = index
    frees: list[list[int]] = [[] for _ in step_inputs]
    for slot, index in last_touch.items():
        if slot in intermediate and slot not in kept:
            frees[index].append(slot)
    for index, outputs in enumerate(step_outputs):
        if SINK_SLOT in outputs:
            frees[index].append(SINK_SLOT)
    return [tuple(sorted(slots)) for slots in frees]


def _bound_run(step: Step) -> Callable[..., Any]:
    """The callable the loop invokes: `kernel.run`, or an adapter passing outer-scope values."""
    if not subgraphs(step.node):
        return step.kernel.run
    run = step.kernel.run
    declared = len(step.inputs) - len(step.implicit_inputs)
    names = step.implicit_inputs

    def run_with_outer_scope(*values: Any) -> tuple[Any, ...]:
        return run(*values[:declared], outer_scope=dict(zip(names, values[declared:], strict=True)))

    return run_with_outer_scope
