"""Shapes and types for the rules to read, from onnx's own shape inference.

onnx-ir's ShapeInferencePass re-reads the whole inferred model to merge it back, which
costs as much as the inference on BERT-base; we merge the inferred value infos by name
into the values that lack a shape, and leave everything else as it is. The model goes to
onnx's C++ inference without its large weights (onnx-ir's helper swaps them for inputs),
so a 2 GB model costs what its graph costs.

Inference runs again after a rule that makes shapes computable (constant folding turns
`Shape(static input) -> Slice -> Gather` into constants), as ONNX Runtime re-resolves its
graph after every transformer. That pass refines: a dimension inference named `unk__N`
the first time, because it came out of arithmetic on shapes, becomes the number it is.
Without it a model exported with dynamic axes and then pinned to batch 1 (what
onnxruntime's make_dynamic_shape_fixed does) keeps `[unk__0, 16, 64]` beside `[1, 16, 64]`.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from functools import partial

import onnx
import onnx_ir as ir

from optimizer.data_propagation import data_prop_is_bounded
from optimizer.match import static_shape
from optimizer.onnx_api import call_onnx  # strips and restores weights
from optimizer.shape_probe import forget_pinned, remember_unoptimized
from optimizer.text import shorten

log = logging.getLogger("fusionwatch.optimizer")


def infer_shapes(model: ir.Model, refine: bool = False) -> None:
    """Fill in `value.shape` / `value.type` of the main graph's values where inference knows them.

    With `refine`, values that have a shape also take every dimension inference now knows as a
    number where theirs is symbolic or unknown (inference on the current graph proves it).
    """
    # The node list is walked several times here and does not change: a tuple walks ~20 times
    # faster than onnx-ir's linked list (~75 µs a walk on a tiny GPT-2).
    nodes = tuple(model.graph)
    _forget_negative_dims(model, nodes)
    _import_used_domains(model, nodes)
    _infer_once(model, refine, nodes)
    # Where onnx's inference stops (see _fill_what_onnx_cannot), say what is known and let it
    # carry on; each round can only add shapes, so a few rounds settle.
    for _ in range(MAX_FILL_ROUNDS):
        if not _fill_what_onnx_cannot(nodes):
            break
        _infer_once(model, refine, nodes)
    if not refine:  # the graph as loaded, for shape_probe's pinned runs (no second serialization)
        forget_pinned(model.graph)


MAX_FILL_ROUNDS = 3


# Ops that onnx cannot infer at the model's opset and whose first output has the first input's shape.
SHAPE_KEEPING_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})


def _fill_what_onnx_cannot(nodes: tuple[ir.Node, ...]) -> bool:
    """Shapes onnx's inference leaves out that the graph still determines; True if any was added.

    - onnx has no shape function for onnxruntime's normalization ops (LayerNormalization below
      opset 17 is onnxruntime's own): they keep their input's shape.
    - A Reshape whose target is computed (Concat of Shape pieces, as older exporters write every
      reshape) gets no shape at all, though its rank is the target's length: everything after it,
      a whole GPT-2 layer, then has no rank for the rules to check. The rank, with unknown dims.
    """
    filled = False
    for node in nodes:
        if node.domain not in ("", "ai.onnx") or not node.outputs or node.outputs[0].shape is not None:
            continue
        if node.op_type == "Reshape" and len(node.inputs) > 1:
            target, data_type = static_shape(node.inputs[1]), node.inputs[0].type
            if target is not None and len(target) == 1 and data_type is not None:
                node.outputs[0].type = data_type
                node.outputs[0].shape = ir.Shape([None] * target[0])
                filled = True
            continue
        if node.op_type not in SHAPE_KEEPING_OPS:
            continue
        source, output = node.inputs[0], node.outputs[0]
        # Y takes Scale's type (onnxruntime's since-1 ops type X apart from Scale, B and Y).
        typed = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] is not None else source
        if output.shape is None and source is not None and source.shape is not None:
            output.shape = ir.Shape(list(source.shape))
            if output.type is None and typed.type is not None:
                output.type = typed.type
            filled = True
    return filled


def _infer_once(model: ir.Model, refine: bool, nodes: tuple[ir.Node, ...]) -> None:
    infer = partial(
        onnx.shape_inference.infer_shapes, check_type=False, strict_mode=False, data_prop=data_prop_is_bounded(model)
    )
    listed_in_order = in_order(model.graph)

    def run(proto: onnx.ModelProto) -> onnx.ModelProto:
        if not refine and infer.keywords["data_prop"]:  # pinned runs propagate data too: only when bounded
            remember_unoptimized(model.graph, proto)
        if not listed_in_order:
            _sort_nodes(proto.graph)
        if refine:  # from the inputs alone: a kept `unk__N` would otherwise come back as it went in
            del proto.graph.value_info[:]
        return infer(proto)

    try:
        inferred = call_onnx(run, model)
    except (onnx.shape_inference.InferenceError, RuntimeError) as error:
        # Rules then see fewer shapes and say so in their near misses; the model is unchanged.
        log.warning("shape inference failed: %s", shorten(str(error), 300))
        return
    values = {v.name: v for node in nodes for v in node.outputs if v.name}
    named = {d.value for v in model.graph.inputs if v.shape is not None for d in v.shape if isinstance(d, ir.SymbolicDim)}
    named.discard(None)
    # A graph repeats a few types (~90 distinct among a tiny GPT-2's 530): each is read once.
    # Frozen shapes can be shared; types cannot (setting a value's dtype changes its type object).
    tensor_types: dict[bytes, tuple[ir.DataType | None, ir.Shape | None] | None] = {}
    for info in itertools.chain(inferred.graph.value_info, inferred.graph.output):
        value = values.get(info.name)
        if value is None:
            continue
        if value.type is not None and value.shape is not None and not refine:
            continue  # declared already: nothing to read
        key = info.type.SerializeToString()
        if key not in tensor_types:
            tensor_types[key] = read_tensor_type(info.type)
        read = tensor_types[key]
        if read is None:  # a sequence, an optional, a denotation: onnx-ir's reader knows them
            read = (ir.serde.deserialize_type_proto_for_type(info.type),
                    ir.serde.deserialize_type_proto_for_shape(info.type))
        elif read[0] is not None:
            read = (ir.TensorType(read[0]), read[1])
        if value.type is None:
            value.type = read[0]
        if value.shape is None:
            value.shape = read[1]
        elif refine:
            _refine(value, read[1], named)


def read_tensor_type(proto: onnx.TypeProto) -> tuple[ir.DataType | None, ir.Shape | None] | None:
    """A plain tensor type's dtype and shape, read as onnx-ir's serde reads them (frozen shape, a
    missing dimension unknown), with a few protobuf accesses per dimension instead of onnx-ir's
    wrapped calls: reading back ~530 inferred types through serde cost ~3 ms of a tiny GPT-2's
    pass. None for anything else (sequences, optionals, denotations), which the caller hands to serde."""
    if proto.denotation or proto.WhichOneof("value") != "tensor_type":
        return None
    tensor = proto.tensor_type
    dtype = ir.DataType(tensor.elem_type) if tensor.HasField("elem_type") else None
    if not tensor.HasField("shape"):
        return dtype, None
    dims: list[int | str | None] = []
    for dim in tensor.shape.dim:
        if dim.denotation:
            return None
        which = dim.WhichOneof("value")
        dims.append(dim.dim_value if which == "dim_value" else dim.dim_param if which == "dim_param" else None)
    return dtype, ir.Shape(dims, frozen=True)


def in_order(graph: ir.Graph) -> bool:
    """Whether every node comes after the producers of what it reads, checked on our graph: the
    usual case, and `_sort_nodes`' own check walks the serialized copy through protobuf's Python
    access, several times slower. A node with subgraphs reads outer values its inputs do not
    list, so a graph with one is left to that check (and the driver's final sort to onnx-ir's)."""
    seen: set[ir.Node] = set()
    for node in graph:  # plain loops: generator expressions cost a third of this walk on ~500 nodes
        attributes = node.attributes
        if attributes:
            for attribute in attributes.values():
                if attribute.type in _GRAPH_ATTRIBUTES:
                    return False
        for value in node.inputs:
            if value is not None:
                producer = value.producer()
                if producer is not None and producer not in seen:
                    return False
        seen.add(node)
    return True


_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _sort_nodes(graph: onnx.GraphProto) -> None:
    """Put the copy handed to onnx in topological order, as onnxruntime resolves a graph.

    onnx infers node by node in the listed order, so a node listed before its producer (onnxruntime's
    layer_norm_fusion_scale_bias.onnx lists its Casts last) gets no types, nor does anything after
    it. Only the copy is reordered; the model keeps its order until the driver sorts it. A graph
    that cannot be ordered (a cycle) is left as listed.
    """
    producers = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    needs = [{producers[name] for name in _reads(node) if name in producers} - {index}
             for index, node in enumerate(graph.node)]
    if all(source < index for index, need in enumerate(needs) for source in need):
        return  # already in order: the usual case, and it costs one pass
    waiting = [len(need) for need in needs]
    readers: dict[int, list[int]] = {}
    for index, need in enumerate(needs):
        for source in need:
            readers.setdefault(source, []).append(index)
    ready = deque(index for index, count in enumerate(waiting) if count == 0)
    order = []
    while ready:
        index = ready.popleft()
        order.append(index)
        for reader in readers.get(index, ()):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
    if len(order) == len(graph.node):
        nodes = [onnx.NodeProto() for _ in order]
        for node, index in zip(nodes, order, strict=True):
            node.CopyFrom(graph.node[index])
        del graph.node[:]
        graph.node.extend(nodes)


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads, those its subgraphs read from the outer scope included."""
    names = {name for name in node.input if name}
    for attribute in node.attribute:
        for subgraph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in subgraph.node:
                names |= _reads(inner)
    return names


def _import_used_domains(model: ir.Model, nodes: tuple[ir.Node, ...]) -> None:
    """Import, at version 1, every domain a node uses that the model forgot to import.

    onnxruntime runs such models (its own fusion test models use com.microsoft ops without the
    import) while onnx's inference rejects the whole graph over the one node, and every rule then
    meets a model without shapes. The import is what the node's domain needs anyway.
    """
    imports = model.graph.opset_imports
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in imports and not (domain == "" and "ai.onnx" in imports):
            imports[domain] = 1


def _forget_negative_dims(model: ir.Model, nodes: tuple[ir.Node, ...]) -> None:
    """Make a negative dimension unknown, as it means: ONNX allows none, older exporters wrote -1.

    Read as a number, -1 let ConstantFolding turn Shape(x) into [-1, -1] and the arithmetic after it
    into nonsense (a Range(0, -1) that is empty, a broadcast to a negative size) — a wrong constant
    where the model only said "not known" (ONNX Runtime's embed_layer_norm_format8.onnx).
    """
    values = [*model.graph.inputs, *model.graph.outputs, *(v for node in nodes for v in node.outputs)]
    for value in values:
        shape = value.shape
        if shape is not None and any(isinstance(d, int) and d < 0 for d in shape):
            value.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d for d in shape])


def _refine(value: ir.Value, inferred: ir.Shape | None, named: set[str] = frozenset()) -> None:
    """`value`'s symbolic or unknown dims that inference now knows: as numbers, or as a graph input's
    named dimension ('batch') where the old one is not such a name (an `unk__N` of the first run,
    or unknown): two values whose batch the first run named apart then read as the same."""
    if inferred is None or len(inferred) != len(value.shape):
        return

    def better(old, new) -> bool:
        if isinstance(old, int):
            return False
        return isinstance(new, int) or (new.value in named and old.value not in named)

    dims = [new if better(old, new) else old for old, new in zip(value.shape, inferred, strict=True)]
    if any(d is not old for d, old in zip(dims, value.shape, strict=True)):
        value.shape = ir.Shape(dims)
