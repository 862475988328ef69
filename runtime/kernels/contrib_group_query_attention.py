"""com.microsoft GroupQueryAttention: self-attention (causal unless causal=0) where groups of
query heads share one key/value head, with a key/value cache, as ONNX Runtime's decoder exports
(and its transformer optimizer) use it.

Per batch entry b the cache holds T = seqlens_k[b] + 1 tokens after this step; the step's Q =
min(S, T) valid query rows sit at absolute positions P .. P+Q-1 with P = T - Q tokens cached before
them (rows Q .. S-1 are right padding: their output and cache rows are unspecified; here zeros).
The present key/value are the past's first P rows with the step's Q rows after them, in a buffer
of max(total_sequence_length, past length) rows (the past's own length when past and present share
it); a node with neither a past nor present outputs builds no buffer and attends to the step's
K/V. Query head h reads key/value head h // (num_heads / kv_num_heads): the grouping is a reshape
of the query heads, never a copy of the keys. Order of the score terms as ONNX Runtime's CPU kernel
(unlike ONNX's Attention, the bias joins after the softcap): scale · QKᵀ, softcap, +
attention_bias (indexed by absolute key position), causal mask and local window (the window's W
keys end at the query's own position), (smooth) softmax. With do_rotary, Q and K turn by their absolute positions
through the cos/sin caches first (`rotary_embedding.rotate`).

ONNX Runtime 1.32 grew quantized caches, per-head Q/K norms, head sinks, query_seqlens, windowed
cache buffers and a QK output on this op; a node using any of them is refused when the session is
built (UnsupportedOp names which), never run approximately.
"""

from __future__ import annotations

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels import compiled
from runtime.kernels.base import Kernel, UnsupportedOp
from runtime.kernels.rotary_embedding import rotate

MS = "com.microsoft"
# input index -> name, for the inputs this kernel refuses
REFUSED_INPUTS = {
    9: "position_ids",
    11: "head_sink",
    12: "k_scale",
    13: "v_scale",
    14: "q_norm_weight",
    15: "k_norm_weight",
    16: "query_seqlens",
}
# attribute -> the value that means "not used"
REFUSED_ATTRIBUTES = {
    "qk_output": 0,
    "sliding_window_cache": 0,
    "kv_cache_bit_width": 0,
    "k_quant_type": "NONE",
    "v_quant_type": "NONE",
}


class GroupQueryAttention(Kernel):
    op_type = "GroupQueryAttention"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.where = f"com.microsoft GroupQueryAttention '{node.name}'"
        for index, name in REFUSED_INPUTS.items():
            if index < len(node.inputs) and node.inputs[index] is not None and node.inputs[index].name:
                raise UnsupportedOp(f"{self.where}: input {name} is not implemented")
        for name, unused in REFUSED_ATTRIBUTES.items():
            value = self.attr(name, unused)
            if value != unused:
                raise UnsupportedOp(f"{self.where}: attribute {name}={value!r} is not implemented")
        if len(node.outputs) > 3 and node.outputs[3].name:
            raise UnsupportedOp(f"{self.where}: output output_qk is not implemented")
        # present_key/present_value are optional outputs: without them no cache buffer is built
        self.want_present = any(i < len(node.outputs) and bool(node.outputs[i].name) for i in (1, 2))
        self.num_heads = int(self.attr("num_heads", 0))
        self.kv_num_heads = int(self.attr("kv_num_heads", 0))
        if self.num_heads <= 0 or self.kv_num_heads <= 0 or self.num_heads % self.kv_num_heads:
            raise ValueError(
                f"{self.where}: num_heads {self.num_heads} must be a positive multiple of kv_num_heads "
                f"{self.kv_num_heads}"
            )
        self.scale = float(self.attr("scale", 0.0))
        self.softcap = float(self.attr("softcap", 0.0))
        self.causal = bool(self.attr("causal", 1))
        self.window = int(self.attr("local_window_size", -1))
        self.smooth = bool(self.attr("smooth_softmax", 0))
        self.do_rotary = bool(self.attr("do_rotary", 0))
        self.interleaved = bool(self.attr("rotary_interleaved", 0))

    def run(
        self,
        query,
        key=None,
        value=None,
        past_key=None,
        past_value=None,
        seqlens_k=None,
        total_sequence_length=None,
        cos_cache=None,
        sin_cache=None,
        position_ids=None,
        attention_bias=None,
        *_refused,
    ):
        xp = self.xp
        if seqlens_k is None or total_sequence_length is None:
            raise ValueError(f"{self.where}: seqlens_k and total_sequence_length are required")
        heads, kv_heads = self.num_heads, self.kv_num_heads
        batch, length, width = query.shape
        if key is None:  # packed QKV: (B, S, (N + 2·N_kv)·H)
            head_size = width // (heads + 2 * kv_heads)
            query, key, value = (
                query[..., : heads * head_size],
                query[..., heads * head_size : (heads + kv_heads) * head_size],
                query[..., (heads + kv_heads) * head_size :],
            )
        else:
            head_size = width // heads
        if key.shape[1] != length:
            raise ValueError(
                f"{self.where}: key has {key.shape[1]} rows, the query {length}; the new key/value "
                "must cover the query's tokens"
            )
        out_dtype = query.dtype
        if out_dtype != np.float32:  # float16 computes in float32, as ONNX Runtime's CPU kernel does
            query, key, value = (t.astype(np.float32) for t in (query, key, value))
        totals = self.backend.to_host(seqlens_k).astype(np.int64).reshape(-1) + 1  # host: it steers the loop
        if totals.shape != (batch,) or totals.min() < 1:
            raise ValueError(
                f"{self.where}: seqlens_k must be (batch,) = ({batch},) with values >= 0, got {seqlens_k}"
            )
        valid = np.minimum(totals, length)
        pasts = totals - valid
        past_rows = 0 if past_key is None else past_key.shape[2]
        if pasts.max() > past_rows:
            raise ValueError(
                f"{self.where}: seqlens_k says {int(pasts.max())} tokens are cached, the past holds "
                f"{past_rows}"
            )
        capacity = max(int(self.backend.to_host(total_sequence_length).reshape(-1)[0]), past_rows)
        if totals.max() > capacity:
            raise ValueError(
                f"{self.where}: seqlens_k reaches {int(totals.max())} tokens beyond the buffer of {capacity}"
            )

        if self.do_rotary:
            if cos_cache is None or sin_cache is None:
                raise ValueError(f"{self.where}: do_rotary needs cos_cache and sin_cache")
            positions = np.minimum(pasts[:, None] + np.arange(length)[None, :], cos_cache.shape[0] - 1)
            positions = xp.asarray(positions)
            cos, sin = cos_cache[positions].astype(np.float32), sin_cache[positions].astype(np.float32)
            rotary_dim = 2 * cos_cache.shape[1]
            query = rotate(xp, query, cos, sin, heads, rotary_dim, self.interleaved, self.where)
            key = rotate(xp, key, cos, sin, kv_heads, rotary_dim, self.interleaved, self.where)

        k_new = key.reshape(batch, length, kv_heads, head_size).transpose(0, 2, 1, 3)
        v_new = value.reshape(batch, length, kv_heads, head_size).transpose(0, 2, 1, 3)
        keys_are_new = past_key is None and not self.want_present
        if keys_are_new:
            # Nothing cached before and no cache wanted after (a prompt, as GroupQueryAttentionFusion
            # emits it): the step's own K/V rows are the keys, with no buffer to build.
            present_key, present_value = xp.ascontiguousarray(k_new), xp.ascontiguousarray(v_new)
        else:
            present_key = xp.zeros((batch, kv_heads, capacity, head_size), np.float32)
            present_value = xp.zeros_like(present_key)
            if past_key is not None:
                present_key[:, :, :past_rows] = past_key
                present_value[:, :, :past_rows] = past_value
        q_heads = query.reshape(batch, length, kv_heads, heads // kv_heads, head_size).transpose(
            0, 2, 3, 1, 4
        )
        output = xp.zeros((batch, length, heads * head_size), np.float32)
        alpha = self.scale or 1.0 / np.sqrt(head_size)
        # Entries with the same (total, valid rows, past) run as one batched product: in a prompt or
        # a uniform decoding step that is the whole batch at once.
        steps = np.stack([totals, valid, pasts], axis=1)
        uniform = bool((steps == steps[0]).all())
        for total, rows, past in [steps[0].tolist()] if uniform else np.unique(steps, axis=0).tolist():
            chosen = np.flatnonzero((steps == (total, rows, past)).all(axis=1))
            entries = slice(None) if chosen.size == batch else xp.asarray(chosen)
            if not keys_are_new:
                present_key[entries, :, past:total] = k_new[entries, :, :rows]
                present_value[entries, :, past:total] = v_new[entries, :, :rows]
            # (b, N_kv, group, rows, T): each group of query heads against its one key head
            scores = xp.matmul(
                q_heads[entries, :, :, :rows], present_key[entries, :, None, :total].swapaxes(-1, -2)
            )
            scores *= alpha
            if self.softcap > 0:
                scores /= self.softcap
                xp.tanh(scores, out=scores)
                scores *= self.softcap
            count = scores.shape[0]
            scores = scores.reshape(count, heads, rows, total)  # a view: group-major heads are query heads
            # one additive mask (b|1, N|1, rows, T): the bias plus the causal / window cut
            query_at = past + xp.arange(rows)[:, None]
            key_at = xp.arange(total)[None, :]
            allowed = key_at <= query_at if self.causal else xp.ones((rows, total), bool)
            if self.window > 0:
                allowed &= key_at > query_at - self.window
            mask = xp.where(allowed, np.float32(0), np.float32(-np.inf))[None, None]
            if attention_bias is not None:  # (B|1, N|1, S, total_sequence_length)
                bias = attention_bias[
                    entries if attention_bias.shape[0] != 1 else slice(0, 1), :, :rows, :total
                ]
                mask = bias.astype(np.float32) + mask
            if not self.smooth and compiled.accepts(xp, scores, mask):
                compiled.masked_softmax_heads(scores, xp.ascontiguousarray(mask))
            else:
                scores += mask
                top = scores.max(axis=-1, keepdims=True)
                if self.smooth:  # one extra zero logit in the denominator
                    top = xp.maximum(top, 0)
                scores -= top
                xp.exp(scores, out=scores)
                denominator = scores.sum(axis=-1, keepdims=True)
                if self.smooth:
                    denominator += xp.exp(-top)
                scores /= denominator
            scores = scores.reshape(count, kv_heads, heads // kv_heads, rows, total)
            attended = xp.matmul(scores, present_value[entries, :, None, :total])  # (b, N_kv, group, rows, H)
            output[entries, :rows] = (
                attended.reshape(count, heads, rows, head_size)
                .transpose(0, 2, 1, 3)
                .reshape(count, rows, heads * head_size)
            )
        if not self.want_present:
            return (output.astype(out_dtype, copy=False),)
        return tuple(t.astype(out_dtype, copy=False) for t in (output, present_key, present_value))


KERNELS = [GroupQueryAttention]
