"""Channels-last (NHWC) convolution and pooling: what the `layout` level's NhwcTransformer emits.

In channels-last order the channels are the innermost axis, so a window view over the
spatial axes is (N, *out, *kernel, C): the im2col matrix is that view reshaped to
(N*P, K*C) — one copy, already in the order the pre-reshaped weight (K*C, M) wants — and
one GEMM writes (N*P, M), which *is* the NHWC output. Bias, the residual sum Z and the
activation are then applied in place on that buffer, so FusedConv's epilogue costs no
extra temporaries; on numpy float32 with Relu or no activation (ResNet's case) that is one
compiled pass (runtime/kernels/compiled.py) instead of one numpy pass per term.

Ops, with their domain and why (see optimizer/fusions/nhwc_conv_layout.py):
  com.microsoft.NhwcFusedConv   ONNX Runtime's op: X and Y NHWC, W in Conv's (M, C/g, *k)
                                order, optional B and Z, `activation`/`activation_params`
  com.fusionwatch.NhwcMaxPool, NhwcAveragePool, NhwcGlobalAveragePool
                                ONNX's pools with input 0 and output 0 channels-last

Where oneDNN is installed, a float32 NhwcFusedConv with a constant weight runs as one oneDNN
primitive instead (runtime/kernels/onednn_conv.py): direct convolution on channels-last data with
bias and Z added in the same pass, the activation applied after it in place (see onednn_conv.py for
why). It took ResNet-50 at level `all` from 1.83x onnxruntime's time to 1.23-1.27x (`make
bench`; per layer, `python -m bench.conv_micro`, whose single-layer timings swing more on a
shared machine). The path below is the fallback, and the reference tests/runtime/test_onednn.py
holds oneDNN to.

The weight is reordered to (groups, K*C/g, M/g) once, on first use, when it is a constant
of the graph (the usual case); a weight computed at run time is reordered on each call.
The GEMMs stay on numpy's BLAS, unlike MatMul's (runtime/kernels/gemm.py): on ResNet-50 MKL,
packed or not, measured no faster (50-52 ms a run all three ways), and packing is slower on its
tall, narrow GEMMs alone ((3136, 576) @ (576, 64): 1.4 ms numpy, 1.9 packed).
float16 is computed in float32 (numpy has no half-precision GEMM) and cast back.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from optimizer.match import FUSIONWATCH
from runtime.backends import numpy_backend
from runtime.kernels import compiled
from runtime.kernels.base import Kernel, UnsupportedOp
from runtime.kernels.conv import ConvolutionBase, conv_output_sizes, spatial_pads
from runtime.kernels.pool import WindowPool, window_maxima, window_sums


def _channels_last_padded(xp, x, begin, end, fill=0):
    """x (N, *spatial, C) with `fill` added around its spatial axes (x itself when no padding)."""
    if not any(begin) and not any(end):
        return x
    spatial = x.shape[1:-1]
    shape = (x.shape[0], *(s + b + e for s, b, e in zip(spatial, begin, end, strict=True)), x.shape[-1])
    out = xp.full(shape, fill, dtype=x.dtype) if fill else xp.zeros(shape, dtype=x.dtype)
    out[(slice(None), *(slice(b, b + s) for b, s in zip(begin, spatial, strict=True)), slice(None))] = x
    return out


def _channels_last_windows(xp, padded, kernel, out, strides, dilations):
    """A zero-copy view (N, *out, *kernel, C): every kernel tap at every output position."""
    sn, *ss, sc = padded.strides
    shape = (padded.shape[0], *out, *kernel, padded.shape[-1])
    steps = (
        sn,
        *(s * t for s, t in zip(ss, strides, strict=True)),
        *(s * d for s, d in zip(ss, dilations, strict=True)),
        sc,
    )
    read_only = {"writeable": False} if xp is np else {}  # CuPy has no read-only views
    return xp.lib.stride_tricks.as_strided(padded, shape=shape, strides=steps, **read_only)


# What `compiled.conv_epilogue_rows` takes for an absent residual (an absent bias is compiled.NO_BIAS).
_NO_RESIDUAL = np.empty((0, 0), dtype=np.float32)


# --- the fused activations ONNX Runtime's FusedConv accepts, applied in place ------------------
def _relu(xp, y, params):
    xp.maximum(y, 0, out=y)


def _leaky_relu(xp, y, params):
    xp.multiply(y, xp.where(y < 0, y.dtype.type(params[0]), y.dtype.type(1)), out=y)


def _sigmoid(xp, y, params):
    xp.negative(y, out=y)
    xp.exp(y, out=y)
    y += 1
    xp.reciprocal(y, out=y)


def _tanh(xp, y, params):
    xp.tanh(y, out=y)


def _hard_sigmoid(xp, y, params):
    y *= params[0]
    y += params[1]
    xp.clip(y, 0, 1, out=y)


def _clip(xp, y, params):
    xp.clip(y, params[0], params[1], out=y)


ACTIVATIONS = {
    # name: (in-place function, number of activation_params)
    "Relu": (_relu, 0),
    "LeakyRelu": (_leaky_relu, 1),
    "Sigmoid": (_sigmoid, 0),
    "Tanh": (_tanh, 0),
    "HardSigmoid": (_hard_sigmoid, 2),
    "Clip": (_clip, 2),
}


class NhwcFusedConv(ConvolutionBase):
    """Y = activation(conv(X, W) + B + Z), X/Y/Z channels-last, W in Conv's order."""

    op_type = "NhwcFusedConv"
    domain = "com.microsoft"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.activation = None
        name = self.attr("activation")
        if name is not None:
            if name not in ACTIVATIONS:
                raise UnsupportedOp(
                    f"NhwcFusedConv '{node.name}': activation {name!r} is not one of {', '.join(ACTIVATIONS)}"
                )
            function, count = ACTIVATIONS[name]
            params = [float(p) for p in self.attr("activation_params", [])]
            if len(params) != count:
                raise UnsupportedOp(
                    f"NhwcFusedConv '{node.name}': activation {name} takes {count} activation_params, got {len(params)}"
                )
            self.activation = (function, params)
        # A constant weight is reordered for the GEMM once, on the first run that needs it
        # (none, where oneDNN runs every call), not on every run.
        self._weight = None

    def library_primitive(self, x, w, b, z):
        """The oneDNN primitive for this call, or None where the numpy path runs (`ConvolutionBase.onednn_primitive`)."""
        return self.onednn_primitive(x, w, b, z, channels_last=True)

    def _constant_gemm_weight(self, w):
        """The GEMM-ordered constant weight, reordered on first use; None for a weight that is
        not a constant of the graph (or a feed replaced it)."""
        weight = self.node.inputs[1]
        if weight.const_value is None or weight.is_graph_input():
            return None
        if self._weight is None:
            array = weight.const_value.numpy()
            if array.dtype == np.float16:
                array = array.astype(np.float32)
            self._weight = (array.shape, self.xp.asarray(self._gemm_weight(array)))
        return self._weight[1] if self._weight[0] == w.shape else None

    def _gemm_weight(self, w):
        """(M, C/g, *k) -> (g, K*C/g, M/g), rows in the (*k, c) order of a channels-last window."""
        m, cg, *kernel = w.shape
        g = self.group
        w = w.reshape(g, m // g, cg, *kernel)
        rank = len(kernel)
        w = w.transpose(0, *range(3, 3 + rank), 2, 1)  # (g, *k, C/g, M/g)
        return np.ascontiguousarray(w).reshape(g, math.prod(kernel) * cg, m // g)

    def _plan(self, x_shape, w_shape):
        n, *sizes, c = x_shape
        m, cg, *kernel = w_shape
        rank = len(kernel)
        if len(sizes) != rank:
            raise ValueError(
                f"NhwcFusedConv '{self.node.name}': input of rank {len(x_shape)} for a {rank}-D kernel"
            )
        if cg * self.group != c:
            raise ValueError(
                f"NhwcFusedConv '{self.node.name}': input has {c} channels but weight expects {cg} x group {self.group}"
            )
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        begin, end = spatial_pads(self.auto_pad, self.pads, sizes, kernel, strides, dilations)
        out = conv_output_sizes(sizes, begin, end, kernel, strides, dilations)
        if all(k == 1 for k in kernel) and not any(begin) and not any(end) and self.group == 1:
            path = "pointwise"
        elif cg == 1 and m == self.group:
            path = "depthwise"
        else:
            path = "im2col"
        return path, begin, end, kernel, out, strides, dilations

    def run(self, x, w, b=None, z=None):
        primitive = self.library_primitive(x, w, b, z)
        if primitive is not None:
            y = primitive(x, b, z)  # bias and Z added by oneDNN
            self._activate(y.reshape(-1, y.shape[-1]), None, None)
            return (y,)
        xp = self.xp
        dtype = x.dtype
        if dtype == np.float16:
            x = x.astype(np.float32)
            b = None if b is None else b.astype(np.float32)
        plan = self.plan(x.shape, w.shape)
        path, begin, end, kernel, out, strides, dilations = plan
        weight = self._constant_gemm_weight(w)
        if weight is None:
            weight = xp.asarray(self._gemm_weight(self.backend.to_host(w).astype(np.float32, copy=False)))
        n = x.shape[0]
        m = w.shape[0]
        g = self.group
        rows = n * math.prod(out)

        if path == "pointwise":
            if any(s != 1 for s in strides):
                x = x[(slice(None), *(slice(None, None, s) for s in strides), slice(None))]
            y = xp.matmul(x.reshape(rows, x.shape[-1]), weight[0])
        elif path == "depthwise":
            windows = _channels_last_windows(
                xp, _channels_last_padded(xp, x, begin, end), kernel, out, strides, dilations
            )
            # (K, C): one channel vector per tap. With unit stride along the last spatial axis a
            # tap's window rows are contiguous (W*C values), so the vector is tiled to that length
            # once and each multiply-add runs over long rows instead of C-long ones.
            taps = weight.reshape(g, math.prod(kernel)).T
            row = out[-1] if strides[-1] == 1 else 1
            taps = xp.ascontiguousarray(xp.tile(taps, (1, row)))
            lead = (slice(None),) * (1 + len(out))
            shape = (n, *out[:-1], out[-1] // row, row * m)
            y = None
            scratch = None
            for t, tap in enumerate(itertools.product(*(range(k) for k in kernel))):
                window = windows[lead + tap].reshape(shape)
                if y is None:
                    y = window * taps[t]
                    scratch = xp.empty_like(y)
                else:
                    xp.multiply(window, taps[t], out=scratch)
                    y += scratch
            y = y.reshape(rows, m)
        elif g == 1:
            windows = _channels_last_windows(
                xp, _channels_last_padded(xp, x, begin, end), kernel, out, strides, dilations
            )
            y = xp.matmul(windows.reshape(rows, -1), weight[0])
        else:
            windows = _channels_last_windows(
                xp, _channels_last_padded(xp, x, begin, end), kernel, out, strides, dilations
            )
            cg = x.shape[-1] // g
            grouped = windows.reshape(*windows.shape[:-1], g, cg)  # (N, *out, *k, g, C/g)
            spatial = 2 * len(out)
            grouped = xp.moveaxis(grouped, 1 + spatial, 0).reshape(g, rows, -1)
            y = xp.matmul(grouped, weight)  # (g, rows, M/g)
            y = xp.ascontiguousarray(y.transpose(1, 0, 2)).reshape(rows, m)
        self._activate(y, b, None if z is None else z.reshape(rows, m))
        return (y.reshape(n, *out, m).astype(dtype, copy=False),)

    def _activate(self, y, b, residual):
        """y += b + residual, then the activation, in place on the (rows, M) output."""
        if b is None and residual is None and self.activation is None:
            return
        if self._epilogue_compiled(y, b, residual):
            return
        if b is not None:
            y += b
        if residual is not None:
            y += residual
        if self.activation is not None:
            function, params = self.activation
            function(self.xp, y, params)

    def _epilogue_compiled(self, y, b, residual):
        """Bias, residual and Relu (or no activation) in one compiled pass over y, when it can."""
        relu = self.activation is not None and self.activation[0] is _relu
        if self.activation is not None and not relu:
            return False
        present = [a for a in (y, b, residual) if a is not None]
        if not compiled.accepts(self.xp, *present) or (b is not None and b.shape != (y.shape[1],)):
            return False
        compiled.conv_epilogue_rows(
            y,
            compiled.NO_BIAS if b is None else b,
            _NO_RESIDUAL if residual is None else residual,
            relu,
        )
        return True


class _NhwcWindowPool(WindowPool):
    """The NCHW pools' attributes and window geometry (runtime/kernels/pool.py), taps channels-last."""

    domain = FUSIONWATCH
    since_version = 1

    def _plan(self, shape):
        """(geometry, per-tap channels-last slices, begin pads, end pads incl. ceil_mode overhang)."""
        geometry = self._geometry(shape[1:-1])
        # The NCHW geometry's taps index (N, C, *spatial); channels-last puts C at the end.
        taps = [(slice(None), *tap[2:], slice(None)) for tap in geometry.taps]
        end = [e + x for e, x in zip(geometry.end, geometry.extra, strict=True)]
        return geometry, taps, geometry.begin, end


class NhwcMaxPool(_NhwcWindowPool):
    op_type = "NhwcMaxPool"

    def run(self, x):
        xp = self.xp
        geometry, taps, begin, end = self.plan(x.shape)
        if len(geometry.out) == 2 and compiled.accepts(xp, x):
            out = xp.empty((x.shape[0], *geometry.out, x.shape[-1]), dtype=x.dtype)
            compiled.max_pool_channels_last_2d(
                x, *geometry.kernel, *geometry.strides, *geometry.dilations, *geometry.begin, out
            )
            return (out,)
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        return (window_maxima(xp, _channels_last_padded(xp, x, begin, end, fill), taps),)


class NhwcAveragePool(_NhwcWindowPool):
    op_type = "NhwcAveragePool"

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.include_pad = bool(self.attr("count_include_pad", 0))
        self._divisors: dict = {}

    def run(self, x):
        xp = self.xp
        geometry, taps, begin, end = self.plan(x.shape)
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        total = window_sums(_channels_last_padded(xp, work, begin, end), taps)
        divisor = self._divisors.get(x.shape)
        if divisor is None:
            counts = geometry.window_counts(xp, self.include_pad).astype(total.dtype)
            divisor = self._divisors[x.shape] = counts[..., None]  # one count per position, all channels
        total /= divisor
        return (total.astype(x.dtype, copy=False),)


class NhwcGlobalAveragePool(Kernel):
    op_type = "NhwcGlobalAveragePool"
    domain = FUSIONWATCH
    since_version = 1

    def run(self, x):
        accumulate = np.float32 if x.dtype == np.float16 else None  # a half-precision sum overflows
        mean = x.mean(axis=tuple(range(1, x.ndim - 1)), keepdims=True, dtype=accumulate)
        return (mean.astype(x.dtype, copy=False),)


KERNELS = [
    NhwcFusedConv,
    NhwcMaxPool,
    NhwcAveragePool,
    NhwcGlobalAveragePool,
]
