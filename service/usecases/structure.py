"""Where a lost fused op stood, and what stands there now: the structural half of a fusion-regression's cause.

The baseline's optimized graph names the place: a fused node's inputs (the values it read, say the
MatMul's output and the bias) and the nodes that read its output (the next MatMul). Exports of one
model by one exporter keep those names, so the same boundary is found in both unoptimized graphs, and
the nodes between it are the subgraph the baseline fused and the one this commit has instead; an
export by another exporter keeps only the parameters' names, and the place is found from the bias. Each is said as
a chain of ops with their constant operands ("Div(√2) → Erf → Add(1) → Mul → Mul(0.5)"), and the
first step where the two part is named. The same cut is the reproduction model (repro.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

# Nodes that compute nothing a fusion reads: an exporter's Identity (TorchScript shares equal parameters
# through one) would make alike places read apart.
UNSAID = ("Constant", "Identity")
MAX_REGION_NODES = 64  # a fused op stands for a handful of nodes; more means the boundary was not found
# Constants a person recognises by name, within float32's precision.
NAMED_CONSTANTS = ((math.sqrt(2), "√2"), (1 / math.sqrt(2), "1/√2"), (math.sqrt(2 / math.pi), "√(2/π)"))


@dataclass
class Region:
    """The nodes between a boundary's inputs and the value its consumer reads, in graph order."""

    nodes: list[onnx.NodeProto]
    inputs: list[str]  # boundary values the region reads that are not constants
    output: str
    steps: list[str] = field(default_factory=list)  # "Div(√2)", one per non-Constant node

    @property
    def words(self) -> str:
        return " → ".join(self.steps) or "nothing (the value passes straight through)"


@dataclass
class Place:
    """Where one fused node stood in the baseline's optimized graph."""

    fused_node: str
    inputs: list[str]  # the fused node's input values
    consumer: str | None  # a node reading its output, by name, and at which input
    consumer_input: int
    output: str
    consumer_op: str | None = None  # that node's op type ("MatMul")


def places_of(optimized: onnx.ModelProto, op_key: str) -> list[Place]:
    """Every node of `op_key` ("com.microsoft.BiasGelu") in an optimized graph, as a boundary."""
    domain, _, op_type = op_key.rpartition(".")
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in optimized.graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
    found = []
    for node in optimized.graph.node:
        if node.op_type != op_type or (node.domain or "") not in ((domain,) if domain else ("", "ai.onnx")):
            continue
        output = node.output[0]
        consumer = next(((r, i) for r, i in readers.get(output, []) if r.name), None)
        found.append(Place(node.name, [n for n in node.input if n], consumer[0].name if consumer else None,
                           consumer[1] if consumer else 0, output, consumer[0].op_type if consumer else None))
    return found


def region_at(model: onnx.ModelProto, place: Place) -> Region | None:
    """The unoptimized subgraph of `model` standing at `place`, or None where the boundary is not there:
    found by the names of its values and consumer, else (another exporter's names) by its parameter's."""
    found = _region_by_names(model, place)
    return found if found is not None else _region_by_parameter(model, place)


def _region_by_parameter(model: onnx.ModelProto, place: Place) -> Region | None:
    """Another exporter names values and nodes its own way but keeps the model's parameter names
    ("…intermediate.dense.bias"): the region starts at a node reading the parameter the fused node read,
    and runs forward to the values read by a node of the baseline consumer's op (the next MatMul). It
    must be closed: its nodes read only its own values, its one data input and constants. Exporters
    share equal parameters (a freshly initialized model's zero biases) among places: then every place
    the parameter starts must read alike, and one stands for them."""
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    shared = [name for name in place.inputs if name in constants]
    if place.consumer_op is None or not shared:
        return None
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producers = {out: node for node in graph.node for out in node.output}
    found = [_forward_region(graph, start, place.consumer_op, readers, producers, constants)
             for start in readers.get(shared[0], [])]
    if not found or any(region is None for region in found) or len({r.words for r in found}) != 1:
        return None
    return found[0]


def _forward_region(graph: onnx.GraphProto, start: onnx.NodeProto, stop_op: str, readers: dict, producers: dict,
                    constants: set[str]) -> Region | None:
    data = [n for n in start.input if n and n not in constants]
    if len(data) != 1:
        return None
    chosen: dict[int, onnx.NodeProto] = {id(start): start}
    pending, ends = list(start.output), set()
    while pending:
        value = pending.pop()
        for reader in readers.get(value, []):
            if reader.op_type == stop_op:
                ends.add(value)
            elif id(reader) not in chosen:
                chosen[id(reader)] = reader
                if len(chosen) > MAX_REGION_NODES:
                    return None
                pending.extend(reader.output)
    nodes = [n for n in graph.node if id(n) in chosen]
    known = {out for node in nodes for out in node.output} | constants | set(data)
    outside = [name for node in nodes for name in node.input
               if name and name not in known and getattr(producers.get(name), "op_type", None) != "Constant"]
    if len(ends) != 1 or outside:
        return None
    return Region(nodes, data, ends.pop(), [_step(node, producers, constants, graph) for node in nodes
                                            if node.op_type not in UNSAID])


def _region_by_names(model: onnx.ModelProto, place: Place) -> Region | None:
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {init.name for init in graph.initializer}
    if place.consumer is not None:
        consumer = next((n for n in graph.node if n.name == place.consumer), None)
        if consumer is None or len(consumer.input) <= place.consumer_input:
            return None
        output = consumer.input[place.consumer_input]
    elif place.output in producers:
        output = place.output
    else:
        return None
    stops = set(place.inputs) | constants | {v.name for v in graph.input}
    chosen: dict[int, onnx.NodeProto] = {}
    pending = [output]
    while pending:
        value = pending.pop()
        if value in stops or not value:
            continue
        node = producers.get(value)
        if node is None or id(node) in chosen:
            continue
        chosen[id(node)] = node
        if len(chosen) > MAX_REGION_NODES:
            return None
        pending.extend(node.input)
    if not any(n.op_type != "Constant" for n in chosen.values()):
        return None
    nodes = [n for n in graph.node if id(n) in chosen]
    if not _reaches(nodes, place.inputs, producers):
        return None
    read = {name for node in nodes for name in node.input if name}
    inputs = [name for name in place.inputs if name in read and name not in constants and producers.get(name) not in nodes]
    return Region(nodes, inputs, output, [_step(node, producers, constants, graph) for node in nodes
                                          if node.op_type not in UNSAID])


def _reaches(nodes: list[onnx.NodeProto], inputs: list[str], producers: dict) -> bool:
    """The region reads the fused node's data input: it is the same place, not a walk into the model."""
    read = {name for node in nodes for name in node.input}
    return any(name in read for name in inputs[:1])


def departure(before: Region, after: Region) -> str:
    """The first step where `after` parts from `before`, in words."""
    for index, (old, new) in enumerate(zip(before.steps, after.steps, strict=False), 1):
        if old.split("(")[0] != new.split("(")[0] or old != new:
            return f"step {index}: {new} where the baseline had {old}"
    if len(after.steps) != len(before.steps):
        index = min(len(before.steps), len(after.steps)) + 1
        extra = after.steps[index - 1] if len(after.steps) >= index else f"the end, where the baseline went on with {before.steps[index - 1]}"
        return f"step {index}: {extra}"
    return "nowhere: the ops and constants are the same"


def _step(node: onnx.NodeProto, producers: dict, constants: set[str], graph: onnx.GraphProto) -> str:
    values = [_constant_text(name, producers, graph) for name in node.input if name]
    shown = [v for v in values if v is not None]
    name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    return f"{name}({', '.join(shown)})" if shown else name


def _constant_text(name: str, producers: dict, graph: onnx.GraphProto) -> str | None:
    """A scalar constant operand as a person writes it; None for data or a tensor of many values."""
    array = None
    for init in graph.initializer:
        if init.name == name:
            if math.prod(init.dims) == 1:
                array = numpy_helper.to_array(init)
            break
    node = producers.get(name)
    if array is None and node is not None and node.op_type == "Constant":
        for attribute in node.attribute:
            if attribute.name == "value" and math.prod(attribute.t.dims) == 1:
                array = numpy_helper.to_array(attribute.t)
            elif attribute.name == "value_float":
                array = np.asarray(attribute.f)
            elif attribute.name == "value_int":
                array = np.asarray(attribute.i)
    if array is None:
        return None
    value = float(np.asarray(array).reshape(-1)[0])
    for known, text in NAMED_CONSTANTS:
        if math.isclose(value, known, rel_tol=1e-4):
            return text
    if value.is_integer():
        return str(int(value))
    return f"{value:.6g}"
