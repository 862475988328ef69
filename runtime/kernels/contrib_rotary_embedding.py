"""com.microsoft RotaryEmbedding: the rotary embedding ONNX Runtime's transformer optimizer fuses into.

The rotation is the opset-23 op's (`rotary_embedding.rotate`); what differs is the contract:
inputs are (input, position_ids, cos_cache, sin_cache) with position_ids required, either one
start offset (a scalar or 1-element tensor: positions start, start+1, ... along the sequence)
or one position per token (B, S); the caches are always 2-D (max_position, D/2). With
`rotary_embedding_dim` 0 the head size of a 3-D input comes from the cache (2 * D/2) and
num_heads from the hidden size, as ONNX Runtime infers them. `scale` only matters to kernels
that rebuild the caches for sequences longer than them, which this one (like ONNX Runtime's
CPU kernel) refuses instead.
"""

from __future__ import annotations

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel
from runtime.kernels.rotary_embedding import rotate

MS = "com.microsoft"


class RotaryEmbedding(Kernel):
    op_type = "RotaryEmbedding"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.interleaved = bool(self.attr("interleaved", 0))
        self.rotary_dim = int(self.attr("rotary_embedding_dim", 0))
        self.num_heads = int(self.attr("num_heads", 0))
        self.where = f"com.microsoft RotaryEmbedding '{node.name}'"
        if self.rotary_dim and not self.num_heads:
            raise ValueError(f"{self.where}: rotary_embedding_dim needs num_heads")

    def run(self, x, position_ids, cos_cache, sin_cache):
        xp = self.xp
        if cos_cache.ndim != 2 or cos_cache.shape != sin_cache.shape:
            raise ValueError(
                f"{self.where}: cos_cache and sin_cache must both be (max_position, D/2), got "
                f"{cos_cache.shape} and {sin_cache.shape}"
            )
        length = x.shape[2] if x.ndim == 4 else x.shape[1]
        if position_ids.size == 1:  # one start offset: positions run on from it along the sequence
            positions = int(position_ids.reshape(-1)[0]) + xp.arange(length)[None, :]
        elif position_ids.ndim == 2 and position_ids.shape == (x.shape[0], length):
            positions = position_ids
        else:
            raise ValueError(
                f"{self.where}: position_ids must be one start offset or (batch, sequence) = "
                f"{(x.shape[0], length)}, got shape {position_ids.shape}"
            )
        max_position = cos_cache.shape[0]
        if positions.size and (int(positions.min()) < 0 or int(positions.max()) >= max_position):
            raise ValueError(
                f"{self.where}: positions {int(positions.min())}..{int(positions.max())} fall outside "
                f"the cos/sin caches' {max_position} rows"
            )
        num_heads = self.num_heads
        if x.ndim == 3 and not num_heads:  # the cache says the head size; ONNX Runtime infers N from it
            num_heads = x.shape[2] // (2 * cos_cache.shape[1])
        cos, sin = xp.take(cos_cache, positions, axis=0), xp.take(sin_cache, positions, axis=0)
        return (rotate(xp, x, cos, sin, num_heads, self.rotary_dim, self.interleaved, self.where),)


KERNELS = [RotaryEmbedding]
