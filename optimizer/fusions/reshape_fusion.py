"""ReshapeFusion: a Reshape whose target shape is assembled at run time  =>  a constant shape.

Exporters build reshape targets from the input's own shape:

    x -> Shape -> Gather(i) -> Unsqueeze --\\
                            [constant]  ----> Concat -> Reshape(x, .)
    x -> Shape -> Slice(i:j)  -------------/

Each Concat piece becomes constant numbers (as ONNX Runtime's reshape_fusion.cc does):
  - a constant stays as it is;
  - dimension i of the Reshape's own input x, taken at position i of the target, becomes 0
    (Reshape's "copy this dimension"); so does a Slice of Shape(x) aligned with its positions;
  - a dimension known from shape inference becomes its number;
  - at most one remaining single element, computed at run time, becomes -1.
The chain nodes that only served this Reshape are removed with it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    attr,
    const_array,
    consumers,
    describe,
    input_at,
    is_op,
    opset,
    producer,
    unique_name,
)
from optimizer.rule import Match, Rule, fail

RUNTIME = None  # a target element only known at run time


class ReshapeFusion(Rule):
    name = "ReshapeFusion"
    anchors = ("Reshape",)
    emits = ("Reshape",)

    def match(self, graph: ir.Graph, reshape: ir.Node):
        data, target = reshape.inputs[0], input_at(reshape, 1)
        concat = producer(target)
        if const_array(target) is not None:
            return fail("shape", f"the target shape of {describe(reshape)} is already a constant")
        if not is_op(concat, "Concat"):
            return fail("shape", f"the target shape of {describe(reshape)} comes from {describe(concat)}, not a Concat "
                        "of dimensions", concat)
        if attr(reshape, "allowzero", 0):  # 0 would mean a zero-sized dimension, not "copy"
            return fail("allowzero", f"{describe(reshape)} has allowzero=1: a 0 in its shape is a size, not a copy")
        elements: list[int | None] = []
        chain: list[ir.Node] = [concat]
        for piece in concat.inputs:
            values = _piece_values(graph, piece, data, len(elements), chain)
            if isinstance(values, str):
                return fail("shape", values, producer(piece))
            elements.extend(values)
        unknown = [i for i, v in enumerate(elements) if v is RUNTIME]
        if len(unknown) > 1 or (unknown and -1 in elements):
            return fail("shape", _too_many_unknowns(len(unknown), -1 in elements))
        if unknown:
            elements[unknown[0]] = -1
        return Match(
            nodes=_removable(reshape, chain),
            outputs=[reshape.outputs[0]],
            captures={"data": data, "shape": np.array(elements, dtype=np.int64),
                      "shape_name": unique_name(graph, f"{reshape.name or 'Reshape'}_shape")},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        shape = op.initializer(ir.Tensor(match.shape, name=match.shape_name))
        return op.op("Reshape", [match.data, shape])


def _piece_values(graph: ir.Graph, piece: ir.Value, data: ir.Value, position: int, chain: list[ir.Node]):
    """The numbers a Concat input contributes (RUNTIME where unknown), or why it can't be read."""
    array = const_array(piece)
    if array is not None:
        if array.ndim > 1:
            return f"Concat input '{piece.name}' has rank {array.ndim}"
        return [int(v) for v in array.reshape(-1)]
    node = producer(piece)
    gather, wrapper = (producer(node.inputs[0]), [node]) if is_op(node, "Unsqueeze") else (node, [])
    if is_op(gather, "Gather"):
        shape_node = producer(gather.inputs[0])
        index = const_array(input_at(gather, 1))
        if is_op(shape_node, "Shape") and index is not None and index.size == 1 and attr(gather, "axis", 0) == 0:
            source = shape_node.inputs[0]
            dim = _dim(source, shape_node, int(index.reshape(())))
            chain.extend([*wrapper, gather, shape_node])
            return [_copy_or_known(source, dim, data, position)]
    if is_op(node, "Shape") and node.inputs[0].shape is not None:
        source, (start, end) = node.inputs[0], _shape_range(node, len(node.inputs[0].shape))
        chain.append(node)
        return [_copy_or_known(source, d, data, position + k) for k, d in enumerate(range(start, end))]
    if is_op(node, "Slice") and is_op(producer(node.inputs[0]), "Shape") and opset(graph) >= 10:
        shape_node = producer(node.inputs[0])
        starts, ends = const_array(input_at(node, 1)), const_array(input_at(node, 2))
        source = shape_node.inputs[0]
        if starts is not None and ends is not None and source.shape is not None and len(node.inputs) <= 4:
            rank = len(source.shape)
            start, end = (int(v.reshape(-1)[0]) for v in (starts, ends))
            start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
            if attr(shape_node, "start", 0) == 0 and attr(shape_node, "end") is None:
                chain.extend([node, shape_node])
                return [_copy_or_known(source, d, data, position + k) for k, d in enumerate(range(start, end))]
    length = piece.shape[0] if piece.shape is not None and len(piece.shape) == 1 else None
    if length == 1:
        return [RUNTIME]
    return f"Concat input '{piece.name}' comes from {describe(node)} and holds {length if isinstance(length, int) else 'an unknown number of'} elements"


def _dim(source: ir.Value, shape_node: ir.Node, index: int) -> int | None:
    """The dimension of `source` that Gather(Shape(source), index) reads, or None if out of reach."""
    if source.shape is None or attr(shape_node, "start", 0) != 0 or attr(shape_node, "end") is not None:
        return None
    rank = len(source.shape)
    index = index + rank if index < 0 else index
    return index if 0 <= index < rank else None


def _copy_or_known(source: ir.Value, dim: int | None, data: ir.Value, position: int):
    """0 when the element copies the Reshape input's dimension at the same position; the
    number when shape inference knows it; otherwise RUNTIME."""
    if dim is None:
        return RUNTIME
    value = source.shape[dim]
    if source is data and dim == position:
        return 0
    if data.shape is not None and position < len(data.shape) and not isinstance(value, int):
        if data.shape[position] == value and value.value is not None:  # the same symbolic dimension
            return 0
    return value if isinstance(value, int) else RUNTIME


def _removable(reshape: ir.Node, chain: list[ir.Node]) -> list[ir.Node]:
    """The Reshape plus every chain node whose outputs are read only inside the match."""
    kept = {id(n): n for n in chain}
    changed = True
    while changed:
        changed = False
        inside = set(kept) | {id(reshape)}
        for key, node in list(kept.items()):
            for value in node.outputs:
                if value.is_graph_output() or any(id(user) not in inside for user in consumers(value)):
                    del kept[key]
                    changed = True
                    break
    return [*kept.values(), reshape]


def _shape_range(shape_node: ir.Node, rank: int) -> tuple[int, int]:
    """The [start, end) dimensions a Shape node reports (its opset 15 start/end attributes)."""
    start, end = attr(shape_node, "start", 0), attr(shape_node, "end", rank)
    return tuple(max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))


def _too_many_unknowns(count: int, has_minus_one: bool) -> str:
    subject = f"{count} element{'s' if count != 1 else ''} of the target shape {'are' if count != 1 else 'is'}"
    if has_minus_one:
        return f"{subject} computed at run time besides the constant -1; only one element can be -1"
    return f"{subject} computed at run time; only one can become -1"
