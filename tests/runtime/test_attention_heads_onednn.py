"""Attention and MultiHeadAttention reading heads in place on oneDNN (contrib_attention.
_onednn_attend, runtime/kernels/onednn_heads.py): the path a session whose kernel race chose
oneDNN takes. Every case against onnxruntime at fp32 rtol 1e-3 / atol 1e-4, and each asserts the
path was taken, so a case that fell back to copying heads would fail rather than pass unnoticed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from runtime.kernels import compiled, contrib_attention, gemm, libraries, onednn
from tests.runtime.contrib_cases import (
    ATTENTION_PATH_CASES,
    BATCH,
    HEADS,
    HIDDEN,
    KV_SEQ,
    SEQ,
    check,
    masks,
    mha_inputs,
    one_node_model,
    rand,
    run_ours,
)

pytestmark = pytest.mark.skipif(
    not onednn.available(), reason=f"oneDNN is not loadable here: {onednn.unavailable_reason()}"
)
F = TensorProto.FLOAT


@pytest.fixture
def onednn_reads(monkeypatch):
    """Runs the test's kernels as a session that chose oneDNN does; lists each in-place call's q
    shape. These shapes are small, so products of every size go to the libraries here, and no
    Attention takes the one compiled loop (compiled.SMALL_ATTENTION 0)."""
    monkeypatch.setattr(gemm, "SMALL_PRODUCT", 0)
    monkeypatch.setattr(compiled, "SMALL_ATTENTION", 0)
    calls = []
    real = contrib_attention.onednn_attend

    def counted(products, q, *args):
        calls.append(q.shape)
        return real(products, q, *args)

    monkeypatch.setattr(contrib_attention, "onednn_attend", counted)
    with libraries.using({"gemm": "onednn"}):
        yield calls


def _attention_inputs(batch, seq, hidden, dv=None, mask=None, attention_bias=None, bias=True):
    dv = hidden if dv is None else dv
    return {
        "input": rand(batch, seq, hidden),
        "weights": rand(hidden, 2 * hidden + dv, scale=0.5, seed=1),
        "bias": rand(2 * hidden + dv, seed=2) if bias else None,
        "mask_index": mask,
        "past": None,
        "attention_bias": attention_bias,
    }


@pytest.mark.parametrize("case", list(ATTENTION_PATH_CASES))
def test_attention_reads_heads_on_onednn(case, onednn_reads):
    spec = ATTENTION_PATH_CASES[case]
    bias_shape = spec.get("attention_bias")
    inputs = _attention_inputs(
        BATCH, SEQ, HIDDEN, dv=spec.get("dv"), mask=masks()[spec["mask"]], bias=spec.get("bias", True),
        attention_bias=None if bias_shape is None else rand(*bias_shape, seed=3),
    )
    attrs = {"num_heads": HEADS, "unidirectional": spec.get("unidirectional", 0)}
    if "scale" in spec:
        attrs["scale"] = spec["scale"]
    if "dv" in spec:
        attrs["qkv_hidden_sizes"] = [HIDDEN, HIDDEN, spec["dv"]]
    check("Attention", inputs, **attrs)
    assert onednn_reads == [(BATCH, SEQ, HIDDEN)]


def _causal_bias(seq):
    """GPT-2's mask as our fusion hands it over: a (1, 1, S, S) attention_bias of 0 and -inf."""
    return np.where(np.tril(np.ones((seq, seq), bool)), np.float32(0), np.float32(-np.inf)).reshape(1, 1, seq, seq)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(("seq", "hidden", "heads"), [(128, 96, 12), (37, 60, 5), (1, 24, 3)])
@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_attention_at_level_all_shapes_on_onednn(model, seq, hidden, heads, batch, onednn_reads):
    """The node our fusion makes of BERT's and GPT-2's attention: packed weight and bias, scale,
    and a (1, 1, S, S) attention_bias (zeros from BERT's all-ones padding mask, GPT-2's causal
    0 / -inf); odd sequences, head sizes and head counts, one query row, batch 1 and 2."""
    attention_bias = np.zeros((1, 1, seq, seq), np.float32) if model == "bert" else _causal_bias(seq)
    inputs = _attention_inputs(batch, seq, hidden, attention_bias=attention_bias)
    check("Attention", inputs, num_heads=heads, scale=0.3)
    assert onednn_reads == [(batch, seq, hidden)]


def test_attention_on_onednn_meets_each_sequence_length_it_is_given(onednn_reads):
    """One kernel, run at two sequence lengths and back: a primitive per geometry, none reused wrongly."""
    for seq in (SEQ, SEQ + 3, SEQ):
        check("Attention", _attention_inputs(BATCH, seq, HIDDEN, mask=masks(seq=seq)["2d_raw"]), num_heads=HEADS)
    assert onednn_reads == [(BATCH, SEQ, HIDDEN), (BATCH, SEQ + 3, HIDDEN), (BATCH, SEQ, HIDDEN)]


@pytest.mark.parametrize("with_bias", [True, False])
def test_multi_head_attention_reads_heads_on_onednn(with_bias, onednn_reads):
    inputs = mha_inputs("3d", with_bias, mask=masks(seq=KV_SEQ)["2d_raw"], attention_bias=True)
    check("MultiHeadAttention", inputs, num_heads=HEADS)
    assert onednn_reads == [(BATCH, SEQ, HIDDEN)]


def test_multi_head_attention_reads_strided_projections_on_onednn(onednn_reads):
    """Query, key and value as column slices of one wider array (a graph's Split output can be
    such a view): read through their strides, not copied."""
    packed = rand(BATCH, SEQ, 3 * HIDDEN + 8, seed=4)
    inputs = {
        "query": packed[..., :HIDDEN],
        "key": packed[..., HIDDEN : 2 * HIDDEN],
        "value": packed[..., 2 * HIDDEN + 8 :],
    }
    assert not inputs["query"].flags.c_contiguous
    expected = check("MultiHeadAttention", {k: np.ascontiguousarray(v) for k, v in inputs.items()}, num_heads=HEADS)
    model = one_node_model("MultiHeadAttention", inputs, [("Y", F)], num_heads=HEADS)
    np.testing.assert_allclose(run_ours(model, inputs)[0], expected[0], rtol=1e-3, atol=1e-4)
    assert onednn_reads == [(BATCH, SEQ, HIDDEN)] * 2
