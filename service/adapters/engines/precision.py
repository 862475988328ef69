"""The narrowest floating type each tensor's value passed through, which sets its tolerance
(service/domain/tolerances.py).

A float32 tensor computed from float16 ones (the float32 variance of a float16 Llama's RMSNorm, logits
cast up at the end of a float16 model) is only as exact as its float16 inputs: the ulp by which two
engines' float16 tensors differ is still in it, so it is compared at float16's tolerance, not float32's.

Walked over the unfused graph in order: a node's outputs get the narrowest of its inputs' entries, the
types its inputs and outputs declare, a Cast's target and, for a node with subgraphs (If, Loop, Scan),
everything its subgraphs read or declare. Integer and boolean outputs get no entry and pass nothing on:
a Shape or an ArgMax is exact whatever the precision it was taken from, and is compared exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from service.domain.tolerances import Tolerance, Tolerances, is_float, narrowest


@dataclass(frozen=True)
class TensorTolerances:
    """A project's tolerances and, per tensor name, the narrowest type its value passed through."""

    tolerances: Tolerances
    narrowest: Mapping[str, str] = field(default_factory=dict)

    def of(self, name: str, dtype: str) -> Tolerance | None:
        """The tolerance of tensor `name` whose values are of numpy type `dtype`; None: compared exactly."""
        if not is_float(dtype):
            return None
        return self.tolerances.for_dtype(narrowest(dtype, self.narrowest.get(name)) or dtype)

    @classmethod
    def of_graph(cls, tolerances: Tolerances, graph: ir.Graph) -> TensorTolerances:
        return cls(tolerances, narrowest_floats(graph))


def narrowest_floats(graph: ir.Graph) -> dict[str, str]:
    """Tensor name -> numpy name of the narrowest floating type in its computation, for every value
    that has one (graph inputs, initializers, node outputs)."""
    found: dict[str, str] = {}
    for value in [*graph.inputs, *graph.initializers.values()]:
        if (dtype := _declared(value)) is not None:
            found[value.name] = dtype
    for node in graph:
        reads = narrowest(*(_entry(found, value) for value in node.inputs), *_subgraph_types(node, found))
        for value in node.outputs:
            declared = _declared(value) or _produced_type(node)
            if value.dtype is not None and not is_float(_name(value.dtype)):
                continue  # exact: compared as integers, and it carries no rounding on
            if (dtype := narrowest(reads, declared)) is not None:
                found[value.name] = dtype
    return found


def _entry(found: dict[str, str], value: ir.Value | None) -> str | None:
    if value is None:
        return None
    return narrowest(found.get(value.name), _declared(value))


def _subgraph_types(node: ir.Node, found: dict[str, str]) -> Iterator[str | None]:
    """What a control-flow node's subgraphs read from outside and compute in, nested ones included."""
    for attribute in node.attributes.values():
        graphs = attribute.value if attribute.type == ir.AttributeType.GRAPHS else [attribute.value]
        for subgraph in graphs if attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) else ():
            inner = narrowest_floats(subgraph)
            yield narrowest(*inner.values())
            for inner_node in ir.traversal.RecursiveGraphIterator(subgraph):
                for value in inner_node.inputs:
                    yield _entry(found, value)


def _produced_type(node: ir.Node) -> str | None:
    """The type a Cast or a Constant makes, which the graph rarely records on the value itself."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Cast" and "to" in node.attributes:
        return _name(ir.DataType(node.attributes["to"].value))
    if node.op_type == "Constant" and "value" in node.attributes:
        return _name(node.attributes["value"].value.dtype)
    return None


def _declared(value: ir.Value) -> str | None:
    dtype = _name(value.dtype) if value.dtype is not None else None
    return dtype if dtype is not None and is_float(dtype) else None


def _name(dtype: ir.DataType) -> str:
    try:
        return dtype.numpy().name
    except (TypeError, ValueError, NotImplementedError):  # a type numpy has no name for (string, float4)
        return dtype.name.lower()
