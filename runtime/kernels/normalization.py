"""Normalization kernels: BatchNormalization, LayerNormalization, Instance/Group norm, LRN, MVN.

Statistics of half-precision inputs are computed in float32 (what `stash_type=1` asks for,
and what ONNX Runtime does for every one of these ops), then the result is cast back.
On the CUDA backend, float32 LayerNormalization is one launch (runtime/kernels/cuda_fused.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels import compiled, cuda_fused
from runtime.kernels.base import Kernel, ShapeMemo, UnsupportedOp


def _output_wanted(node: ir.Node, index: int) -> bool:
    """Whether an optional output is present: ONNX omits one by giving it an empty name."""
    return index < len(node.outputs) and bool(node.outputs[index].name)


def _working(x):
    """x in the precision statistics are taken in: float32 for anything narrower."""
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def _per_channel(vector, rank):
    """A (C,) vector shaped to broadcast over (N, C, *spatial)."""
    return vector.reshape((-1,) + (1,) * (rank - 2))


_F32 = np.dtype(np.float32)


class BatchNormalization(Kernel):
    """Inference BatchNormalization folded to one scale and one shift per channel.

    From opset 14 `training_mode=1` is also supported, since it is deterministic: normalize with
    the batch's own statistics and return the momentum-updated running mean and variance.
    Before 14, training outputs (saved mean/var) are refused rather than guessed at.
    """

    op_type = "BatchNormalization"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.epsilon = self.attr("epsilon", 1e-5)
        self.momentum = self.attr("momentum", 0.9)
        self.training = opset >= 14 and bool(self.attr("training_mode", 0))
        if opset < 14 and any(_output_wanted(node, i) for i in range(1, 5)):
            raise UnsupportedOp(
                f"BatchNormalization '{node.name}': training outputs (mean/var/saved stats) before opset 14"
            )
        if opset < 9 and self.attr("spatial", 1) != 1:
            raise UnsupportedOp(f"BatchNormalization '{node.name}': spatial=0 (per-element statistics)")

    def run(self, x, scale, bias, mean, var):
        xp = self.xp
        work = _working(x)
        if self.training:
            axes = (0,) + tuple(range(2, x.ndim))
            batch_mean = work.mean(axis=axes)
            batch_var = work.var(axis=axes)
            y = self._normalize(xp, work, scale, bias, batch_mean, batch_var)
            m = self.momentum
            running_mean = (mean * m + batch_mean * (1 - m)).astype(mean.dtype, copy=False)
            running_var = (var * m + batch_var * (1 - m)).astype(var.dtype, copy=False)
            return (y.astype(x.dtype, copy=False), running_mean, running_var)
        y = self._normalize(xp, work, scale, bias, mean, var)
        return (y.astype(x.dtype, copy=False),)

    def _normalize(self, xp, x, scale, bias, mean, var):
        factor = scale.astype(x.dtype) / xp.sqrt(var.astype(x.dtype) + x.dtype.type(self.epsilon))
        shift = bias.astype(x.dtype) - mean.astype(x.dtype) * factor
        y = x * _per_channel(factor, x.ndim)
        y += _per_channel(shift, x.ndim)
        return y


class LayerNormalization(Kernel):
    """LayerNormalization, registered from opset 1 although ONNX added it at 17.

    ONNX Runtime's LayerNormFusion emits ONNX-domain LayerNormalization into models of any
    opset: the op began as an ORT contrib op that (by its own admission, "incorrectly") used the
    ONNX domain, so its CPU kernel is registered in kOnnxDomain for versions 1-16 as well as 17+.
    An optimized opset-14 model therefore contains this op, and registering at 1 lets us run it.
    That since-1 op types X apart from Scale, B and Y (ONNX Runtime's T and V): Y takes Scale's
    dtype, so a float16 X with float32 weights gives float32 (what LayerNormFusion emits when it
    absorbs the Casts of a mixed-precision LayerNorm). From opset 17 all four share one type.
    """

    op_type = "LayerNormalization"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", -1)
        self.epsilon = self.attr("epsilon", 1e-5)
        stash = self.attr("stash_type", 1)
        self.stash = ir.DataType(stash).numpy()
        self.want_mean = _output_wanted(node, 1)
        self.want_inv_std = _output_wanted(node, 2)
        self.one_type = opset >= 17
        self._zeros = ShapeMemo()
        # (scale, bias, zeros) where both are constants the compiled loop takes (bind_constants).
        self._constant_weights: tuple | None = None

    def bind_constants(self, constants):
        scale, bias = constants[1], constants[2] if len(constants) > 2 else None
        given_bias = len(self.node.inputs) > 2 and self.node.inputs[2] is not None and bool(self.node.inputs[2].name)
        if scale is None or (given_bias and bias is None) or self.stash != np.float32 or scale.ndim != 1:
            return
        if (bias is None or bias.shape == scale.shape) and compiled.accepts(self.xp, scale, *([] if bias is None else [bias])):
            self._constant_weights = (scale, bias, np.zeros(scale.shape[0], np.float32))

    def run(self, x, scale, bias=None):
        weights = self._constant_weights
        if (
            weights is not None
            and scale is weights[0]
            and bias is weights[1]
            and type(x) is np.ndarray
            and x.dtype == _F32
            and x.flags.c_contiguous
            and x.ndim
            and x.shape[-1] == scale.shape[0]
            and x.size
            and (self.axis == -1 or self.axis == x.ndim - 1)
        ):
            # Constant weights checked once (bind_constants): what is left to check is x's.
            return self._normalize_compiled(x, scale, bias, weights[2])
        xp = self.xp
        if self.one_type and x.dtype != scale.dtype:
            raise ValueError(
                f"LayerNormalization '{self.node.name}': X is {x.dtype} but Scale is {scale.dtype}; "
                "from opset 17 they share one type"
            )
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if self._compiled_fits(x, scale, bias, axis):
            return self._normalize_compiled(x, scale, bias)
        if self.on_cuda and self.stash == np.float32 and cuda_fused.layer_norm_fits(x, scale, bias, axis):
            return cuda_fused.layer_norm(x, scale, bias, axis, self.epsilon, self.want_mean or self.want_inv_std)
        axes = tuple(range(axis, x.ndim))
        work = x.astype(self.stash, copy=False)
        mean = work.mean(axis=axes, keepdims=True)
        centered = work - mean
        var = xp.square(centered).mean(axis=axes, keepdims=True)
        inv_std = 1.0 / xp.sqrt(var + work.dtype.type(self.epsilon))
        y = centered
        y *= inv_std
        y *= scale.astype(y.dtype, copy=False)
        if bias is not None:
            y += bias.astype(y.dtype, copy=False)
        outputs = [y.astype(scale.dtype, copy=False)]
        if self.want_mean or self.want_inv_std:
            outputs += [mean, inv_std]
        return tuple(outputs)

    def _compiled_fits(self, x, scale, bias, axis):
        """numpy float32 (stash too), normalized over the last axis only, 1-D scale and bias."""
        if self.stash != np.float32 or x.ndim < 1 or axis != x.ndim - 1 or scale.shape != (x.shape[-1],):
            return False
        if bias is None:
            return compiled.accepts(self.xp, x, scale)
        return bias.shape == scale.shape and compiled.accepts(self.xp, x, scale, bias)

    def _normalize_compiled(self, x, scale, bias, zeros=None):
        """SkipLayerNormalization's one-pass-per-row loop with a zero skip: 0.28 -> ~0.05 ms at
        GPT-2's 1x128x768, where numpy takes seven passes and four temporaries."""
        width = x.shape[-1]
        if zeros is None:
            zeros = self._zeros.get(width)
            if zeros is None:  # the zero skip and bias, one per width: never written
                zeros = self._zeros.keep(width, np.zeros(width, np.float32))
        out = np.empty_like(x)
        rows = x.size // width
        mean = np.empty(rows, np.float32)
        inv_std = np.empty(rows, np.float32)
        out_rows = out.reshape(rows, width)
        compiled.skip_layer_norm_rows(
            x.reshape(rows, width),
            zeros.reshape(1, width),
            zeros,
            scale,
            zeros if bias is None else bias,
            np.float32(self.epsilon),
            True,
            out_rows,
            np.empty((1, width), np.float32),  # the sum x + 0: a scratch row, `out` aliased ran scalar
            mean,
            inv_std,
        )
        if self.want_mean or self.want_inv_std:
            stats = (*x.shape[:-1], 1)
            return out, mean.reshape(stats), inv_std.reshape(stats)
        return (out,)


class RMSNormalization(Kernel):
    """x / sqrt(mean(x^2 over axis..) + epsilon) * scale (opset 23), Llama's RMSNorm: no mean is
    subtracted and there is no bias. The mean square is taken in `stash_type` (float32 unless said)."""

    op_type = "RMSNormalization"
    since_version = 23

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", -1)
        self.epsilon = self.attr("epsilon", 1e-5)
        self.stash = ir.DataType(self.attr("stash_type", 1)).numpy()

    def run(self, x, scale):
        xp = self.xp
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        work = x.astype(self.stash, copy=False)
        mean_square = xp.square(work).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
        mean_square += work.dtype.type(self.epsilon)
        y = work * xp.reciprocal(xp.sqrt(mean_square, out=mean_square), out=mean_square)
        y *= scale.astype(y.dtype, copy=False)
        return (y.astype(x.dtype, copy=False),)


class InstanceNormalization(Kernel):
    op_type = "InstanceNormalization"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.epsilon = self.attr("epsilon", 1e-5)

    def run(self, x, scale, bias):
        xp = self.xp
        work = _working(x)
        axes = tuple(range(2, x.ndim))
        mean = work.mean(axis=axes, keepdims=True)
        centered = work - mean
        var = xp.square(centered).mean(axis=axes, keepdims=True)
        y = centered
        y *= 1.0 / xp.sqrt(var + work.dtype.type(self.epsilon))
        y *= _per_channel(scale.astype(y.dtype, copy=False), x.ndim)
        y += _per_channel(bias.astype(y.dtype, copy=False), x.ndim)
        return (y.astype(x.dtype, copy=False),)


class GroupNormalization_18(Kernel):
    """GroupNormalization as first published: scale and bias hold one value per group."""

    op_type = "GroupNormalization"
    since_version = 18
    per_channel_affine = False

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.epsilon = self.attr("epsilon", 1e-5)
        self.groups = self.attr("num_groups")
        self.stash = ir.DataType(self.attr("stash_type", 1)).numpy()

    def run(self, x, scale, bias):
        xp = self.xp
        n, c = x.shape[:2]
        work = x.astype(self.stash, copy=False).reshape(n, self.groups, -1)
        mean = work.mean(axis=2, keepdims=True)
        centered = work - mean
        var = xp.square(centered).mean(axis=2, keepdims=True)
        centered *= 1.0 / xp.sqrt(var + work.dtype.type(self.epsilon))
        y = centered.reshape(x.shape)
        if not self.per_channel_affine:
            scale = xp.repeat(scale, c // self.groups)
            bias = xp.repeat(bias, c // self.groups)
        y *= _per_channel(scale.astype(y.dtype, copy=False), x.ndim)
        y += _per_channel(bias.astype(y.dtype, copy=False), x.ndim)
        return (y.astype(x.dtype, copy=False),)


class GroupNormalization(GroupNormalization_18):
    """Opset 21 made scale and bias per channel (C values), as every framework had it."""

    since_version = 21
    per_channel_affine = True


class LRN(Kernel):
    """Local response normalization across channels; the window sum is `size` shifted adds
    (size is small, usually 5) rather than a cumulative sum, which would lose precision."""

    op_type = "LRN"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.alpha = self.attr("alpha", 1e-4)
        self.beta = self.attr("beta", 0.75)
        self.bias = self.attr("bias", 1.0)
        self.size = self.attr("size")
        self.before = (self.size - 1) // 2
        self.after = self.size - 1 - self.before

    def run(self, x):
        xp = self.xp
        work = _working(x)
        c = x.shape[1]
        squares = xp.square(work)
        pad = [(0, 0)] * x.ndim
        pad[1] = (self.before, self.after)
        squares = xp.pad(squares, pad)
        total = squares[:, 0:c].copy()
        for offset in range(1, self.size):
            total += squares[:, offset : offset + c]
        total *= work.dtype.type(self.alpha / self.size)
        total += work.dtype.type(self.bias)
        return ((work / total**self.beta).astype(x.dtype, copy=False),)


class MeanVarianceNormalization(Kernel):
    """(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9), the epsilon from ONNX's function body."""

    op_type = "MeanVarianceNormalization"
    since_version = 9

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axes = tuple(self.attr("axes", [0, 2, 3]))

    def run(self, x):
        xp = self.xp
        work = _working(x)
        mean = work.mean(axis=self.axes, keepdims=True)
        variance = xp.square(work).mean(axis=self.axes, keepdims=True) - xp.square(mean)
        y = (work - mean) / (xp.sqrt(variance) + work.dtype.type(1e-9))
        return (y.astype(x.dtype, copy=False),)


class LpNormalization(Kernel):
    """x / ||x||_p along axis, p in {1, 2}."""

    op_type, since_version = "LpNormalization", 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", -1)
        self.p = self.attr("p", 2)

    def run(self, x):
        xp = self.xp
        if self.p == 1:
            norm = xp.sum(xp.abs(x), axis=self.axis, keepdims=True)
        else:
            norm = xp.sqrt(xp.sum(x * x, axis=self.axis, keepdims=True))
        # A zero vector stays zero rather than becoming 0/0 = NaN (the spec's reference does the same).
        return (xp.where(norm == 0, 0, x / xp.where(norm == 0, 1, norm)).astype(x.dtype, copy=False),)


KERNELS = [
    BatchNormalization,
    LayerNormalization,
    RMSNormalization,
    InstanceNormalization,
    GroupNormalization_18,
    GroupNormalization,
    LRN,
    MeanVarianceNormalization,
    LpNormalization,
]
