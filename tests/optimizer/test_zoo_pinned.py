"""Models of the fixture zoo (tools/make_zoo.py) kept in git, their fused counts and node counts pinned:
ours never more nodes than onnxruntime's session at the matching level, and our executor at every
level on the saved right- and left-padded inputs equal to onnxruntime with its optimizations off.

    convnext_torchscript    channels-first Convs and channels-last LayerNorm/MLP: TransposeOptimizer
    swin_dynamo             windowed attention with a relative position bias, rank-3 projections
    distilbert_torchscript  position ids counted from the word lookup's shape (EmbedLayerNormFusion once
                            made a cycle of it)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import runtime
from optimizer import optimize
from tests.oracle import ATOL, RTOL

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"
LEVELS = {"extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}

# (model, level) -> (nodes after, fused ops); measured with onnxruntime 1.32, whose session leaves the
# node count in the comment.
PINNED = {
    ("convnext_torchscript", "extended"): (28, {"com.microsoft.BiasGelu": 2}),  # onnxruntime 28
    ("convnext_torchscript", "all"): (26, {"com.microsoft.BiasGelu": 2, "com.microsoft.NhwcFusedConv": 2}),  # 29
    ("swin_dynamo", "extended"): (65, {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                                       "com.microsoft.SkipLayerNormalization": 3}),  # 131
    ("swin_dynamo", "all"): (65, {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                                  "com.microsoft.SkipLayerNormalization": 3}),  # 132
    ("distilbert_torchscript", "extended"): (66, {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                                                  "com.microsoft.EmbedLayerNormalization": 1,
                                                  "com.microsoft.SkipLayerNormalization": 4}),  # 140
    ("distilbert_torchscript", "all"): (66, {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2,
                                             "com.microsoft.EmbedLayerNormalization": 1,
                                             "com.microsoft.SkipLayerNormalization": 4}),  # 140
}


def _inputs(name: str) -> dict[str, dict[str, np.ndarray]]:
    variants: dict[str, dict[str, np.ndarray]] = {}
    with np.load(ZOO / f"{name}.npz") as saved:
        for key in saved.files:
            variant, input_name = key.split("/", 1)
            variants.setdefault(variant, {})[input_name] = saved[key]
    return variants


def _onnxruntime_nodes(path: Path, level: str) -> int:
    with tempfile.TemporaryDirectory(prefix="fusionwatch-zoo-") as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = LEVELS[level]
        options.log_severity_level = 3
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return len(onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("name, level", sorted(PINNED))
def test_zoo_model_fuses_as_pinned_and_leaves_no_more_nodes_than_onnxruntime(name, level):
    path = ZOO / f"{name}.onnx"
    report = optimize(str(path), level).report
    assert (report.nodes_after, report.fusions) == PINNED[name, level]
    assert report.nodes_after <= _onnxruntime_nodes(path, level)


@pytest.mark.parametrize("name", sorted({name for name, _ in PINNED}))
def test_zoo_model_matches_onnxruntime_at_every_level_on_padded_inputs(name):
    path = ZOO / f"{name}.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for level in ("disabled", "basic", "extended", "all"):
        session = runtime.InferenceSession(str(path), runtime.SessionOptions(graph_optimization_level=level))
        for variant, feeds in _inputs(name).items():
            for ours, theirs in zip(session.run(None, feeds), reference.run(None, feeds), strict=True):
                assert np.isfinite(ours).all() == np.isfinite(theirs).all(), (level, variant)
                np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL, err_msg=f"{level} {variant}")
