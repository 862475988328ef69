"""com.microsoft RotaryEmbedding against onnxruntime running the same one-node model.

Covers both rotation layouts, a partial rotary dimension, 3-D (B, S, N*H) and 4-D (B, N, S, H)
input, and both position_ids forms (one start offset; one position per token).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.contrib_cases import check, one_node_model, rand, run_ours

RNG = np.random.default_rng(7)


def _caches(max_position, half):
    angles = RNG.uniform(0, 6, (max_position, half)).astype(np.float32)
    return np.cos(angles), np.sin(angles)


def _inputs(x, positions, cos, sin):
    return {"X": x, "position_ids": positions, "cos_cache": cos, "sin_cache": sin}


@pytest.mark.parametrize("interleaved", [0, 1], ids=["halves", "interleaved"])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("positions", ["offset", "scalar", "per_token"])
@pytest.mark.parametrize("rotary_dim", [0, 8], ids=["whole_head", "partial"])
def test_rotary_embedding(interleaved, layout, positions, rotary_dim):
    batch, heads, length, head_size = 2, 3, 5, 16
    x = rand(batch, length, heads * head_size) if layout == "3d" else rand(batch, heads, length, head_size)
    cos, sin = _caches(12, (rotary_dim or head_size) // 2)
    position_ids = {
        "offset": np.array([4], np.int64),
        "scalar": np.array(6, np.int64),
        "per_token": RNG.integers(0, 12, (batch, length)).astype(np.int64),
    }[positions]
    attrs = {"interleaved": interleaved}
    if rotary_dim:
        attrs |= {"rotary_embedding_dim": rotary_dim, "num_heads": heads}
    check("RotaryEmbedding", _inputs(x, position_ids, cos, sin), **attrs)


def test_rotary_embedding_3d_infers_heads_from_the_cache():
    # Without num_heads a 3-D input's head size is twice the cache width, as ONNX Runtime reads it.
    x, (cos, sin) = rand(1, 4, 32), _caches(8, 4)
    check("RotaryEmbedding", _inputs(x, np.array([0], np.int64), cos, sin))


def test_rotary_embedding_rejects_positions_past_the_cache():
    x, (cos, sin) = rand(1, 4, 32), _caches(8, 4)
    inputs = _inputs(x, np.array([6], np.int64), cos, sin)
    model = one_node_model("RotaryEmbedding", inputs, [("Y", 1)])
    with pytest.raises(ValueError, match="positions 6..9 fall outside the cos/sin caches' 8 rows"):
        run_ours(model, inputs)


def test_rotary_embedding_rejects_a_rotary_dim_without_heads():
    x, (cos, sin) = rand(1, 4, 32), _caches(8, 2)
    inputs = _inputs(x, np.array([0], np.int64), cos, sin)
    model = one_node_model("RotaryEmbedding", inputs, [("Y", 1)], rotary_embedding_dim=4)
    with pytest.raises(ValueError, match="rotary_embedding_dim needs num_heads"):
        run_ours(model, inputs)
