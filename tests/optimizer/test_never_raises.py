"""The optimizer never raises on a model onnxruntime can load: every fixture and every ONNX Runtime
fusion test model (when present) through every level. A constant that cannot be evaluated stays
unfolded, a shape inference cannot find stays unknown; neither is an exception."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import ModelLoadError, optimize
from optimizer.levels import LEVEL_NAMES
from tests.optimizer.ort_fusion_cases import ort_testdata_dir
from tests.oracle import MODELS, assert_same_outputs

ORT_FOLDER = ort_testdata_dir()
MODEL_PATHS = sorted(MODELS.glob("*.onnx")) + (sorted(ORT_FOLDER.glob("*.onnx")) if ORT_FOLDER else [])


# ONNX Runtime test models that are not valid ONNX (onnx.checker refuses them too): the loader
# refuses them with one error naming the problem, which is what a user uploading one gets.
INVALID = {
    "fuse-conv-bn-mul-add-unsqueeze.onnx": "graph output 'fused_result' is listed twice",
    "fuse-conv-bn-mul-add-unsqueeze.negative_axes.onnx": "graph output 'fused_result' is listed twice",
}


@pytest.mark.parametrize("path", MODEL_PATHS, ids=lambda p: p.name.removesuffix(".onnx"))
def test_every_model_through_every_level(path):
    if path.parent == ORT_FOLDER and path.name in INVALID:
        with pytest.raises(ModelLoadError, match=INVALID[path.name]):
            optimize(str(path), "basic")
        return
    for level in LEVEL_NAMES:
        optimize(str(path), level)


def test_a_negative_declared_dimension_is_unknown_not_minus_one():
    # Older exporters (and ONNX Runtime's embed_layer_norm_format8.onnx) declare unknown sizes as
    # dim_value -1. Read as a number, Shape(x) folded to [-1] and Range(0, -1) to an empty tensor.
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="/Shape"),
        helper.make_node("Gather", ["shape", "zero"], ["length"], name="/Gather", axis=0),
        helper.make_node("Range", ["start", "length", "step"], ["positions"], name="/Range"),
        helper.make_node("Cast", ["positions"], ["positions_f"], name="/Cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "positions_f"], ["y"], name="/Add"),
    ]
    scalars = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", 0), ("start", 0), ("step", 1))]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1])
    graph = helper.make_graph(nodes, "negative_dims", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1])],
                              scalars)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = optimize(model, "extended")
    assert result.report.ops_after["Range"] == 1  # still computed from the input's real length
    assert_same_outputs(model, result, {"x": np.arange(5, dtype=np.float32)})
