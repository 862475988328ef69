"""Shapes at probe sizes: onnx's inference on the graph with its symbolic input dimensions pinned.

Some exports leave a size symbolic that the graph fixes: TorchScript writes Llama's head split as
view(batch, seq, -1, head_size), so the number of heads is "whatever is left", which inference
without sizes cannot name. Inferring the graph twice, with every symbolic input dimension pinned
to a number and then to another, gives each value's shape at both; a dimension equal in both runs
does not depend on the inputs' sizes there (the sizes are chosen so no product or difference of
them coincides). The first run also gives the shape arithmetic's values at known sizes, which the
layout probes use to evaluate reshape targets read off values inference could not name.

Runs only where a rule needs it, on the graph without its weights; cached on the graph by value
name (a rewrite preserves what every surviving value computes, so a cached shape stays true).
"""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir
from onnx_ir.passes.common._c_api_utils import call_onnx_api

from optimizer.match import MS
from optimizer.text import shorten

log = logging.getLogger("fusionwatch.optimizer")

# (batch, every other symbolic input dimension) for the two runs
FIRST_SIZES, SECOND_SIZES = (2, 3), (5, 7)
CACHE_KEY = "fusionwatch.pinned_shapes"
MAX_FILL_ROUNDS = 3
# Ops onnx cannot infer whose first output has their first input's shape: onnxruntime's own
# normalizations (LayerNormalization below opset 17 too) and the fused ops rules emit, which the
# graph holds by the time a later rule asks.
SAME_SHAPE_OPS = frozenset(
    {("", "LayerNormalization"), ("", "SimplifiedLayerNormalization"), (MS, "SkipLayerNormalization"),
     (MS, "SkipSimplifiedLayerNormalization"), (MS, "MultiHeadAttention"), (MS, "FastGelu"), (MS, "BiasGelu"),
     (MS, "Gelu"), (MS, "QuickGelu"), (MS, "RotaryEmbedding")}
)

Shapes = dict[str, tuple[int, ...]]


def pinned_shapes(graph: ir.Graph, value: ir.Value) -> tuple[Shapes, Shapes]:
    """Static shapes by value name at FIRST_SIZES and SECOND_SIZES, computed again only when
    `value` is new since the last computation."""
    cached = graph.meta.get(CACHE_KEY)
    if cached is None or (value.name not in cached[0] and value.name not in cached[2]):
        first, second = _infer_pinned(graph, FIRST_SIZES), _infer_pinned(graph, SECOND_SIZES)
        cached = (first, second, {v.name for node in graph for v in node.outputs} - set(first))
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


def _infer_pinned(graph: ir.Graph, sizes: tuple[int, int]) -> Shapes:
    model = ir.Model(graph, ir_version=10)
    try:
        return call_onnx_api(lambda proto: _run(proto, sizes), model)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as error:
        log.warning("pinned shape inference failed: %s", shorten(str(error), 300))
        return {}


def _run(proto: onnx.ModelProto, sizes: tuple[int, int]) -> Shapes:
    batch, other = sizes
    initializers = {t.name for t in proto.graph.initializer}
    for value in proto.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value") and value.name not in initializers:
                dim.dim_value = batch if axis == 0 else other
    del proto.graph.value_info[:]
    for value in proto.graph.output:  # declared symbolic; the pinned run finds numbers
        value.type.tensor_type.ClearField("shape")
    shapes: Shapes = {}
    for _ in range(MAX_FILL_ROUNDS + 1):
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
        shapes = {info.name: _static(info) for info in inferred.graph.value_info}
        shapes = {name: shape for name, shape in shapes.items() if shape is not None}
        # onnx has no shape function for onnxruntime's normalization ops: they keep their input's shape
        added = False
        for node in proto.graph.node:
            if (node.domain, node.op_type) in SAME_SHAPE_OPS and node.output and node.output[0] not in shapes:
                source = next((info for info in inferred.graph.value_info if info.name == node.input[0]), None)
                if source is not None and _static(source) is not None:
                    proto.graph.value_info.append(_renamed(source, node.output[0]))
                    added = True
        if not added:
            break
    return shapes


def _static(info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tensor = info.type.tensor_type
    if not tensor.HasField("shape") or any(not d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    return tuple(d.dim_value for d in tensor.shape.dim)


def _renamed(info: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    copy.name = name
    return copy


__all__ = ["pinned_shapes", "constant_dims", "FIRST_SIZES"]
