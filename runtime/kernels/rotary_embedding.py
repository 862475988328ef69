"""ai.onnx RotaryEmbedding (opset 23): rotates pairs of each head's features by a position's angle.

The pairs are the two halves of the rotated part (GPT-NeoX/Llama layout) or neighbouring
features (`interleaved`, GPT-J layout); only the first `rotary_embedding_dim` features rotate,
the rest pass through. Input is (B, N, S, H) or (B, S, N*H) with `num_heads`; the cos and sin
caches are (S, D/2) or, gathered by `position_ids`, (max_position, D/2) -> (B, S, D/2).

The output is written once into a fresh array: the rotated halves straight into their slots
of it, and the untouched tail copied, instead of the concatenations the formula reads as.
`rotate` is shared with com.microsoft's RotaryEmbedding (contrib_rotary_embedding.py), which
differs only in its input order, its position_ids forms and how it infers the head size.
"""

from __future__ import annotations

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel


def rotate(xp, x, cos, sin, num_heads: int, rotary_dim: int, interleaved: bool, where: str):
    """Rotate `x` (B, N, S, H) or (B, S, N*H) by `cos`/`sin` (B|1, S, D/2), each already at its position.

    `rotary_dim` 0 rotates the whole head; `where` names the node in errors.
    """
    if x.ndim == 3:
        if not num_heads:
            raise ValueError(f"{where}: a 3-D input needs num_heads")
        batch, length, width = x.shape
        if width % num_heads:
            raise ValueError(f"{where}: hidden size {width} is not a multiple of num_heads {num_heads}")
        heads = x.reshape(batch, length, num_heads, width // num_heads)  # (B, S, N, H)
    elif x.ndim == 4:
        heads = x.transpose(0, 2, 1, 3)  # (B, S, N, H) view of (B, N, S, H)
    else:
        raise ValueError(f"{where}: input must be 3-D (B, S, N*H) or 4-D (B, N, S, H), got shape {x.shape}")
    head_size = heads.shape[3]
    dim = rotary_dim or head_size
    if dim > head_size or dim % 2:
        raise ValueError(
            f"{where}: rotary_embedding_dim {dim} must be even and at most the head size {head_size}"
        )
    half = dim // 2
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ValueError(f"{where}: caches' last axis {cos.shape[-1]} is not rotary_embedding_dim/2 = {half}")
    cos = cos[..., None, :]  # broadcast over heads: (B|1, S, 1, D/2)
    sin = sin[..., None, :]
    if interleaved:
        x1, x2 = heads[..., 0:dim:2], heads[..., 1:dim:2]
    else:
        x1, x2 = heads[..., :half], heads[..., half:dim]
    out = xp.empty(heads.shape, dtype=x.dtype)
    real = out[..., 0:dim:2] if interleaved else out[..., :half]
    imag = out[..., 1:dim:2] if interleaved else out[..., half:dim]
    real[...] = cos * x1 - sin * x2
    imag[...] = sin * x1 + cos * x2
    out[..., dim:] = heads[..., dim:]
    if x.ndim == 3:
        return out.reshape(x.shape)
    return xp.ascontiguousarray(out.transpose(0, 2, 1, 3))


class RotaryEmbedding(Kernel):
    op_type = "RotaryEmbedding"
    since_version = 23

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.interleaved = bool(self.attr("interleaved", 0))
        self.rotary_dim = int(self.attr("rotary_embedding_dim", 0))
        self.num_heads = int(self.attr("num_heads", 0))

    def run(self, x, cos_cache, sin_cache, position_ids=None):
        if position_ids is not None:
            cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
        where = f"RotaryEmbedding '{self.node.name}'"
        out = rotate(
            self.xp, x, cos_cache, sin_cache, self.num_heads, self.rotary_dim, self.interleaved, where
        )
        return (out,)


KERNELS = [RotaryEmbedding]
