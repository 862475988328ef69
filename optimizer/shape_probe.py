"""Shapes at probe sizes: onnx's inference on the graph with its symbolic input dimensions pinned.

Some exports leave a size symbolic that the graph fixes: TorchScript writes Llama's head split as
view(batch, seq, -1, head_size), so the number of heads is "whatever is left", which inference
without sizes cannot name. Inferring the graph twice, with every symbolic input dimension pinned
to a number and then to another, gives each value's shape at both; a dimension equal in both runs
does not depend on the inputs' sizes there (the sizes are chosen so no product or difference of
them coincides). The first run also gives the shape arithmetic's values at known sizes, which the
layout probes use to evaluate reshape targets read off values inference could not name.

Runs only where a rule needs it, on the graph without its weights: the one optimize's first shape
inference serialized (serializing costs more than inferring), and cached on the graph by value
name; a rewrite keeps the names and meaning of the values it leaves, so those shapes stay true.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from optimizer.data_propagation import data_prop_is_bounded
from optimizer.match import MS
from optimizer.onnx_api import call_onnx  # strips and restores weights
from optimizer.text import shorten
from optimizer.value_probe import PROBE_ERRORS, evaluate_on_probe

log = logging.getLogger("fusionwatch.optimizer")

# (batch, every other symbolic input dimension) for the two runs
FIRST_SIZES, SECOND_SIZES = (2, 3), (5, 7)
CACHE_KEY = "fusionwatch.pinned_shapes"
EVALUATED_KEY = "fusionwatch.evaluated_shapes"
PROTO_KEY = "fusionwatch.unoptimized_proto"
# Ops onnx cannot infer whose first output has their first input's shape: onnxruntime's own
# normalizations (LayerNormalization below opset 17 too) and the fused ops rules emit, which the
# graph holds by the time a later rule asks. (MultiHeadAttention: our rules give it a query as
# wide as its value.)
SAME_SHAPE_OPS = frozenset(
    {("", "LayerNormalization"), ("", "SimplifiedLayerNormalization"), (MS, "SkipLayerNormalization"),
     (MS, "SkipSimplifiedLayerNormalization"), (MS, "MultiHeadAttention"), (MS, "FastGelu"), (MS, "BiasGelu"),
     (MS, "Gelu"), (MS, "QuickGelu"), (MS, "RotaryEmbedding")}
)

Shapes = Mapping[str, tuple[int, ...]]


def remember_unoptimized(graph: ir.Graph, proto: onnx.ModelProto) -> None:
    """Keep the serialized graph as loaded (optimize's first shape inference makes it anyway):
    the pinned runs infer it instead of serializing the graph again. Values keep their names
    through every rewrite, and a rewrite preserves what each surviving value computes, so its
    shapes stay true for them."""
    graph.meta[PROTO_KEY] = proto


def forget_pinned(graph: ir.Graph, keep_unoptimized: bool = True) -> None:
    """Drop pinned shapes of an earlier optimization of this graph (and, at the end of one, the
    serialized graph they were inferred from, which a session would otherwise hold on to)."""
    graph.meta.pop(CACHE_KEY, None)
    graph.meta.pop(EVALUATED_KEY, None)
    if not keep_unoptimized:
        graph.meta.pop(PROTO_KEY, None)


def pinned_shapes(graph: ir.Graph, value: ir.Value) -> tuple[Shapes, Shapes]:
    """Static shapes by value name at FIRST_SIZES and SECOND_SIZES.

    From the graph as loaded when optimize kept it (once per optimization); otherwise from the
    graph as it is, computed again only when `value` is not among them and the graph changed
    since (a fused op inference now knows may stand where an opaque one stood)."""
    cached = graph.meta.get(CACHE_KEY)
    unoptimized = graph.meta.get(PROTO_KEY)
    if cached is None and unoptimized is not None:
        cached = (*_both(unoptimized), None)
        graph.meta[CACHE_KEY] = cached
    elif cached is None or (value.name not in cached[0] and cached[2] is not None and cached[2] != graph.num_nodes()):
        first, second = _infer_pinned(graph)
        cached = (first, second, graph.num_nodes())
        graph.meta[CACHE_KEY] = cached
    return cached[0], cached[1]


def constant_dims(graph: ir.Graph, value: ir.Value) -> list[int | None] | None:
    """`value`'s dimensions, each a number where the graph fixes it (declared, or equal at both
    probe sizes), None where it varies; None when inference knows no shape for it."""
    first, second = pinned_shapes(graph, value)
    a, b = first.get(value.name), second.get(value.name)
    if value.shape is None and (a is None or b is None):
        return None
    declared = list(value.shape) if value.shape is not None else [None] * len(a)
    if a is not None and b is not None and len(a) == len(b) == len(declared):
        return [d if isinstance(d, int) else (x if x == y else None) for d, x, y in zip(declared, a, b, strict=True)]
    return [d if isinstance(d, int) else None for d in declared]


# Nodes one evaluation may run: a rotary embedding and a grouped-query repeat between a projection
# and Q, K or V in heads take about 60, their cos/sin tables included.
MAX_EVALUATED_NODES = 150


def evaluated_dims(graph: ir.Graph, value: ir.Value) -> list[int | None] | None:
    """`value`'s dimensions as constant_dims gives them, for a value pinned inference names none of:
    a number where the shapes evaluated at both probe sizes (evaluated_shapes) agree, None where they
    differ; None when they cannot be evaluated."""
    shapes = evaluated_shapes(graph, value)
    if shapes is None:
        return None
    a, b = shapes
    if len(a) != len(b) or (value.shape is not None and len(value.shape) != len(a)):
        return None
    dims = [x if x == y else None for x, y in zip(a, b, strict=True)]
    declared = list(value.shape) if value.shape is not None else [None] * len(a)
    if any(isinstance(d, int) and d != e for d, e in zip(declared, dims, strict=True)):
        return None  # not what inference proved: the evaluation went wrong somewhere
    return dims


def evaluated_shapes(graph: ir.Graph, value: ir.Value) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """`value`'s shapes at FIRST_SIZES and SECOND_SIZES: pinned inference's, or where it names none,
    its chain evaluated at both sizes on stand-in arrays; None when that cannot be done.

    onnx's inference stops at a Slice whose bounds are shape arithmetic it does not propagate (a
    partial rotary embedding's split of each head, Range's output) and at a grouped-query repeat;
    every value after that is unnamed, though the graph fixes its heads and head size. Evaluating
    the chain names them: floating-point values whose pinned shape is known stand in as arrays of
    that shape, and everything between them and `value` is computed (constants, shape arithmetic,
    the data movement and elementwise work of the chain). The stand-ins' contents could reach a
    shape only through an op that reads data into sizes (NonZero, a Range over data), so each size
    is evaluated with two different contents, and a shape that differs between them is not taken.
    Cached on the graph by value name, as the pinned shapes are."""
    first, second = pinned_shapes(graph, value)
    if value.name in first and value.name in second:
        return first[value.name], second[value.name]
    if value.name is None:  # nothing to cache it by
        return _evaluate_shapes(graph, value, first, second)
    cache = graph.meta.setdefault(EVALUATED_KEY, {})
    if value.name not in cache:
        cache[value.name] = _evaluate_shapes(graph, value, first, second)
    return cache[value.name]


def _evaluate_shapes(graph: ir.Graph, value: ir.Value, first: Shapes, second: Shapes):
    shapes = []
    for pinned in (first, second):
        found = set()
        for fill in (_zeros, _ramp):
            def stand_in(current: ir.Value, pinned=pinned, fill=fill) -> np.ndarray | None:
                shape, dtype = pinned.get(current.name), current.dtype
                if shape is None or dtype is None or not dtype.is_floating_point():
                    return None
                return fill(shape, dtype.numpy())
            try:
                found.add(np.shape(evaluate_on_probe(graph, value, {}, pinned, MAX_EVALUATED_NODES,
                                                     stand_in=stand_in)))
            except PROBE_ERRORS:
                return None
        if len(found) != 1:
            return None
        shapes.append(found.pop())
    return shapes[0], shapes[1]


def _zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    return np.zeros(shape, dtype)


def _ramp(shape: tuple[int, ...], dtype) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) % 7 + 1).astype(dtype).reshape(shape)


def _infer_pinned(graph: ir.Graph) -> tuple[Shapes, Shapes]:
    """Both runs on one serialization of the graph (serializing costs more than inferring)."""
    model = ir.Model(graph, ir_version=10)
    if not data_prop_is_bounded(model):  # a huge generator: data propagation would allocate it
        return {}, {}
    return call_onnx(_both, model)


def _both(proto: onnx.ModelProto) -> tuple[Shapes, Shapes]:
    """What both runs share is done once, on one copy: the inferred value infos and declared
    output shapes cleared, onnxruntime's ops swapped for stand-ins. Each run then pins that copy's
    symbolic input dimensions in place (inference reads a serialized copy of its own)."""
    shared = onnx.ModelProto()
    shared.CopyFrom(proto)
    del shared.graph.value_info[:]
    for value in shared.graph.output:  # declared symbolic; the pinned run finds numbers
        value.type.tensor_type.ClearField("shape")
    _use_stand_ins(shared)
    initializers = {t.name: tuple(t.dims) for t in shared.graph.initializer}
    symbolic = [(axis, dim) for value in shared.graph.input if value.name not in initializers
                for axis, dim in enumerate(value.type.tensor_type.shape.dim) if not dim.HasField("dim_value")]
    runs = []
    for batch, other in (FIRST_SIZES, SECOND_SIZES):
        for axis, dim in symbolic:
            dim.dim_value = batch if axis == 0 else other
        try:
            inferred = onnx.shape_inference.infer_shapes(shared, check_type=False, strict_mode=False, data_prop=True)
            runs.append(InferredShapes(inferred.graph, initializers))
        except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as error:
            log.warning("pinned shape inference failed: %s", shorten(str(error), 300))
            runs.append({})
    return runs[0], runs[1]


class InferredShapes(Mapping):
    """Static shapes by value name, each read off the inferred graph when first asked for.

    Rules ask for a handful of values' shapes; reading all ~1,100 value infos of a tiny GPT-2
    through protobuf's Python access cost a millisecond per run, more than the rest of the run
    outside onnx's inference."""

    def __init__(self, inferred: onnx.GraphProto, initializers: Shapes) -> None:
        # Later entries win, as they did in one dict built in this order: outputs over inputs over
        # value infos, initializers over all.
        self._infos = {info.name: info for part in (inferred.value_info, inferred.input, inferred.output)
                       for info in part}
        self._read: dict[str, tuple[int, ...] | None] = dict(initializers)

    def _shape(self, name: str) -> tuple[int, ...] | None:
        try:
            return self._read[name]
        except KeyError:
            info = self._infos.get(name)
            shape = self._read[name] = None if info is None else _static(info)
            return shape

    def __getitem__(self, name: str) -> tuple[int, ...]:
        shape = self._shape(name) if isinstance(name, str) else None
        if shape is None:
            raise KeyError(name)
        return shape

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._shape(name) is not None

    def __iter__(self) -> Iterator[str]:
        return (name for name in dict.fromkeys([*self._infos, *self._read]) if self._shape(name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:  # the first shape found answers it: no need to read every one
        return next(iter(self), None) is not None


def _use_stand_ins(proto: onnx.ModelProto) -> None:
    """Swap onnxruntime's ops, which onnx cannot infer, for standard ones with the same output
    shapes (this copy of the graph is only ever inferred, never run), so one inference pass goes
    on through them: a same-shape op becomes Identity, EmbedLayerNormalization the word lookup,
    Attention a product with a stand-in weight of the output's width. A node swapped for one
    node is overwritten where it stands; the node list is rebuilt only where a swap changes the
    count, since rebuilding copies every node (most of this function's cost on a tiny GPT-2, whose
    LayerNormalizations become Identities)."""
    # The op type alone rules out nearly every node, at one protobuf access each (~0.5 ms a run
    # on the tiny GPT-2's 527 nodes, against reading the domain and building a key for each).
    swaps = [(index, stand_ins) for index, node in enumerate(proto.graph.node)
             if node.op_type in _STAND_IN_OP_TYPES and (stand_ins := _stand_ins(node, proto)) is not None]
    if all(len(stand_ins) == 1 for _, stand_ins in swaps):
        for index, (stand_in,) in swaps:
            proto.graph.node[index].CopyFrom(stand_in)
        return
    swapped = dict(swaps)
    nodes = [new for index, node in enumerate(proto.graph.node) for new in swapped.get(index, [node])]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)


_STAND_IN_OP_TYPES = frozenset(
    {op_type for _, op_type in SAME_SHAPE_OPS} | {"EmbedLayerNormalization", "Attention", "FusedGemm", "FusedMatMul"}
)


def _stand_ins(node: onnx.NodeProto, proto: onnx.ModelProto) -> list[onnx.NodeProto] | None:
    """The standard nodes standing in for `node` (its weights added to `proto`); None to keep it."""
    key = (node.domain, node.op_type)
    if key in SAME_SHAPE_OPS:  # the Skip ops' 4th output is the residual sum: the same shape too
        kept = (0, 3) if node.op_type.startswith("Skip") else (0,)
        return [onnx.helper.make_node("Identity", [node.input[0]], [node.output[i]])
                for i in kept if i < len(node.output) and node.output[i]]
    if key == (MS, "EmbedLayerNormalization") and len(node.input) > 2:
        return [onnx.helper.make_node("Gather", [node.input[2], node.input[0]], [node.output[i]])
                for i in (0, 2) if i < len(node.output) and node.output[i]]
    if key == (MS, "Attention") and not any(a.name == "qkv_hidden_sizes" for a in node.attribute):
        weight = f"{node.output[0]}/stand_in_weight"
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 3], np.int64), f"{weight}/thirds"))
        return [
            onnx.helper.make_node("Shape", [node.input[1]], [f"{weight}/shape"]),
            onnx.helper.make_node("Div", [f"{weight}/shape", f"{weight}/thirds"], [f"{weight}/dims"]),
            onnx.helper.make_node("ConstantOfShape", [f"{weight}/dims"], [weight]),
            onnx.helper.make_node("MatMul", [node.input[0], weight], [node.output[0]]),
        ]
    if key == (MS, "FusedGemm"):
        stand_in = onnx.helper.make_node("Gemm", list(node.input[:3]), [node.output[0]])
        stand_in.attribute.extend(a for a in node.attribute if a.name in ("transA", "transB", "alpha", "beta"))
        return [stand_in]
    if key == (MS, "FusedMatMul") and all(
        a.name == "alpha" for a in node.attribute if onnx.helper.get_attribute_value(a)
    ):
        return [onnx.helper.make_node("MatMul", list(node.input[:2]), [node.output[0]])]
    return None


def _static(info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims = []
    for dim in tensor.shape.dim:  # one walk: each protobuf access from Python is a call
        if not dim.HasField("dim_value"):
            return None
        dims.append(dim.dim_value)
    return tuple(dims)


__all__ = ["pinned_shapes", "constant_dims", "evaluated_dims", "evaluated_shapes", "FIRST_SIZES"]
