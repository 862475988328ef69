"""ai.onnx Attention (23-25) and RotaryEmbedding (23) against ONNX's node cases and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import attention, rotary_embedding
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test, one_node_model, run_kernel

test_node_case = node_case_test(attention.KERNELS + rotary_embedding.KERNELS)

RNG = np.random.default_rng(0)
F32 = np.float32


def _normal(*shape):
    return RNG.standard_normal(shape).astype(F32)


@pytest.mark.parametrize("causal", [0, 1], ids=["full", "causal"])
def test_attention_4d_grouped_heads_with_past_matches_onnxruntime(causal):
    # 8 query heads over 2 KV heads (each KV head read by 4 query heads, never copied), a cache of 5.
    q, k, v = _normal(2, 8, 7, 16), _normal(2, 2, 7, 16), _normal(2, 2, 7, 16)
    past_k, past_v = _normal(2, 2, 5, 16), _normal(2, 2, 5, 16)
    assert_same_as_onnxruntime(
        "Attention", [q, k, v, None, past_k, past_v], opset=23, outputs=3, is_causal=causal
    )


def test_attention_3d_with_boolean_padding_mask_matches_onnxruntime():
    # BERT-style: (B, S, N*H) inputs and a (B, 1, S, T) boolean padding mask (onnxruntime wants
    # the query axis spelled out).
    q, k, v = _normal(2, 12, 64), _normal(2, 12, 64), _normal(2, 12, 64)
    mask = np.ones((2, 1, 12, 12), bool)
    mask[1, ..., 9:] = False
    assert_same_as_onnxruntime("Attention", [q, k, v, mask], opset=23, q_num_heads=4, kv_num_heads=4)


def test_attention_softcap_float_mask_and_every_output_mode():
    q, k, v, mask = _normal(1, 2, 3, 8), _normal(1, 2, 4, 8), _normal(1, 2, 4, 8), _normal(3, 4)
    outputs = {}
    for mode in range(4):
        model = one_node_model("Attention", [q, k, v, mask], 23, 4, softcap=2.0, qk_matmul_output_mode=mode)
        outputs[mode] = run_kernel(model, [q, k, v, mask])[3]
    raw = np.einsum("bnsh,bnth->bnst", q, k) / np.sqrt(8)
    capped = 2.0 * np.tanh(raw / 2.0)
    np.testing.assert_allclose(outputs[0], raw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs[1], capped, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs[2], capped + mask, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs[3].sum(-1), 1.0, rtol=1e-5)


def test_attention_row_with_no_key_is_zero_not_nan():
    q, k, v = _normal(1, 1, 2, 4), _normal(1, 1, 3, 4), _normal(1, 1, 3, 4)
    mask = np.array([[True, True, False], [False, False, False]])
    [y] = run_kernel(one_node_model("Attention", [q, k, v, mask], 23), [q, k, v, mask])
    assert np.isfinite(y).all() and not y[0, 0, 1].any()


@pytest.mark.parametrize("interleaved", [0, 1], ids=["halves", "interleaved"])
def test_rotary_embedding_partial_with_position_ids_matches_onnxruntime(interleaved):
    x = _normal(2, 4, 6, 16)  # (B, N, S, H); the first 8 features rotate
    angles = RNG.uniform(0, 3, (20, 4)).astype(F32)
    positions = RNG.integers(0, 20, (2, 6)).astype(np.int64)
    assert_same_as_onnxruntime(
        "RotaryEmbedding",
        [x, np.cos(angles), np.sin(angles), positions],
        opset=23,
        interleaved=interleaved,
        rotary_embedding_dim=8,
    )
