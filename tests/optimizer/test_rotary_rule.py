"""RotaryEmbeddingFusion on hand-built rotate-half graphs and on the Llama exports.

The Llama fixtures' counts and every-level numerics live in test_user_exports.py; here the fused
graph runs with position ids that differ per row and do not start at 0 (a left-padded batch,
a decoding step), in onnxruntime and in our executor, and each way the pattern can fail to be a
RotaryEmbedding has its near miss.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from optimizer import optimize
from tests.oracle import (
    ATOL,
    MODELS,
    RTOL,
    assert_fuses_as_pinned,
    assert_same_outputs,
    fixture_feeds,
    run_onnxruntime,
)

HEADS, HEAD_SIZE = 2, 8
RNG = np.random.default_rng(3)


def rotary_model(
    *, positions=("batch", "seq"), slice_at=HEAD_SIZE // 2, scale=None, cos_axis=1, x_type=TensorProto.FLOAT
):
    """x (batch, 2, seq, 8) rotated Llama's way by angles position_ids · inv_freq."""
    half = HEAD_SIZE // 2
    ints = {"last": [-1], "heads": [cos_axis], "zero": [0], "at": [slice_at], "end": [HEAD_SIZE]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits.append(
        numpy_helper.from_array((1.0 / 10000 ** (np.arange(half) / half)).astype(np.float32), "inv_freq")
    )
    nodes = [
        helper.make_node("Unsqueeze", ["position_ids", "last"], ["pos3"]),
        helper.make_node("Cast", ["pos3"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["posf", "inv_freq"], ["freqs"]),
        helper.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1),
        helper.make_node("Cos", ["emb"], ["cos_raw"]),
        helper.make_node("Sin", ["emb"], ["sin_raw"]),
    ]
    cos, sin = "cos_raw", "sin_raw"
    if scale is not None:
        inits.append(numpy_helper.from_array(np.array(scale, np.float32), "scale"))
        nodes += [
            helper.make_node("Mul", ["cos_raw", "scale"], ["cos"]),
            helper.make_node("Mul", ["sin_raw", "scale"], ["sin"]),
        ]
        cos, sin = "cos", "sin"
    nodes += [
        helper.make_node("Unsqueeze", [cos, "heads"], ["cos4"]),
        helper.make_node("Unsqueeze", [sin, "heads"], ["sin4"]),
        helper.make_node("Slice", ["x", "zero", "at", "last"], ["x1"]),
        helper.make_node("Slice", ["x", "at", "end", "last"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["neg"], name="/rope/Neg"),
        helper.make_node("Concat", ["neg", "x1"], ["rotated"], axis=-1),
        helper.make_node("Mul", ["rotated", "sin4"], ["rotated_sin"]),
        helper.make_node("Mul", ["x", "cos4"], ["x_cos"]),
        helper.make_node("Add", ["x_cos", "rotated_sin"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rope",
        [
            helper.make_tensor_value_info("x", x_type, ["batch", HEADS, "seq", HEAD_SIZE]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, list(positions)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(batch=3, seq=5):
    offsets = RNG.integers(0, 40, (batch, 1))  # each row starts somewhere else
    return {
        "x": RNG.standard_normal((batch, HEADS, seq, HEAD_SIZE)).astype(np.float32),
        "position_ids": (offsets + np.arange(seq)).astype(np.int64),
    }


def _run_ours(model, feeds, level="disabled"):
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    return session.run(None, feeds)


@pytest.mark.parametrize("scale", [None, 0.5], ids=["plain", "attention_scaling"])
def test_rotate_half_fuses_and_matches_onnxruntime(scale):
    assert_fuses_as_pinned(rotary_model(scale=scale), _feeds(), {"com.microsoft.RotaryEmbedding": 1})


def _miss(model):
    result = optimize(model, "extended")
    assert result.report.rules["RotaryEmbeddingFusion"].fired == 0
    [miss] = result.report.explain("RotaryEmbeddingFusion")
    return miss


def test_positions_shared_by_the_batch_are_a_near_miss():
    # (1, seq) positions broadcast over the batch: the op wants one position per token of x.
    miss = _miss(rotary_model(positions=(1, "seq")))
    assert miss.step == "positions" and "one angle row per token" in miss.reason


def test_slices_that_are_not_the_halves_are_a_near_miss():
    miss = _miss(rotary_model(slice_at=2))
    assert miss.step == "rotate_half" and "two halves" in miss.reason


def test_angles_not_broadcast_over_heads_are_a_near_miss():
    miss = _miss(rotary_model(positions=("batch", "seq"), cos_axis=2))
    assert miss.step == "cos" and "Unsqueeze on axis 1" in miss.reason


@pytest.mark.parametrize("level", ["extended", "all"])
@pytest.mark.parametrize("name", ["llama_torchscript_opset14.onnx", "llama_dynamo_opset20.onnx"])
def test_llama_with_offset_positions_per_row(name, level):
    # Rows that start at different positions (left padding, a decoding step): token t of row b
    # must read its own angles, in onnxruntime and in our executor.
    model = onnx.load(str(MODELS / name))
    feeds = fixture_feeds(model, batch=3, seq=6)
    feeds["position_ids"] = (np.array([[0], [5], [17]]) + np.arange(6)).astype(np.int64)
    result = optimize(model, level)
    assert result.report.fusions["com.microsoft.RotaryEmbedding"] == 4
    assert_same_outputs(model, result, feeds)
    expected = run_onnxruntime(model, feeds)
    for (output, want), got in zip(expected.items(), _run_ours(model, feeds, level), strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=output)


def test_a_type_onnxruntime_has_no_kernel_for_is_a_near_miss():
    miss = _miss(rotary_model(x_type=TensorProto.DOUBLE))
    assert miss.step == "dtype" and "double" in miss.reason
