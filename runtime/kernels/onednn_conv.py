"""float32 convolutions on oneDNN's direct convolution primitive: what Conv and FusedConv
(runtime/kernels/conv.py, NC... data) and NhwcFusedConv (the layout level's channels-last
convolution, runtime/kernels/conv_nhwc.py) hand to `ConvPrimitive`, with the bias and the
residual sum Z added by the primitive in the same pass over the output.

The activation is not a oneDNN post-op: oneDNN's ReLU (and Clip, HardSigmoid) computes a
maximum that turns NaN into 0 in its channels-last kernels, where onnxruntime and ONNX keep NaN.
The kernels apply it afterwards, in place, on the output while it is still in cache (one
compiled pass for Relu: runtime/kernels/compiled.py).

Why: an im2col copy plus one BLAS GEMM per convolution reaches about half of this CPU's float32
peak on ResNet-50's tall, narrow products (3136 x 576 x 64 and the like), and ResNet-50 at
level `all` took 54 ms against onnxruntime's 29. onnxruntime's MLAS runs direct convolutions on
channel-blocked data instead; oneDNN's jit convolutions do the same (weights reordered once into
the blocked layout the kernel reads, activations read as they are), so the convolution library
is the one well-kept implementation of that idea we can call, as MKL is for GEMMs
(runtime/kernels/gemm.py). Whether a session's convolutions run here or on im2col is measured
(runtime/kernel_choice.py); `bench/conv_micro.py` and `make bench` show the difference. Where
oneDNN is not available (runtime/kernels/onednn.py), the kernels keep their im2col path.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from runtime.kernels import onednn

_FORWARD_INFERENCE = 96  # dnnl_forward_inference
_CONVOLUTION_DIRECT = 1  # dnnl_convolution_direct
_BINARY_ADD = 0x1FFF0  # dnnl_binary_add


class ConvPrimitive:
    """One float32 convolution, fixed input shape, constant weight (reordered once, here).

    `x_shape` (N, *spatial, C) and the output are channels-last, or with `channels_last=False`
    (N, C, *spatial) as ONNX's Conv has them; the weight is ONNX's (M, C/group, *kernel);
    `residual`: whether a Z of the output's shape is added.
    """

    def __init__(
        self,
        x_shape,
        weight: np.ndarray,
        bias: bool,
        *,
        group: int,
        strides,
        dilations,
        begin,
        end,
        out,
        residual: bool = False,
        channels_last: bool = True,
    ) -> None:
        if not onednn.available():
            raise RuntimeError(f"oneDNN is not available: {onednn.unavailable_reason()}")
        library = onednn.library()
        rank = len(out)
        m = weight.shape[0]
        if channels_last:
            n, *sizes, c = x_shape
            order = (0, *range(2, 2 + rank), 1)  # oneDNN's dims are (N, C, *spatial); memory is channels-last
            self.out_shape = (n, *out, m)
        else:
            n, c, *sizes = x_shape
            order = tuple(range(2 + rank))
            self.out_shape = (n, m, *out)
        src_dims = [n, c, *sizes]
        dst_dims = [n, m, *out]
        src = onednn.memory_desc(src_dims, onednn.strides_in_order(src_dims, order))
        dst = onednn.memory_desc(dst_dims, onednn.strides_in_order(dst_dims, order))
        if group == 1:
            user_weight_dims = list(weight.shape)
        else:
            user_weight_dims = [group, m // group, *weight.shape[1:]]
        user_strides = onednn.strides_in_order(user_weight_dims, range(len(user_weight_dims)))
        user_weight = onednn.memory_desc(user_weight_dims, user_strides)
        any_weight = onednn.memory_desc(user_weight_dims)
        bias_desc = onednn.memory_desc([m], [1]) if bias else None

        attr = onednn.Handle("dnnl_primitive_attr_destroy")
        onednn.check(library.dnnl_primitive_attr_create(ctypes.byref(attr.pointer)), "primitive_attr_create")
        post_ops = onednn.Handle("dnnl_post_ops_destroy")
        onednn.check(library.dnnl_post_ops_create(ctypes.byref(post_ops.pointer)), "post_ops_create")
        if residual:
            onednn.check(
                library.dnnl_post_ops_append_binary(post_ops.pointer, _BINARY_ADD, dst.pointer),
                "append_binary",
            )
        onednn.check(library.dnnl_primitive_attr_set_post_ops(attr.pointer, post_ops.pointer), "set_post_ops")

        primitive_desc = onednn.Handle("dnnl_primitive_desc_destroy")
        onednn.check(
            library.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(primitive_desc.pointer),
                onednn.engine(),
                _FORWARD_INFERENCE,
                _CONVOLUTION_DIRECT,
                src.pointer,
                any_weight.pointer,
                bias_desc.pointer if bias_desc else None,
                dst.pointer,
                onednn.dims_array(strides),
                onednn.dims_array([d - 1 for d in dilations]),  # oneDNN counts the gaps, ONNX the step
                onednn.dims_array(begin),
                onednn.dims_array(end),
                attr.pointer,
            ),
            "convolution_forward_primitive_desc_create",
        )
        self._primitive = onednn.create_primitive(primitive_desc)
        source = np.ascontiguousarray(weight, dtype=np.float32)
        self._weight_buffer, self._weight = onednn.reordered_weight(primitive_desc, user_weight, source)
        self._primitive_desc = primitive_desc

        # Memory objects whose data pointers are set on each run.
        self._src = onednn.memory(src.pointer)
        self._dst = onednn.memory(dst.pointer)
        self._bias = onednn.memory(bias_desc.pointer) if bias_desc else None
        self._z = onednn.memory(dst.pointer) if residual else None

    @property
    def implementation(self) -> str:
        """oneDNN's name for the kernel it chose, e.g. "brgconv:avx512_core"; "ref:any" means its
        slow reference loops (a layout or shape its fast kernels don't take)."""
        return onednn.implementation(self._primitive_desc)

    def __call__(
        self, x: np.ndarray, bias: np.ndarray | None = None, z: np.ndarray | None = None
    ) -> np.ndarray:
        """The convolution's output, a fresh float32 array. A strided x or z (a Transpose's view)
        is copied first: oneDNN reads the layout it was given at creation."""
        library = onednn.library()
        out = np.empty(self.out_shape, np.float32)
        if not math.prod(self.out_shape):
            return out
        x = np.ascontiguousarray(x)
        z = None if z is None else np.ascontiguousarray(z)
        bias = None if bias is None else np.ascontiguousarray(bias)
        args = [(onednn.ARG_SRC, self._src), (onednn.ARG_WEIGHTS, self._weight), (onednn.ARG_DST, self._dst)]
        with onednn.STREAM_LOCK:
            library.dnnl_memory_set_data_handle(self._src.pointer, x.ctypes.data)
            library.dnnl_memory_set_data_handle(self._dst.pointer, out.ctypes.data)
            if self._bias is not None:
                library.dnnl_memory_set_data_handle(self._bias.pointer, bias.ctypes.data)
                args.append((onednn.ARG_BIAS, self._bias))
            if self._z is not None:
                library.dnnl_memory_set_data_handle(self._z.pointer, z.ctypes.data)
                args.append((onednn.ARG_POST_OP_BASE | onednn.ARG_SRC_1, self._z))
            onednn.execute(self._primitive, args)
        return out
