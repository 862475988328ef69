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
from functools import partial

import onnx
import onnx_ir as ir
from onnx_ir.passes.common._c_api_utils import call_onnx_api  # strips and restores weights

log = logging.getLogger("fusionwatch.optimizer")


def infer_shapes(model: ir.Model, refine: bool = False) -> None:
    """Fill in `value.shape` / `value.type` of the main graph's values where inference knows them.

    With `refine`, values that have a shape also take every dimension inference now knows as a
    number where theirs is symbolic or unknown (inference on the current graph proves it).
    """
    infer = partial(onnx.shape_inference.infer_shapes, check_type=False, strict_mode=False, data_prop=True)
    try:
        inferred = call_onnx_api(infer, model)
    except (onnx.shape_inference.InferenceError, RuntimeError) as error:
        # Rules then see fewer shapes and say so in their near misses; the model is unchanged.
        log.warning("shape inference failed: %s", error)
        return
    values = {v.name: v for node in model.graph for v in node.outputs if v.name}
    for info in itertools.chain(inferred.graph.value_info, inferred.graph.output):
        value = values.get(info.name)
        if value is None:
            continue
        if value.type is None:
            value.type = ir.serde.deserialize_type_proto_for_type(info.type)
        if value.shape is None:
            value.shape = ir.serde.deserialize_type_proto_for_shape(info.type)
        elif refine:
            _refine(value, ir.serde.deserialize_type_proto_for_shape(info.type))


def _refine(value: ir.Value, inferred: ir.Shape | None) -> None:
    if inferred is None or len(inferred) != len(value.shape):
        return
    dims = [
        new if isinstance(new, int) and not isinstance(old, int) else old
        for old, new in zip(value.shape, inferred, strict=True)
    ]
    if any(not isinstance(old, int) and isinstance(new, int) for old, new in zip(value.shape, dims, strict=True)):
        value.shape = ir.Shape(dims)
