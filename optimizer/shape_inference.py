"""Shapes and types for the rules to read, from onnx's own shape inference.

onnx-ir's ShapeInferencePass re-reads the whole inferred model to merge it back, which
costs as much as the inference on BERT-base; we merge the inferred value infos by name
into the values that lack a shape, and leave everything else as it is. The model goes to
onnx's C++ inference without its large weights (onnx-ir's helper swaps them for inputs),
so a 2 GB model costs what its graph costs.
"""

from __future__ import annotations

import itertools
import logging
from functools import partial

import onnx
import onnx_ir as ir
from onnx_ir.passes.common._c_api_utils import call_onnx_api  # strips and restores weights

log = logging.getLogger("fusionwatch.optimizer")


def infer_shapes(model: ir.Model) -> None:
    """Fill in `value.shape` / `value.type` of the main graph's values where inference knows them."""
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
