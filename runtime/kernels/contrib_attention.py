"""com.microsoft Attention and MultiHeadAttention, as ONNX Runtime's CPU kernels define them.

Where the unfused subgraph runs three MatMuls, three bias Adds, Reshape/Transpose copies, a Div
(or Mul) on the full score tensor, a mask Add, a Softmax into a fresh tensor and a last MatMul,
these run:
  - Q, K and V as ONE matmul against the packed weight (Attention), on MKL's packed SGEMM
    when the weight is a constant and MKL is installed (runtime/kernels/gemm.py);
  - one pass per projection that splits heads into the contiguous layout BLAS needs, adding the
    bias and (for Q) the scale on the way, so neither costs a pass of its own; K and V are
    written straight into `present` when it is asked for;
  - the scale folded into Q (B*S*D multiplies instead of B*N*S*T on the scores);
  - the padding and causal masks merged into one small additive (B, 1, S|1, T) tensor, added in
    place to the scores, and softmax done in place on the scores; on numpy float32 the mask add
    and the softmax are one compiled pass per score row (runtime/kernels/compiled.py);
  - every batched product one BLAS call per head (MKL batch-strided where installed).

On numpy float32 where the session's products run on MKL or oneDNN the heads are never copied
out: both batched products read each head straight out of the (B, L, N*H) projections by their
strides (`head_library` picks the library the session chose for its other products). On MKL
(`mkl_attend`) the scale rides on the first product's alpha and V's bias on the one copy that
is left, the context's merge; on oneDNN (`onednn_attend`, runtime/kernels/onednn_heads.py) the
scale rides on the softmax pass and the second product writes the merged context itself, V's
bias one pass over it. Q's and K's biases are added in place to Attention's own projection in
one compiled pass. attention_bias joins the mask in the softmax pass instead of costing
a pass of its own (BERT exports carry their padding mask that way). `python -m bench.fused_kernels`
times it against the head-copying path (`copied`), which every other case still takes.

On the CUDA backend (runtime/kernels/cuda_fused.py), float32 Attention with a mask_index it reads
raw (none, 1-D, 2-D, 3-D) is the cuBLAS products plus three launches: one splits the heads (bias,
scale, present on the way), one masks and softmaxes the scores, one copy merges the heads; every other case on CUDA,
MultiHeadAttention included, still gets the one-launch masked softmax in `_attend`.

Masks (mask_index / key_padding_mask), as ORT reads them: 1-D (B) key lengths, 1-D (2B) end then
start positions, 2-D (B, T) raw 0/1, 2-D (B|1, 1) a broadcast dummy that masks nothing, 3-D
(B, S, T) raw 0/1, 4-D (B, 1, M, M) Megatron-style (rows past..past+S, columns 0..T of it; ORT's
CPU kernel refuses this one, ours takes it). A padded-out key gets `mask_filter_value` (default
-10000); a future key under `unidirectional` gets the dtype's lowest value, as in ORT.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels import compiled, cuda_fused, gemm, onednn_heads
from runtime.kernels.base import Kernel, ShapeMemo, UnsupportedOp

MS = "com.microsoft"


def _output_wanted(node: ir.Node, index: int) -> bool:
    return index < len(node.outputs) and bool(node.outputs[index].name)


def _split_heads(xp, x, num_heads):
    """(B, L, N*H) -> (B, N, L, H) as a view."""
    batch, length, width = x.shape
    return x.reshape(batch, length, num_heads, width // num_heads).transpose(0, 2, 1, 3)


def _heads_contiguous(xp, x, num_heads, bias=None, scale=None, out=None):
    """(B, L, N*H) (+ bias) (* scale) -> contiguous (B, N, L, H), in one or two passes.

    BLAS needs it: np.matmul on the strided head views of a (B, L, 3D) projection falls back
    to numpy's own loop, some 500x slower at BERT-base shapes. The bias add and the scale ride
    on this copy instead of costing passes of their own.
    """
    view = _split_heads(xp, x, num_heads)
    if out is None:
        out = xp.empty(view.shape, dtype=x.dtype)
    if bias is not None:
        xp.add(view, bias.reshape(num_heads, 1, -1), out=out)
        if scale is not None:
            out *= scale
    elif scale is not None:
        xp.multiply(view, scale, out=out)
    else:
        out[...] = view
    return out


def _merge_heads(x):
    """(B, N, S, H) -> (B, S, N*H); the one copy of the context that can't be avoided."""
    batch, heads, length, head_size = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, length, heads * head_size)


def _softmax_in_place(xp, scores):
    scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _compiled_mask(xp, scores_shape, additive_mask, attention_bias):
    """The one additive (Bm, Nm, Sm, T) mask the compiled softmax adds to the scores: the padding
    and causal mask, attention_bias, or their sum; None when that loop can't take them.

    attention_bias rides in here rather than in a pass of its own over the scores: BERT-style
    exports carry their padding mask as a (B, 1, S, T) attention_bias, so this is the common case.
    """
    if xp is not np:
        return None
    total = scores_shape[3]
    parts = [m for m in (additive_mask, attention_bias) if m is not None]
    parts = [m.reshape((1,) * (4 - m.ndim) + m.shape) if m.ndim < 4 else m for m in parts]
    for part in parts:  # the loop reads each row at [b or 0, n or 0, s or 0]
        broadcasts = all(m in (1, n) for m, n in zip(part.shape[:3], scores_shape[:3], strict=True))
        if part.ndim != 4 or part.shape[3] != total or not broadcasts:
            return None
    if not parts:
        mask = np.zeros((1, 1, 1, total), np.float32)
    else:
        mask = np.ascontiguousarray(parts[0] if len(parts) == 1 else parts[0] + parts[1])
    return mask if compiled.accepts(xp, mask) else None


def head_library(xp, *projections) -> str | None:
    """Which library's products read the heads of these (B, L, N*H) projections in place:
    "onednn" where the session's products against weights run on oneDNN (`onednn_attend`),
    "mkl" where they go to MKL (`mkl_attend`), None where neither (the heads are copied).

    Numpy float32 only, the last axis contiguous and every stride and size within MKL's 32-bit
    integers (oneDNN's are 64-bit; one rule keeps the two paths taking the same inputs). Small
    products (gemm.SMALL_PRODUCT) stay on numpy, whose calls cost less than a library's there.
    """
    batch, seq, width = projections[0].shape if projections[0].ndim == 3 else (0, 0, 0)
    total = projections[1].shape[1] if len(projections) > 1 and projections[1].ndim == 3 else seq
    if batch * seq * total * width <= gemm.SMALL_PRODUCT:
        return None
    readable = (
        xp is np
        and all(
            isinstance(x, np.ndarray)
            and x.dtype == np.float32
            and x.ndim == 3
            and x.size > 0
            and x.strides[2] == 4
            and x.strides[1] % 4 == 0
            and x.strides[0] % 4 == 0
            and x.strides[0] // 4 < gemm.INT_LIMIT
            for x in projections
        )
        and max(x.shape[1] for x in projections) ** 2 < gemm.INT_LIMIT  # a head's (S, T) scores
    )
    if not readable:
        return None
    if gemm.backend_name() == "onednn":
        return "onednn"
    return "mkl" if gemm.mkl_products() else None


def rows_of(x, batch_index, head_step):
    """(address, leading dimension, head step) of batch row `batch_index` of a 3-D or 4-D array."""
    return x.ctypes.data + batch_index * x.strides[0], x.strides[-2] // 4, head_step


def mkl_attend(q, k, v, heads, scale, mask, v_bias=None):
    """softmax(scale q k^T + mask) (v + v_bias) as (B, S, N*Hv), for (B, S, N*H) q and (B, T,
    N*H) k, v read in place (`head_library`); `mask` is `_compiled_mask`'s.

    Per batch row, QK^T is one batch-strided GEMM over the heads with `scale` as its alpha, the
    mask add and softmax one compiled pass over the scores, and PV a second GEMM; the (B, N, S,
    Hv) context then takes the one copy into (B, S, N*Hv) that MKL's batch call can't write,
    and V's bias rides on that copy: every row of softmax weights sums to 1, so P (v + b) is
    P v + b.
    """
    batch, seq, width_q = q.shape
    total, width_v = k.shape[1], v.shape[2]
    head, head_v = width_q // heads, width_v // heads
    scores = np.empty((batch, heads, seq, total), np.float32)
    context = np.empty((batch, heads, seq, head_v), np.float32)
    for b in range(batch):
        q_rows, k_rows = rows_of(q, b, head), rows_of(k, b, head)
        score_rows = rows_of(scores, b, seq * total)
        gemm.batch_strided(heads, seq, total, head, scale, q_rows, k_rows, score_rows, trans_b=True)
    compiled.masked_softmax_heads(scores, mask)
    for b in range(batch):
        score_rows, v_rows = rows_of(scores, b, seq * total), rows_of(v, b, head_v)
        context_rows = rows_of(context, b, seq * head_v)
        gemm.batch_strided(heads, seq, head_v, total, 1.0, score_rows, v_rows, context_rows)
    out = np.empty((batch, seq, width_v), np.float32)
    compiled.merge_heads(context, compiled.NO_BIAS if v_bias is None else v_bias, out)
    return out


def onednn_attend(products, q, k, v, heads, scale, mask, v_bias=None):
    """`mkl_attend` on oneDNN (runtime/kernels/onednn_heads.py): one QK^T call over every batch
    row and head, the scale taken in the softmax pass (oneDNN's matmul has no alpha without a
    scales attribute), and one PV call writing the (B, S, N*Hv) context itself, so nothing is
    merged; V's bias is then one compiled pass over that context (see `mkl_attend` for why
    P (v + b) is P v + b)."""
    batch, seq, _ = q.shape
    total, width_v = k.shape[1], v.shape[2]
    qk, pv = products.get(q, k, v, heads)
    scores = np.empty((batch, heads, seq, total), np.float32)
    out = np.empty((batch, seq, width_v), np.float32)
    qk(q.ctypes.data, k.ctypes.data, scores.ctypes.data)
    compiled.scaled_masked_softmax_heads(scores, np.float32(scale), mask)
    pv(scores.ctypes.data, v.ctypes.data, out.ctypes.data)
    if v_bias is not None:
        compiled.add_bias_columns(out.reshape(-1, width_v), v_bias)
    return out


def _attend_in_place(library, products, q, k, v, heads, scale, mask, v_bias=None):
    """softmax(scale q k^T + mask) (v + v_bias) on the library `head_library` named."""
    if library == "onednn":
        return onednn_attend(products, q, k, v, heads, scale, mask, v_bias)
    return mkl_attend(q, k, v, heads, scale, mask, v_bias)


class _AttentionCore(Kernel):
    """What Attention and MultiHeadAttention share: attributes, masks, and the attend step."""

    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.num_heads = self.attr("num_heads")
        if not self.num_heads or self.num_heads <= 0:
            raise ValueError(f"{self.op_type} '{node.name}': attribute num_heads is required and must be > 0")
        self.unidirectional = bool(self.attr("unidirectional", 0))
        self.scale = float(self.attr("scale", 0.0))  # 0: 1/sqrt(head_size)
        self.mask_filter_value = float(self.attr("mask_filter_value", -10000.0))
        self._head_products = onednn_heads.HeadProductsCache()

    def _what(self, field: str) -> str:
        return f"{self.op_type} '{self.node.name}': {field}"

    def keep_mask(self, mask, batch, seq, past, total):
        """Boolean keep-mask broadcastable to (B, 1, S, T), or None when the mask masks nothing."""
        xp = self.xp
        positions = xp.arange(total)
        if mask.ndim == 1:
            if mask.shape[0] == batch:
                return (positions < mask[:, None]).reshape(batch, 1, 1, total)
            if mask.shape[0] == 2 * batch:
                ends, starts = mask[:batch, None], mask[batch:, None]
                return ((positions < ends) & (positions >= starts)).reshape(batch, 1, 1, total)
            raise ValueError(
                self._what(
                    f"1-D mask has length {mask.shape[0]}; expected batch_size "
                    f"{batch} (key lengths) or 2 * batch_size (end and start positions)"
                )
            )
        if mask.ndim == 2:
            if mask.shape == (batch, total):
                return (mask > 0).reshape(batch, 1, 1, total)
            if mask.shape[1] == 1 and mask.shape[0] in (1, batch):
                return None  # ORT: a (B|1, 1) mask broadcasts one value over the row, i.e. no mask
            raise ValueError(
                self._what(
                    f"2-D mask has shape {mask.shape}; expected (batch_size, "
                    f"total_sequence_length) = ({batch}, {total})"
                )
            )
        if mask.ndim == 3:
            if mask.shape != (batch, seq, total):
                raise ValueError(
                    self._what(
                        f"3-D mask has shape {mask.shape}; expected (batch_size, "
                        f"sequence_length, total_sequence_length) = ({batch}, {seq}, {total})"
                    )
                )
            return (mask > 0)[:, None]
        if mask.ndim == 4:
            if (
                mask.shape[0] != batch
                or mask.shape[1] != 1
                or mask.shape[2] != mask.shape[3]
                or mask.shape[2] < total
            ):
                raise ValueError(
                    self._what(
                        f"4-D mask has shape {mask.shape}; expected (batch_size, 1, "
                        f"max_sequence_length, max_sequence_length) with max >= {total}"
                    )
                )
            return mask[:, :, past : past + seq, :total] > 0
        raise ValueError(self._what(f"mask must be 1-D, 2-D, 3-D or 4-D, got shape {mask.shape}"))

    def _additive_mask(self, mask, batch, seq, past, total, dtype):
        """The merged padding and causal mask as additive (B|1, 1, S|1, T) values, or None.

        As in ORT, a padded-out key gets mask_filter_value, and a future key (unidirectional)
        gets the dtype's lowest value, overriding padding; so a row whose keys are all padded
        still spreads over them, but never onto the future.
        """
        xp = self.xp
        keep = None if mask is None else self.keep_mask(mask, batch, seq, past, total)
        values = None if keep is None else xp.where(keep, dtype.type(0), dtype.type(self.mask_filter_value))
        if self.unidirectional and seq > 1:
            causal = xp.arange(total)[None, :] <= (past + xp.arange(seq))[:, None]  # (S, T)
            visible = dtype.type(0) if values is None else values
            values = xp.where(causal[None, None], visible, np.finfo(dtype).min)
        return None if values is None else values.astype(dtype, copy=False)

    def _attend(self, q, k, v, additive_mask, attention_bias, keep_scores=False):
        """softmax(q k^T + mask + bias) v for (B, N, S, H) views; q arrives already scaled.

        Returns the (B, S, N*Hv) context and, if asked, the pre-softmax scores (ORT's output_qk).
        """
        xp = self.xp
        scores = gemm.product(xp, q, k.transpose(0, 1, 3, 2))  # fresh (B, N, S, T)
        if (
            self.on_cuda
            and not keep_scores
            and cuda_fused.softmax_fits(scores, additive_mask, attention_bias)
        ):
            cuda_fused.masked_softmax(scores, additive_mask, attention_bias)
            return _merge_heads(gemm.product(xp, scores, v)), None
        compiled_mask = None
        if not keep_scores:
            compiled_mask = _compiled_mask(xp, scores.shape, additive_mask, attention_bias)
        if compiled_mask is not None:
            compiled.masked_softmax_heads(scores, compiled_mask)  # adds the mask on the way
            return _merge_heads(gemm.product(xp, scores, v)), None
        if additive_mask is not None:
            scores += additive_mask
        if attention_bias is not None:
            scores += attention_bias  # (B|1, N|1, S, T)
        qk = scores.copy() if keep_scores else None
        _softmax_in_place(xp, scores)
        return _merge_heads(gemm.product(xp, scores, v)), qk


class Attention(_AttentionCore):
    """Self-attention with the Q, K, V projections packed into one weight (D_in, Dq + Dk + Dv).

    past (2, B, N, P, H) and present (2, B, N, P + S, H) are supported; past_sequence_length,
    past_present_share_buffer and do_rotary (decoder-with-cache features) are not.
    """

    op_type = "Attention"

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.qkv_hidden_sizes = self.attr("qkv_hidden_sizes")
        if self.attr("do_rotary", 0):
            raise UnsupportedOp(f"Attention '{node.name}': do_rotary=1 is not implemented")
        if self.attr("past_present_share_buffer", 0):
            raise UnsupportedOp(f"Attention '{node.name}': past_present_share_buffer=1 is not implemented")
        if len(node.inputs) > 6 and node.inputs[6] is not None and node.inputs[6].name:
            raise UnsupportedOp(f"Attention '{node.name}': the past_sequence_length input is not implemented")
        self.want_present = _output_wanted(node, 1)
        self.packed = gemm.pack_constant(node.inputs[1] if len(node.inputs) > 1 else None, self.xp)
        self._zero_bias = ShapeMemo()

    def _hidden_sizes(self, weights):
        total = weights.shape[1]
        if self.qkv_hidden_sizes:
            sizes = [int(s) for s in self.qkv_hidden_sizes]
            if len(sizes) != 3 or sum(sizes) != total or sizes[0] != sizes[1]:
                raise ValueError(
                    self._what(
                        f"qkv_hidden_sizes {sizes} must be 3 sizes, Q equal to K, "
                        f"summing to the weight's {total} columns"
                    )
                )
        elif total % 3:
            raise ValueError(self._what(f"weights has {total} columns, not divisible into Q, K and V"))
        else:
            sizes = [total // 3] * 3
        for size in sizes:
            if size % self.num_heads:
                raise ValueError(
                    self._what(f"hidden size {size} is not divisible by num_heads {self.num_heads}")
                )
        return sizes

    def run(
        self,
        x,
        weights,
        bias=None,
        mask_index=None,
        past=None,
        attention_bias=None,
        past_sequence_length=None,
    ):
        xp = self.xp
        if x.ndim != 3 or weights.ndim != 2 or weights.shape[0] != x.shape[2]:
            raise ValueError(
                self._what(
                    f"input {x.shape} must be (batch, seq, D) and weights "
                    f"{weights.shape} must be (D, Dq + Dk + Dv)"
                )
            )
        # The one projection GEMM, fresh (B, S, Dq + Dk + Dv).
        if gemm.applies(self.packed, x, weights):
            qkv = gemm.matmul_packed(x, self.packed)
        else:
            qkv = gemm.product(xp, x, weights)
        return self.attend_projection(qkv, self._hidden_sizes(weights), bias, mask_index, past, attention_bias)

    def _small(self, qkv, sizes, bias):
        """Whether `compiled.small_attention` takes this: numpy float32, contiguous, and at most
        SMALL_ATTENTION multiply-adds in the two head products."""
        batch, seq, _ = qkv.shape
        dq, _, dv = sizes
        return (
            batch * seq * seq * (dq + dv) <= compiled.SMALL_ATTENTION
            and compiled.accepts(self.xp, qkv)
            and (bias is None or (bias.shape == (qkv.shape[2],) and compiled.accepts(self.xp, bias)))
        )

    def attend_projection(self, qkv, sizes, bias=None, mask_index=None, past=None, attention_bias=None):
        """Everything after the projection, on a fresh (B, S, Dq + Dk + Dv) `qkv` this may add to
        in place; on its own so that bench/attention_micro.py can time it without the GEMM."""
        xp = self.xp
        batch, seq, _ = qkv.shape
        dq, dk, dv = sizes
        heads = self.num_heads
        dtype = qkv.dtype.type
        scale = dtype(self.scale or 1.0 / math.sqrt(dq // heads))
        if self.on_cuda and cuda_fused.attention_fits(
            qkv, bias, mask_index, past, attention_bias, heads, (dq, dk, dv)
        ):
            return cuda_fused.attention(
                qkv, bias, mask_index, past, attention_bias, heads, (dq, dk, dv), scale,
                unidirectional=self.unidirectional, mask_filter_value=self.mask_filter_value,
                want_present=self.want_present,
            )
        # The one compiled loop first: below SMALL_ATTENTION it beats the head products on any
        # library (compiled.SMALL_ATTENTION has the measurements).
        if past is None and not self.want_present and self._small(qkv, sizes, bias):
            mask = self._additive_mask(mask_index, batch, seq, 0, seq, qkv.dtype)
            compiled_mask = _compiled_mask(xp, (batch, heads, seq, seq), mask, attention_bias)
            if compiled_mask is not None:
                out = np.empty((batch, seq, dv), np.float32)
                if bias is None:
                    bias = self._zero_bias.get(qkv.shape[2])
                    if bias is None:  # never written: one per width
                        bias = self._zero_bias.keep(qkv.shape[2], np.zeros(qkv.shape[2], np.float32))
                compiled.small_attention(qkv, bias, dq, dk, heads, scale, compiled_mask, out)
                return (out,)
        library = None if past is not None or self.want_present else head_library(xp, qkv)
        if library is not None and (bias is None or compiled.accepts(xp, qkv, bias)):
            mask = self._additive_mask(mask_index, batch, seq, 0, seq, qkv.dtype)
            compiled_mask = _compiled_mask(xp, (batch, heads, seq, seq), mask, attention_bias)
            if compiled_mask is not None:
                if bias is not None:
                    # Q's and K's biases go in place into our own fresh projection; V's rides on
                    # the merge. (K's only shifts each score row by q.bk, which softmax cancels,
                    # but not in float32 where a padded key's -10000 swamps the scores: ORT adds it.)
                    compiled.add_bias_columns(qkv.reshape(-1, qkv.shape[-1]), bias[: dq + dk])
                q, k, v = qkv[..., :dq], qkv[..., dq : dq + dk], qkv[..., dq + dk :]
                v_bias = None if bias is None else bias[dq + dk :]
                return (_attend_in_place(library, self._head_products, q, k, v, heads, scale, compiled_mask, v_bias),)
        bq, bk, bv = (None, None, None) if bias is None else (bias[:dq], bias[dq : dq + dk], bias[dq + dk :])
        q = _heads_contiguous(xp, qkv[..., :dq], heads, bq, scale)
        past_len = 0
        if past is not None:
            if (
                past.ndim != 5
                or past.shape[0] != 2
                or past.shape[1] != batch
                or past.shape[2] != heads
                or dk != dv
            ):
                raise ValueError(
                    self._what(
                        f"past has shape {past.shape}; expected (2, {batch}, {heads}, "
                        f"past_sequence_length, head_size) with equal K and V sizes"
                    )
                )
            past_len = past.shape[3]
        present = None
        if self.want_present or past is not None:
            if dk != dv:
                raise ValueError(self._what("present needs equal K and V hidden sizes"))
            present = xp.empty((2, batch, heads, past_len + seq, dk // heads), dtype=qkv.dtype)
            if past is not None:
                present[:, :, :, :past_len] = past
            k = _heads_contiguous(xp, qkv[..., dq : dq + dk], heads, bk, out=present[0, :, :, past_len:])
            v = _heads_contiguous(xp, qkv[..., dq + dk :], heads, bv, out=present[1, :, :, past_len:])
            k, v = present[0], present[1]
        else:
            k = _heads_contiguous(xp, qkv[..., dq : dq + dk], heads, bk)
            v = _heads_contiguous(xp, qkv[..., dq + dk :], heads, bv)
        total = past_len + seq
        mask = self._additive_mask(mask_index, batch, seq, past_len, total, qkv.dtype)
        output, _ = self._attend(q, k, v, mask, attention_bias)
        return (output, present) if self.want_present else (output,)


class MultiHeadAttention(_AttentionCore):
    """Attention over separate (already projected) query, key and value.

    Layouts, as ORT's CPU kernel takes them: query (B, S, D); key/value (B, L, D) / (B, L, Dv), or
    (B, N, L, H) already split into heads (bias then applies to the query only), or key as packed
    KV (B, L, N, 2, H) with value omitted. past_key/past_value (B, N, P, H) are concatenated
    before the new keys; present_key/present_value return the result. qk returns the scaled
    scores (mask and attention_bias added) before softmax.
    """

    op_type = "MultiHeadAttention"

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        for index, name in ((8, "past_sequence_length"), (9, "cache_indirection")):
            if len(node.inputs) > index and node.inputs[index] is not None and node.inputs[index].name:
                raise UnsupportedOp(f"MultiHeadAttention '{node.name}': the {name} input is not implemented")
        self.want_present = _output_wanted(node, 1) or _output_wanted(node, 2)
        self.want_qk = _output_wanted(node, 3)

    def _heads(self, x, bias_part, what):
        """A (B, L, D) projection (plus its bias) as contiguous (B, N, L, H); 4-D passes through."""
        xp = self.xp
        if x.ndim == 4:
            if x.shape[1] != self.num_heads:
                raise ValueError(
                    self._what(f"{what} {x.shape} is 4-D but dimension 1 is not num_heads {self.num_heads}")
                )
            return x  # already (B, N, L, H); ORT applies no bias to this layout
        if x.ndim != 3 or x.shape[2] % self.num_heads:
            raise ValueError(
                self._what(
                    f"{what} {x.shape} must be (batch, length, hidden) with hidden "
                    f"divisible by num_heads {self.num_heads}"
                )
            )
        return _heads_contiguous(xp, x, self.num_heads, bias_part)

    def run(
        self,
        query,
        key=None,
        value=None,
        bias=None,
        key_padding_mask=None,
        attention_bias=None,
        past_key=None,
        past_value=None,
        past_sequence_length=None,
        cache_indirection=None,
    ):
        xp = self.xp
        if query.ndim != 3:
            raise ValueError(
                self._what(
                    f"query {query.shape} must be (batch, seq, hidden); packed QKV "
                    f"(5-D query) is not supported by ORT's CPU kernel nor by us"
                )
            )
        if key is None:
            raise ValueError(self._what("key is required (packed QKV in query is not supported)"))
        batch, seq, q_hidden = query.shape
        heads = self.num_heads
        if q_hidden % heads:
            raise ValueError(
                self._what(f"query hidden size {q_hidden} is not divisible by num_heads {heads}")
            )
        head_size = q_hidden // heads
        dtype = query.dtype.type
        scale = dtype(self.scale or 1.0 / math.sqrt(head_size))

        library = None
        if (
            key.ndim == 3
            and value is not None
            and value.ndim == 3
            and key.shape == (batch, key.shape[1], q_hidden)
            and value.shape[:2] == key.shape[:2]
            and value.shape[2] % heads == 0
            and past_key is None
            and past_value is None
            and not (self.want_present or self.want_qk)
            and (bias is None or compiled.accepts(xp, bias))
        ):
            library = head_library(xp, query, key, value)
        if library is not None:
            mask = self._additive_mask(key_padding_mask, batch, seq, 0, key.shape[1], np.dtype(dtype))
            compiled_mask = _compiled_mask(xp, (batch, heads, seq, key.shape[1]), mask, attention_bias)
            if compiled_mask is not None:
                # Fresh sums for the query and key, the inputs not being ours to add to; the
                # value's bias rides on the merge (MKL) or on the context (oneDNN).
                if bias is not None:
                    query, key = query + bias[:q_hidden], key + bias[q_hidden : 2 * q_hidden]
                v_bias = None if bias is None else bias[2 * q_hidden :]
                products = self._head_products
                return (_attend_in_place(library, products, query, key, value, heads, scale, compiled_mask, v_bias),)

        # Q, scaled once here instead of on the (B, N, S, T) scores.
        q = _heads_contiguous(xp, query, heads, None if bias is None else bias[:q_hidden], scale)

        if key.ndim == 5:  # packed KV (B, L, N, 2, H)
            if value is not None or key.shape[2] != heads or key.shape[3] != 2:
                raise ValueError(
                    self._what(
                        f"packed key {key.shape} must be (batch, kv_len, {heads}, 2, "
                        f"head_size) with value omitted"
                    )
                )
            length = key.shape[1]
            k = _heads_contiguous(
                xp,
                key[:, :, :, 0].reshape(batch, length, -1),
                heads,
                None if bias is None else bias[q_hidden : 2 * q_hidden],
            )
            v = _heads_contiguous(
                xp,
                key[:, :, :, 1].reshape(batch, length, -1),
                heads,
                None if bias is None else bias[2 * q_hidden :],
            )
        else:
            if value is None:
                raise ValueError(self._what("value is required unless key is packed KV (5-D)"))
            with_bias = bias is not None and key.ndim == 3
            k = self._heads(key, bias[q_hidden : 2 * q_hidden] if with_bias else None, "key")
            v = self._heads(value, bias[2 * q_hidden :] if with_bias else None, "value")

        past_len = 0
        if past_key is not None or past_value is not None:
            if past_key is None or past_value is None:
                raise ValueError(self._what("past_key and past_value must be given together"))
            past_len = past_key.shape[2]
            k = xp.concatenate([past_key, k], axis=2)
            v = xp.concatenate([past_value, v], axis=2)
        total = k.shape[2]
        mask = self._additive_mask(key_padding_mask, batch, seq, past_len, total, np.dtype(dtype))
        output, qk = self._attend(q, k, v, mask, attention_bias, keep_scores=self.want_qk)
        outputs = [output]
        if self.want_present or self.want_qk:
            outputs += [k if self.want_present else None, v if self.want_present else None, qk]
        return tuple(outputs)


KERNELS = [Attention, MultiHeadAttention]
