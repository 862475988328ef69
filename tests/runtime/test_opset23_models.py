"""BERT, GPT-2 and a Llama-style model from PyTorch's dynamo exporter at opset 23, where attention
is the standard ONNX `Attention` (and Llama's RMSNorm and rotary embedding `RMSNormalization` and
`RotaryEmbedding`), run end to end through our executor at every level and match onnxruntime.

The feeds pad the last quarter of the last row (tests/oracle.py), so the padding mask reaches
Attention; batch 2, sequence 16, as the fixtures were exported.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from optimizer import LEVEL_NAMES
from runtime import InferenceSession, SessionOptions
from tests.oracle import ATOL, MODELS, RTOL, fixture_feeds, run_onnxruntime

FIXTURES = {
    "bert_dynamo_opset23": {"Attention"},
    "gpt2_dynamo_opset23": {"Attention"},
    "llama_dynamo_opset23": {"Attention", "RMSNormalization", "RotaryEmbedding"},
}


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(MODELS / f"{name}.onnx")  # committed fixtures (tools/make_fixtures.py)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_uses_the_opset_23_ops(name):
    model = _load(name)
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {23}
    assert FIXTURES[name] <= {node.op_type for node in model.graph.node}


@pytest.mark.parametrize("level", LEVEL_NAMES)
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_runs_at_every_level_and_matches_onnxruntime(name, level):
    model = _load(name)
    feeds = fixture_feeds(model)
    expected = run_onnxruntime(model, feeds)
    ours = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    outputs = ours.run(None, feeds)
    assert [arg.name for arg in ours.get_outputs()] == list(expected)
    for mine, (output, theirs) in zip(outputs, expected.items(), strict=True):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, output
        np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL, err_msg=f"{name} at {level}: {output}")
