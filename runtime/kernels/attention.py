"""ai.onnx Attention (opsets 23, 24, 25): what PyTorch's dynamo exporter emits at opset 23 for
scaled_dot_product_attention.

One kernel covers the three versions: 24 adds the `nonpad_kv_seqlen` input (an external KV cache
whose valid lengths vary per batch), 25 the sliding-window attributes. What each version lacks
is simply absent from its nodes, so the same code reads them all.

Every mask becomes one additive bias broadcastable to the (B, Nq, S, T) scores, built from small
pieces (never a full-size boolean per head): the attention mask (a boolean one as 0/-inf,
right-padded with -inf up to the key length when it is shorter), the bottom-right causal mask,
the window and the per-batch key lengths. A query row whose bias is -inf everywhere attends to
nothing; its probabilities are zero, not NaN, as the spec's fully-masked-row guard says.

Grouped-query heads never copy K or V: Q is viewed as (B, Nkv, G*S, H), so each KV head's G query
heads are one taller product against that head (query head h reads KV head h // G).

Arithmetic follows the spec's order in the input dtype (Q and K each scaled by sqrt(scale),
softcap before the bias, softmax in `softmax_precision` when given); for float16 and bfloat16
that is what the expected values are computed with, and for float32 it costs one extra pass over
K, small beside the two products.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels import gemm
from runtime.kernels.base import Kernel, UnsupportedOp


def _output_wanted(node: ir.Node, index: int) -> bool:
    return index < len(node.outputs) and bool(node.outputs[index].name)


class Attention(Kernel):
    op_type = "Attention"
    since_version = 23

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.is_causal = bool(self.attr("is_causal", 0))
        self.q_num_heads = self.attr("q_num_heads")
        self.kv_num_heads = self.attr("kv_num_heads")
        self.scale = self.attr("scale")
        self.softcap = float(self.attr("softcap", 0.0))
        self.mode = int(self.attr("qk_matmul_output_mode", 0))
        if self.mode not in (0, 1, 2, 3):
            raise UnsupportedOp(f"Attention '{node.name}': qk_matmul_output_mode {self.mode} is not 0-3")
        precision = self.attr("softmax_precision")
        self.softmax_dtype = None if precision is None else ir.DataType(precision).numpy()
        self.left_window = int(self.attr("left_window_size", -1))
        self.right_window = int(self.attr("right_window_size", -1))
        if self.left_window < -1 or self.right_window < -1:
            raise UnsupportedOp(f"Attention '{node.name}': window sizes must be -1 or nonnegative")
        self.want_present = _output_wanted(node, 1) or _output_wanted(node, 2)
        self.want_qk = _output_wanted(node, 3)

    def run(self, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        xp = self.xp
        if (past_key is None) != (past_value is None):
            raise ValueError(f"Attention '{self.node.name}': past_key and past_value come together")
        if past_key is not None and nonpad_kv_seqlen is not None:
            raise ValueError(
                f"Attention '{self.node.name}': nonpad_kv_seqlen cannot be used with a past cache"
            )
        three_d = q.ndim == 3
        if three_d:
            if self.q_num_heads is None or self.kv_num_heads is None:
                raise ValueError(
                    f"Attention '{self.node.name}': 3-D inputs need q_num_heads and kv_num_heads"
                )
            q = _split_heads(q, self.q_num_heads)
            k = _split_heads(k, self.kv_num_heads)
            v = _split_heads(v, self.kv_num_heads)
        dtype = q.dtype
        if past_key is not None:
            k = xp.concatenate((past_key, k), axis=2)
            v = xp.concatenate((past_value, v), axis=2)
        present_key, present_value = k, v
        batch, q_heads, length, head_size = q.shape
        kv_heads, total = k.shape[1], k.shape[2]
        if q_heads % kv_heads:
            raise ValueError(f"Attention '{self.node.name}': {q_heads} query heads for {kv_heads} KV heads")
        group = q_heads // kv_heads

        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(head_size)
        root = dtype.type(math.sqrt(scale))
        q_scaled = (q * root).astype(dtype, copy=False)
        k_scaled = (k * root).astype(dtype, copy=False)
        # (B, Nkv, G*S, H) @ (B, Nkv, H, T): each KV head's query group as one product.
        grouped = q_scaled.reshape(batch, kv_heads, group * length, head_size)
        scores = _matmul(xp, grouped, k_scaled.transpose(0, 1, 3, 2), dtype)
        scores = scores.reshape(batch, q_heads, length, total)
        raw = scores
        if self.softcap > 0:
            cap = dtype.type(self.softcap)
            scores = (xp.tanh((scores / cap).astype(dtype, copy=False)) * cap).astype(dtype, copy=False)
        qk_out = raw if self.mode == 0 else scores

        offset = self._causal_offset(xp, past_key, nonpad_kv_seqlen, length)
        bias = self._bias(xp, attn_mask, nonpad_kv_seqlen, offset, length, total, dtype)
        if bias is not None:
            scores = (scores + bias).astype(dtype, copy=False)
        if self.mode == 2:
            qk_out = scores
        probabilities = _softmax(
            xp, scores if self.softmax_dtype is None else scores.astype(self.softmax_dtype)
        )
        if bias is not None:
            # Rows with no key to attend: zero, decided on the bias (the scores may be NaN there).
            masked_out = xp.isneginf(bias.max(axis=-1, keepdims=True))
            if masked_out.any():
                probabilities = xp.where(masked_out, probabilities.dtype.type(0), probabilities)
        probabilities = probabilities.astype(dtype, copy=False)
        if self.mode == 3:
            qk_out = probabilities
        grouped_p = probabilities.reshape(batch, kv_heads, group * length, total)
        y = _matmul(xp, grouped_p, v, dtype).reshape(batch, q_heads, length, v.shape[3])
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(batch, length, q_heads * v.shape[3])
        outputs = [xp.ascontiguousarray(y)]
        if self.want_present or self.want_qk:
            outputs += [present_key, present_value]
        if self.want_qk:
            outputs.append(qk_out)
        return tuple(outputs)

    def _causal_offset(self, xp, past_key, nonpad_kv_seqlen, length):
        """Keys that precede the query block: the past length, per-batch valid keys minus S, or 0."""
        if past_key is not None:
            return past_key.shape[2]
        if nonpad_kv_seqlen is not None:
            return nonpad_kv_seqlen.reshape(-1, 1, 1, 1).astype(np.int64) - length
        return 0

    def _bias(self, xp, attn_mask, nonpad_kv_seqlen, offset, length, total, dtype):
        """The additive bias broadcastable to (B, Nq, S, T), or None when nothing is masked."""
        minus_inf = dtype.type(-np.inf)
        bias = None
        if attn_mask is not None:
            pad = total - attn_mask.shape[-1]
            if pad > 0:
                widths = [(0, 0)] * (attn_mask.ndim - 1) + [(0, pad)]
                attn_mask = xp.pad(
                    attn_mask, widths, constant_values=False if attn_mask.dtype == bool else -np.inf
                )
            if attn_mask.dtype == bool:
                bias = xp.where(attn_mask, dtype.type(0), minus_inf)
            else:
                bias = attn_mask.astype(dtype, copy=False)
        query = xp.arange(length).reshape(length, 1)
        key = xp.arange(total).reshape(1, total)
        # distance from each query's absolute position back to each key; (S, T) or (B, 1, S, T)
        windowed = self.is_causal or self.left_window >= 0 or self.right_window >= 0
        distance = query + offset - key if windowed else None
        allowed = None
        if self.is_causal:
            allowed = distance >= 0
        if self.left_window >= 0:
            allowed = _both(allowed, distance <= self.left_window)
        if self.right_window >= 0:
            allowed = _both(allowed, -distance <= self.right_window)
        if nonpad_kv_seqlen is not None:
            valid = key < nonpad_kv_seqlen.reshape(-1, 1, 1, 1)  # (B, 1, 1, T)
            allowed = _both(allowed, valid)
        if allowed is not None:
            structural = xp.where(allowed, dtype.type(0), minus_inf)
            bias = structural if bias is None else (bias + structural).astype(dtype, copy=False)
        return bias


def _both(allowed, condition):
    return condition if allowed is None else allowed & condition


def _split_heads(x, heads):
    """(B, L, N*H) -> (B, N, L, H), a view."""
    batch, length, width = x.shape
    return x.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)


def _matmul(xp, a, b, dtype):
    """a @ b in T1. float32 goes through gemm.product, the BLAS the session's other products use
    (MKL where installed), so no second library's workers spin beside them; numpy promotes
    bfloat16 products to float32, so the result is cast back."""
    if dtype == np.float32 or (dtype == np.float16 and a.dtype == b.dtype == np.float16):
        return gemm.product(xp, a, b)
    return xp.matmul(a, b).astype(dtype, copy=False)


def _softmax(xp, x):
    """Softmax over the last axis; an all -inf row gives zeros (the caller's guard decides which
    rows are masked out, this only keeps them from producing NaN on the way)."""
    peak = x.max(axis=-1, keepdims=True)
    peak = xp.where(xp.isneginf(peak), x.dtype.type(0), peak)
    e = xp.exp((x - peak).astype(x.dtype, copy=False)).astype(x.dtype, copy=False)
    total = e.sum(axis=-1, keepdims=True)
    total = xp.where(total == 0, x.dtype.type(1), total)
    return (e / total).astype(x.dtype, copy=False)


KERNELS = [Attention]
