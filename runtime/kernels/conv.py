"""Convolution kernels: Conv and ConvTranspose for 1-D, 2-D and 3-D images, NC... layout.
(The layout level's channels-last convolutions, on oneDNN where installed, are in conv_nhwc.py.)

Conv takes one of three paths, chosen once per input shape and cached:
- oneDNN (the onednn extra), for a float32 Conv whose weight is a constant of the graph, unless the
  session measured im2col faster for convolutions: the primitive reads and writes ONNX's NC...
  layout itself (oneDNN's gemm-based kernel for that layout). Before it, level `disabled` ran
  ResNet-50 at twice onnxruntime's time (56 against 28 ms on the AMD EPYC), every 3x3 convolution
  an im2col copy and an OpenBLAS product;
- pointwise (every kernel dim 1, no padding): a plain matmul over channels, the ResNet
  bottleneck's 1x1 convolutions — no copy beyond striding;
- otherwise im2col: a zero-copy `as_strided` window view, materialised once by reshape into
  (N, groups, C/groups*K, P), then one batched GEMM, so the heavy lifting is BLAS.
Depthwise convolution (one channel per group) is the im2col path with groups=C: a GEMM per
channel with K=9. We measured the obvious alternative, one multiply-add per kernel tap over
strided views, and it is 2.3x slower on a 64-channel 56x56 3x3 layer (1.75 ms against 0.75 ms,
one thread): 18 passes over strided memory cost more than one im2col copy plus small GEMMs.

ConvTranspose is the adjoint: one GEMM producing every tap's contribution, then col2im adds
each tap into a strided slice of the output.

float16 is computed in float32 (numpy has no half-precision GEMM) and cast back.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels import libraries, onednn, onednn_conv
from runtime.kernels.base import Kernel, UnsupportedOp

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _same_pads(auto_pad, sizes, kernel, strides, dilations):
    """SAME_*: output = ceil(input / stride); the odd pad goes to the end (UPPER) or start (LOWER)."""
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin, end


def spatial_pads(auto_pad, pads, sizes, kernel, strides, dilations):
    """(begin, end) padding per spatial axis, as Conv and the pools read it: SAME_* derived from
    the input sizes, VALID or no `pads` as zeros, else `pads` split into its two halves."""
    rank = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pads(auto_pad, sizes, kernel, strides, dilations)
    if auto_pad == "VALID" or not pads:
        return [0] * rank, [0] * rank
    return list(pads[:rank]), list(pads[rank:])


def conv_output_sizes(sizes, begin, end, kernel, strides, dilations):
    """Each spatial axis' output length: windows that fit in the padded input (floor)."""
    return [
        (size + b + e - (k - 1) * d - 1) // s + 1
        for size, b, e, k, d, s in zip(sizes, begin, end, kernel, dilations, strides, strict=True)
    ]


def read_auto_pad(kernel: Kernel) -> str:
    auto_pad = kernel.attr("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        raise UnsupportedOp(f"{kernel.op_type} '{kernel.node.name}': unknown auto_pad {auto_pad!r}")
    return auto_pad


def _zero_padded(xp, x, begin, end):
    """x with zeros added around its spatial dims (a fresh array; x is left alone)."""
    if not any(begin) and not any(end):
        return x
    spatial = x.shape[2:]
    out = xp.zeros(
        x.shape[:2] + tuple(s + b + e for s, b, e in zip(spatial, begin, end, strict=True)), x.dtype
    )
    out[(slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(begin, spatial, strict=True))] = x
    return out


def _windows(xp, padded, kernel, out, strides, dilations):
    """A zero-copy view (N, C, *kernel, *out) of every kernel tap at every output position."""
    n, c = padded.shape[:2]
    sn, sc, *ss = padded.strides
    shape = (n, c, *kernel, *out)
    steps = (
        sn,
        sc,
        *(s * d for s, d in zip(ss, dilations, strict=True)),
        *(s * t for s, t in zip(ss, strides, strict=True)),
    )
    read_only = {"writeable": False} if xp is np else {}  # CuPy has no read-only views
    return xp.lib.stride_tricks.as_strided(padded, shape=shape, strides=steps, **read_only)


class ConvolutionBase(Kernel):
    """The attributes every convolution reads (Conv, ConvTranspose, NhwcFusedConv), and a
    cache for the plan each one makes per input shape."""

    # Whether oneDNN's convolution primitive computes this op (ConvTranspose: not).
    on_onednn = True

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.auto_pad = read_auto_pad(self)
        self.group = self.attr("group", 1)
        self.dilations = self.attr("dilations")
        self.strides = self.attr("strides")
        self.pads = self.attr("pads")
        self._plans: dict = {}
        # The weight oneDNN reorders once per input shape: a float32 constant no feed can replace.
        self._primitives: dict = {}
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        self._library_weight = None
        if (
            self.on_onednn
            and weight is not None
            and weight.const_value is not None
            and not weight.is_graph_input()
            and weight.const_value.dtype == ir.DataType.FLOAT
            and backend.xp is np
            and onednn.available()
        ):
            self._library_weight = weight.const_value.numpy()

    def onednn_primitive(self, x, w, b, z=None, *, channels_last: bool):
        """The oneDNN primitive (runtime/kernels/onednn_conv.py) for this call, made once per input
        shape, or None where the numpy path runs: no oneDNN, a weight that is not a float32
        constant, other dtypes, or a session that measured im2col faster."""
        weight = self._library_weight
        if (
            weight is None
            or not onednn.available()  # e.g. in a forked child (runtime/kernels/onednn.py, on forks)
            or libraries.chosen("conv") == "numpy"
            or w.shape != weight.shape
            or x.dtype != np.float32
            or (b is not None and (b.dtype != np.float32 or b.shape != (weight.shape[0],)))
            or (z is not None and z.dtype != np.float32)
        ):
            return None
        key = (x.shape, b is not None, z is not None)
        primitive = self._primitives.get(key)
        if primitive is None:
            sizes = x.shape[1:-1] if channels_last else x.shape[2:]
            channels = x.shape[-1] if channels_last else x.shape[1]
            kernel = weight.shape[2:]
            if len(sizes) != len(kernel) or len(kernel) not in (1, 2, 3) or weight.shape[1] * self.group != channels:
                return None  # the numpy path's plan names the mismatch
            strides = self.strides or [1] * len(kernel)
            dilations = self.dilations or [1] * len(kernel)
            begin, end = spatial_pads(self.auto_pad, self.pads, sizes, kernel, strides, dilations)
            primitive = self._primitives[key] = onednn_conv.ConvPrimitive(
                x.shape, weight, b is not None, group=self.group, strides=strides, dilations=dilations,
                begin=begin, end=end, out=conv_output_sizes(sizes, begin, end, kernel, strides, dilations),
                residual=z is not None, channels_last=channels_last,
            )  # fmt: skip
        if z is not None and z.shape != primitive.out_shape:
            return None
        return primitive

    def plan(self, x_shape, w_shape):
        """`_plan(x_shape, w_shape)`, made once per pair of input shapes."""
        key = (x_shape, w_shape)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(x_shape, w_shape)
        return plan


class Conv(ConvolutionBase):
    op_type = "Conv"
    since_version = 1

    def _plan(self, x_shape, w_shape):
        n, c, *sizes = x_shape
        m, cg, *kernel = w_shape
        rank = len(kernel)
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        begin, end = spatial_pads(self.auto_pad, self.pads, sizes, kernel, strides, dilations)
        if cg * self.group != c:
            raise ValueError(
                f"Conv '{self.node.name}': input has {c} channels but weight expects {cg} x group {self.group}"
            )
        out = conv_output_sizes(sizes, begin, end, kernel, strides, dilations)
        pointwise = all(k == 1 for k in kernel) and not any(begin) and not any(end)
        return pointwise, begin, end, kernel, out, strides, dilations

    def run(self, x, w, b=None):
        primitive = self.onednn_primitive(x, w, b, channels_last=False)
        if primitive is not None:
            return (primitive(x, b),)
        xp = self.xp
        dtype = x.dtype
        if dtype == np.float16:
            x, w = x.astype(np.float32), w.astype(np.float32)
            b = None if b is None else b.astype(np.float32)
        plan = self.plan(x.shape, w.shape)
        pointwise, begin, end, kernel, out, strides, dilations = plan
        n, c = x.shape[:2]
        m = w.shape[0]
        g = self.group
        positions = math.prod(out)
        if pointwise:
            if any(s != 1 for s in strides):
                x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
            cols = x.reshape(n, g, c // g, positions)
        else:
            windows = _windows(xp, _zero_padded(xp, x, begin, end), kernel, out, strides, dilations)
            cols = windows.reshape(n, g, (c // g) * math.prod(kernel), positions)
        y = xp.matmul(w.reshape(g, m // g, -1), cols)
        y = y.reshape(n, m, positions)
        if b is not None:
            y += b.reshape(m, 1)
        return (y.reshape((n, m, *out)).astype(dtype, copy=False),)


class ConvTranspose(ConvolutionBase):
    op_type = "ConvTranspose"
    since_version = 1
    # oneDNN's convolution primitive computes Conv, not the transpose: a ConvTranspose with as many
    # outputs as inputs passed its weight check and ran as a Conv.
    on_onednn = False

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.output_padding = self.attr("output_padding")
        self.output_shape = self.attr("output_shape")

    def _plan(self, x_shape, w_shape):
        sizes = x_shape[2:]
        kernel = w_shape[2:]
        rank = len(kernel)
        strides = self.strides or [1] * rank
        dilations = self.dilations or [1] * rank
        extra = self.output_padding or [0] * rank
        # The full (uncropped) extent each input position's kernel footprint can reach.
        full = [
            s * (i - 1) + (k - 1) * d + 1 + e
            for s, i, k, d, e in zip(strides, sizes, kernel, dilations, extra, strict=True)
        ]
        if self.output_shape is not None or self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # The spec: total padding is whatever makes the requested (or SAME) size; the odd
            # one goes to the end for SAME_UPPER and to the start otherwise.
            target = (
                list(self.output_shape[-rank:])
                if self.output_shape is not None
                else [i * s for i, s in zip(sizes, strides, strict=True)]
            )
            begin = []
            for f, t in zip(full, target, strict=True):
                total = f - t
                begin.append(total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2)
            out = target
        else:
            pads = [0] * (2 * rank) if self.auto_pad == "VALID" or not self.pads else list(self.pads)
            begin = pads[:rank]
            out = [f - pads[i] - pads[i + rank] for i, f in enumerate(full)]
        # Pads can be negative (output larger than the footprint): allocate room on both sides.
        offset = [max(0, -b) for b in begin]
        buffer = [max(f, b + o) + off for f, b, o, off in zip(full, begin, out, offset, strict=True)]
        crop = tuple(slice(off + b, off + b + o) for off, b, o in zip(offset, begin, out, strict=True))
        taps = []
        for tap in itertools.product(*(range(k) for k in kernel)):
            taps.append(
                (
                    tap,
                    tuple(
                        slice(off + t * d, off + t * d + s * (i - 1) + 1, s)
                        for off, t, d, s, i in zip(offset, tap, dilations, strides, sizes, strict=True)
                    ),
                )
            )
        return buffer, crop, taps

    def run(self, x, w, b=None):
        xp = self.xp
        dtype = x.dtype
        if dtype == np.float16:
            x, w = x.astype(np.float32), w.astype(np.float32)
            b = None if b is None else b.astype(np.float32)
        plan = self.plan(x.shape, w.shape)
        buffer, crop, taps = plan
        n, c, *sizes = x.shape
        g = self.group
        mg = w.shape[1]
        kernel = w.shape[2:]
        k = math.prod(kernel)
        # Every tap's contribution at every input position: (N, G, Mg*K, P) from one GEMM.
        weights = w.reshape(g, c // g, mg * k).transpose(0, 2, 1)
        cols = xp.matmul(weights, x.reshape(n, g, c // g, math.prod(sizes)))
        cols = cols.reshape(n, g * mg, k, *sizes)
        full = xp.zeros((n, g * mg, *buffer), dtype=cols.dtype)
        everything = (slice(None), slice(None))
        for t, (_, region) in enumerate(taps):
            full[everything + region] += cols[:, :, t]
        y = full[everything + crop]
        if b is not None:
            y = y + b.reshape((g * mg,) + (1,) * len(sizes))
        return (xp.ascontiguousarray(y).astype(dtype, copy=False),)


KERNELS = [
    Conv,
    ConvTranspose,
]
