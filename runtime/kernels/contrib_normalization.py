"""Fused normalization kernels: SkipLayerNormalization, SkipSimplifiedLayerNormalization,
EmbedLayerNormalization (com.microsoft) and SimplifiedLayerNormalization (which ONNX Runtime
registers in the ONNX domain, since version 1).

Each forms its sum once, into one fresh buffer, and normalizes that buffer in place; the chain it
replaces (Add, Add, ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) allocates a
full-size tensor at nearly every step. Row statistics are batched vector dots through matmul
(`rows @ rows`), which reads the row once and writes one number, where `(x * x).mean(-1)` would
write a full-size square first. On numpy float32 with contiguous inputs, SkipLayerNormalization
and SkipSimplifiedLayerNormalization go further: one compiled loop (runtime/kernels/compiled.py)
does sum, statistics and scaling row by row while the row is in L1. On the CUDA backend, float32
SkipLayerNormalization, SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization and
EmbedLayerNormalization are one launch each (runtime/kernels/cuda_fused.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels import compiled, cuda_fused
from runtime.kernels.base import Kernel, ShapeMemo, UnsupportedOp

MS = "com.microsoft"


def _output_wanted(node: ir.Node, index: int) -> bool:
    """Whether an optional output is present: ONNX omits one by giving it an empty name."""
    return index < len(node.outputs) and bool(node.outputs[index].name)


def _row_sum_of_squares(xp, rows):
    """sum(rows**2, axis=-1, keepdims=True) without a full-size temporary."""
    return xp.matmul(rows[..., None, :], rows[..., :, None])[..., 0]


def layer_norm_in_place(xp, rows, epsilon):
    """Normalize `rows` (..., H) in place over the last axis; returns (mean, inv_std), each (..., 1)."""
    width = rows.shape[-1]
    mean = rows.sum(axis=-1, keepdims=True)
    mean /= width
    rows -= mean
    inv_std = _row_sum_of_squares(xp, rows)
    inv_std /= width
    inv_std += epsilon
    xp.sqrt(inv_std, out=inv_std)
    xp.reciprocal(inv_std, out=inv_std)
    rows *= inv_std
    return mean, inv_std


def rms_norm_in_place(xp, rows, epsilon):
    """Scale `rows` (..., H) in place by 1 / sqrt(mean(rows**2) + eps); returns inv_std (..., 1)."""
    inv_std = _row_sum_of_squares(xp, rows)
    inv_std /= rows.shape[-1]
    inv_std += epsilon
    xp.sqrt(inv_std, out=inv_std)
    xp.reciprocal(inv_std, out=inv_std)
    rows *= inv_std
    return inv_std


class _SkipNormalization(Kernel):
    """input + skip (+ bias), normalized; optional outputs mean, inv_std_var, and the sum itself."""

    domain = MS
    since_version = 1
    centered = True  # LayerNorm subtracts the mean; the simplified (RMS) variant doesn't

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.epsilon = float(self.attr("epsilon", 1e-12))
        self.want_mean = _output_wanted(node, 1)
        self.want_inv_std = _output_wanted(node, 2)
        self.want_sum = _output_wanted(node, 3)
        self._zeros = ShapeMemo()  # an absent beta or bias adds nothing: one zero row per width

    def _normalize(self, x, skip, gamma, beta, bias):
        xp = self.xp
        if x.ndim != 3:
            raise ValueError(
                f"{self.op_type} '{self.node.name}': input must be 3-D (batch, seq, hidden), "
                f"got shape {x.shape}"
            )
        if self._compiled_fits(x, skip, gamma, beta, bias):
            return self._normalize_compiled(x, skip, gamma, beta, bias)
        if self.on_cuda and cuda_fused.skip_norm_fits(x, skip, gamma, beta, bias):
            return cuda_fused.skip_layer_norm(
                x, skip, gamma, beta, bias, self.epsilon, self.centered,
                self.want_mean or self.want_inv_std, self.want_sum,
            )
        if x.dtype not in (np.float32, np.float64):
            return self._normalize_in_float32(x, skip, gamma, beta, bias)
        total = xp.add(x, skip)  # skip may be (B, S, H), (1, S, H) or (S, H): numpy broadcasting
        if total.shape != x.shape:
            raise ValueError(
                f"{self.op_type} '{self.node.name}': skip {skip.shape} does not broadcast to input {x.shape}"
            )
        if bias is not None:
            total += bias
        summed = total.copy() if self.want_sum else None  # the sum is an output; normalize a copy
        if self.centered:
            mean, inv_std = layer_norm_in_place(xp, total, self.epsilon)
        else:
            inv_std = rms_norm_in_place(xp, total, self.epsilon)
            # ORT's simplified kernel never computes a mean; it leaves the optional output zeroed.
            mean = xp.zeros_like(inv_std)
        total *= gamma
        if beta is not None:
            total += beta
        outputs = [total]
        if self.want_mean or self.want_inv_std or self.want_sum:
            outputs += [mean.astype(np.float32, copy=False), inv_std.astype(np.float32, copy=False), summed]
        return tuple(outputs)

    def _normalize_in_float32(self, x, skip, gamma, beta, bias):
        """float16 (or bfloat16) data: sum, statistics and scaling in float32, the output and the
        sum rounded back once, as ONNX Runtime's CPU and CUDA kernels do. Summed and normalized
        in half precision, a 768-wide row loses about three significant digits of its variance."""
        wide = [None if a is None else a.astype(np.float32) for a in (x, skip, gamma, beta, bias)]
        outputs = self._normalize(*wide)
        output, *stats = outputs
        if not stats:
            return (output.astype(x.dtype),)
        mean, inv_std, summed = stats
        return output.astype(x.dtype), mean, inv_std, None if summed is None else summed.astype(x.dtype)

    def _compiled_fits(self, x, skip, gamma, beta, bias):
        """float32 numpy, contiguous, skip (B, S, H), (1, S, H) or (S, H), 1-D gamma/beta/bias."""
        width = (x.shape[-1],)
        if gamma.shape != width or beta is not None and beta.shape != width or bias is not None and bias.shape != width:
            return False
        if skip.shape != x.shape and skip.shape not in ((1, *x.shape[1:]), x.shape[1:]):
            return False
        params = [p for p in (gamma, beta, bias) if p is not None]
        return compiled.accepts(self.xp, x, skip, *params)

    def _normalize_compiled(self, x, skip, gamma, beta, bias):
        batch, seq, width = x.shape
        zeros = self._zeros.get(width)
        if zeros is None:
            zeros = self._zeros.keep(width, np.zeros(width, np.float32))  # read, never written
        out = np.empty_like(x)
        # Without the sum as an output, one scratch row, not `out`: aliased, the loop runs scalar.
        summed = np.empty_like(x) if self.want_sum else np.empty((1, width), np.float32)
        mean = np.empty((batch, seq, 1), np.float32)
        inv_std = np.empty((batch, seq, 1), np.float32)
        compiled.skip_layer_norm_rows(
            x.reshape(-1, width),
            skip.reshape(-1, width),
            zeros if bias is None else bias,
            gamma,
            zeros if beta is None else beta,
            np.float32(self.epsilon),
            self.centered,
            out.reshape(-1, width),
            summed.reshape(-1, width),
            mean.reshape(-1),
            inv_std.reshape(-1),
        )
        if self.want_mean or self.want_inv_std or self.want_sum:
            return out, mean, inv_std, summed if self.want_sum else None
        return (out,)


class SkipLayerNormalization(_SkipNormalization):
    op_type = "SkipLayerNormalization"

    def run(self, x, skip, gamma, beta=None, bias=None):
        return self._normalize(x, skip, gamma, beta, bias)


class SkipSimplifiedLayerNormalization(_SkipNormalization):
    op_type = "SkipSimplifiedLayerNormalization"
    centered = False

    def run(self, x, skip, gamma, bias=None):
        return self._normalize(x, skip, gamma, None, bias)


class SimplifiedLayerNormalization(Kernel):
    """RMSNorm over axes [axis, rank): Y = X / sqrt(mean(X^2) + eps) * scale (ONNX domain, ORT's)."""

    op_type = "SimplifiedLayerNormalization"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = int(self.attr("axis", -1))
        self.epsilon = float(self.attr("epsilon", 1e-5))
        stash_type = int(self.attr("stash_type", 1))
        if stash_type != 1:
            raise UnsupportedOp(
                f"SimplifiedLayerNormalization '{node.name}': stash_type {stash_type} "
                f"(only 1, float32 statistics, is implemented)"
            )
        self.want_inv_std = _output_wanted(node, 1)

    def run(self, x, scale):
        xp = self.xp
        if self.on_cuda and cuda_fused.rms_norm_fits(x, scale, self.axis):
            y, inv_std = cuda_fused.rms_norm(x, scale, self.axis, self.epsilon)
            return (y, inv_std) if self.want_inv_std else (y,)
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        lead = x.shape[:axis]
        rows = x.astype(np.float32, copy=True).reshape(*lead, -1)  # fresh: normalized in place
        inv_std = rms_norm_in_place(xp, rows, self.epsilon)
        y = rows.reshape(x.shape)
        y *= scale
        y = y.astype(x.dtype, copy=False)
        if not self.want_inv_std:
            return (y,)
        return y, inv_std.reshape(*lead, *([1] * (x.ndim - axis)))


class EmbedLayerNormalization(Kernel):
    """word[input_ids] + position[position_ids or 0..S-1] (+ segment[segment_ids]), layer-normalized.

    Outputs: the normalized embedding, mask_index (per-batch count of mask ones, int32; zeros
    without a mask, as ORT's CPU kernel gives), and optionally the sum before normalization.
    """

    op_type = "EmbedLayerNormalization"
    domain = MS
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.epsilon = float(self.attr("epsilon", 1e-12))
        self.want_mask_index = _output_wanted(node, 1)
        self.want_sum = _output_wanted(node, 2)
        self._zeros = ShapeMemo()

    def _lookup(self, table, ids, what):
        if ids.size:
            if isinstance(ids, np.ndarray) and ids.dtype.kind == "i":
                # One reduction: read as unsigned, a negative id is larger than any row count. The
                # ufunc's own reduce, as ids.max() costs a few µs of Python wrappers.
                if np.maximum.reduce(ids.view(f"u{ids.itemsize}"), axis=None) < table.shape[0]:
                    return table.take(ids, axis=0)
            low, high = ids.min(), ids.max()
            if low < 0 or high >= table.shape[0]:
                raise ValueError(
                    f"EmbedLayerNormalization '{self.node.name}': {what} out of range "
                    f"[0, {table.shape[0]}) (min {int(low)}, max {int(high)})"
                )
        return table.take(ids, axis=0)

    def run(
        self,
        input_ids,
        segment_ids,
        word_embedding,
        position_embedding,
        segment_embedding,
        gamma,
        beta,
        mask=None,
        position_ids=None,
    ):
        xp = self.xp
        batch, seq = input_ids.shape
        fused = None
        if self.on_cuda and cuda_fused.embed_fits(
            input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta, position_ids
        ):
            # None where an id is out of range: the lookups below then raise, naming it.
            fused = cuda_fused.embed_layer_norm(
                input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta,
                position_ids, self.epsilon, self.want_sum,
            )
        if fused is not None:
            total, summed = fused
        else:
            total, summed = self._sum_normalized(
                input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta,
                position_ids,
            )
        if mask is not None:
            mask_index = mask.sum(axis=1, dtype=np.int32)
        else:
            mask_index = xp.zeros((batch,), dtype=np.int32)
        return total, mask_index, summed

    def _sum_normalized(
        self, input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta, position_ids
    ):
        xp = self.xp
        seq = input_ids.shape[1]
        total = self._lookup(word_embedding, input_ids, "input_ids")  # fresh (B, S, H)
        if position_ids is None:
            if seq > position_embedding.shape[0]:
                raise ValueError(
                    f"EmbedLayerNormalization '{self.node.name}': sequence length {seq} exceeds "
                    f"position_embedding rows {position_embedding.shape[0]}"
                )
            total += position_embedding[:seq]
        else:
            total += self._lookup(position_embedding, position_ids, "position_ids")  # (B|1, S, H)
        if segment_ids is not None and segment_embedding is not None:
            total += self._lookup(segment_embedding, segment_ids, "segment_ids")
        width = total.shape[-1]
        if gamma.shape == beta.shape == (width,) and compiled.accepts(xp, total, gamma, beta):
            # One compiled pass per row (the LayerNormalization kernel's), not numpy's dozen calls:
            # 21 -> ~11 µs on the tiny BERT's (1, 1, 128). The sum stays as it was: it is `summed`.
            zeros = self._zeros.get(width)
            if zeros is None:  # the zero skip and bias, one per width: never written
                zeros = self._zeros.keep(width, np.zeros(width, np.float32))
            out = np.empty_like(total)
            rows = total.shape[0] * total.shape[1]
            # The sum x + 0 goes to one scratch row, not `out`: aliased, the loop ran scalar
            # (DistilBERT's (1, 32, 256): 6.2 -> 3.4 µs).
            compiled.skip_layer_norm_rows(
                total.reshape(rows, width), zeros.reshape(1, width), zeros, gamma, beta, np.float32(self.epsilon),
                True, out.reshape(rows, width), np.empty((1, width), np.float32),
                np.empty(rows, np.float32), np.empty(rows, np.float32),
            )  # fmt: skip
            return out, (total if self.want_sum else None)
        summed = total.copy() if self.want_sum else None
        layer_norm_in_place(xp, total, self.epsilon)
        total *= gamma
        total += beta
        return total, summed


KERNELS = [
    SkipLayerNormalization,
    SkipSimplifiedLayerNormalization,
    SimplifiedLayerNormalization,
    EmbedLayerNormalization,
]
