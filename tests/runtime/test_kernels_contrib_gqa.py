"""com.microsoft GroupQueryAttention against onnxruntime running the same one-node model.

Prompt (right-padded rows), decoding with a past of another length per batch entry, a shared
past/present buffer, packed QKV, rotary, local window, softcap, smooth softmax, attention bias,
float16. Rows the op leaves unspecified (padding query rows, cache rows past seqlens_k + 1) are
not compared.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from runtime.kernels.base import UnsupportedOp
from tests.runtime.contrib_cases import OPSETS, run_ort, run_ours

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 16
RNG = np.random.default_rng(11)
NAMES = [
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
]
TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}


def _model(inputs, outputs=("out", "present_key", "present_value"), **attrs):
    names = [n if inputs.get(n) is not None else "" for n in NAMES]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(
        "GroupQueryAttention",
        names,
        list(outputs),
        domain="com.microsoft",
        num_heads=HEADS,
        kv_num_heads=KV_HEADS,
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "gqa",
        [
            helper.make_tensor_value_info(n, TYPES[v.dtype], v.shape)
            for n, v in inputs.items()
            if v is not None
        ],
        [helper.make_tensor_value_info(n, TYPES[inputs["query"].dtype], None) for n in outputs],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS.items()], ir_version=10
    )


def _inputs(batch, length, totals, past=0, packed=False, rotary=False, bias=None, dtype=np.float32):
    def normal(*shape):
        return RNG.standard_normal(shape).astype(dtype)

    inputs = {
        "query": normal(batch, length, (HEADS + 2 * KV_HEADS) * HEAD_SIZE)
        if packed
        else normal(batch, length, HEADS * HEAD_SIZE)
    }
    if not packed:
        inputs |= {
            "key": normal(batch, length, KV_HEADS * HEAD_SIZE),
            "value": normal(batch, length, KV_HEADS * HEAD_SIZE),
        }
    if past:
        inputs |= {
            "past_key": normal(batch, KV_HEADS, past, HEAD_SIZE),
            "past_value": normal(batch, KV_HEADS, past, HEAD_SIZE),
        }
    inputs |= {
        "seqlens_k": np.array(totals, np.int32) - 1,
        "total_sequence_length": np.array(max(totals), np.int32),
    }
    if rotary:
        angles = RNG.uniform(0, 6, (32, HEAD_SIZE // 2))
        inputs |= {"cos_cache": np.cos(angles).astype(dtype), "sin_cache": np.sin(angles).astype(dtype)}
    if bias is not None:
        inputs["attention_bias"] = normal(*bias, length, max(totals))
    return inputs


def _compare(inputs, rtol=1e-3, atol=1e-4, outputs=("out", "present_key", "present_value"), **attrs):
    model = _model(inputs, outputs, **attrs)
    want, got = run_ort(model, inputs), run_ours(model, inputs)
    length = inputs["query"].shape[1]
    totals = inputs["seqlens_k"].astype(np.int64) + 1
    for b, total in enumerate(totals):
        rows = min(length, total)
        np.testing.assert_allclose(
            got[0][b, :rows], want[0][b, :rows], rtol=rtol, atol=atol, err_msg=f"output row {b}"
        )
        for index in range(1, len(outputs)):
            assert got[index].shape == want[index].shape
            np.testing.assert_allclose(
                got[index][b, :, :total], want[index][b, :, :total], rtol=rtol, atol=atol
            )
    assert got[0].dtype == want[0].dtype


@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_prompt_with_a_right_padded_row(packed):
    _compare(_inputs(2, 5, [5, 3], packed=packed))


@pytest.mark.parametrize("rotary", [False, True])
def test_prompt_without_present_outputs(rotary):
    # as GroupQueryAttentionFusion emits it: no cache in, none out, so no buffer is built
    _compare(_inputs(2, 5, [5, 3], rotary=rotary), outputs=("out",), do_rotary=int(rotary))


def test_decoding_with_pasts_of_different_lengths():
    # past buffer of 6 rows: entry 0 has all 6 cached, entry 1 only 3 (its total is 4)
    _compare(_inputs(2, 1, [7, 4], past=6))


def test_shared_past_and_present_buffer():
    _compare(_inputs(2, 1, [5, 9], past=12))


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("past", [0, 6])
def test_rotary(interleaved, past):
    length = 1 if past else 5
    _compare(
        _inputs(2, length, [past + length] * 2, past=past, rotary=True),
        do_rotary=1,
        rotary_interleaved=interleaved,
    )


@pytest.mark.parametrize(
    "attrs",
    [{"local_window_size": 2}, {"softcap": 1.5}, {"smooth_softmax": 1}, {"scale": 0.2}],
    ids=["window", "softcap", "smooth", "scale"],
)
def test_attributes(attrs):
    _compare(_inputs(2, 6, [6, 6]), **attrs)


@pytest.mark.parametrize("bias", [(2, HEADS), (1, 1)], ids=["per_head", "broadcast"])
def test_attention_bias(bias):
    _compare(_inputs(2, 4, [4, 4], bias=bias))


def test_float16():
    _compare(_inputs(2, 4, [4, 3], dtype=np.float16), rtol=2e-3, atol=2e-3)


def test_head_sink_is_refused_when_the_session_is_built():
    inputs = _inputs(1, 2, [2]) | {"head_sink": np.zeros(HEADS, np.float32)}
    node = ir.from_proto(_model(inputs)).graph[0]
    from runtime.kernels.contrib_group_query_attention import GroupQueryAttention

    with pytest.raises(UnsupportedOp, match="head_sink is not implemented"):
        GroupQueryAttention(node, 1)


def test_window_and_softcap_with_a_bias_while_decoding():
    # the window counts back from each query's absolute position; the bias joins after the softcap
    _compare(_inputs(2, 1, [8, 5], past=7, bias=(2, HEADS)), local_window_size=3, softcap=2.0)


def test_bidirectional():
    _compare(_inputs(2, 4, [4, 4]), causal=0)
