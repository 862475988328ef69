"""float32 channels-last convolutions on oneDNN where it is installed: what NhwcFusedConv (the
layout level's convolution) hands to `ConvPrimitive`, with the bias and the residual sum Z added
by the primitive in the same pass over the output.

The activation is not a oneDNN post-op: oneDNN's ReLU (and Clip, HardSigmoid) computes a
maximum that turns NaN into 0 in its channels-last kernels, where onnxruntime and ONNX keep NaN.
The kernels apply it afterwards, in place, on the output while it is still in cache (one
compiled pass for Relu: runtime/kernels/compiled.py).

Why: an im2col copy plus one BLAS GEMM per convolution reaches about half of this CPU's float32
peak on ResNet-50's tall, narrow products (3136 x 576 x 64 and the like), and ResNet-50 at
level `all` took 54 ms against onnxruntime's 29. onnxruntime's MLAS runs direct convolutions on
channel-blocked data instead; oneDNN's jit convolutions do the same (weights reordered once into
the blocked layout the kernel reads, activations read channels-last as they are), so the
convolution library is the one well-kept implementation of that idea we can call, as MKL is for
GEMMs (runtime/kernels/gemm.py). `bench/conv_micro.py` and `make bench` show the difference.
NC... convolutions (Conv and FusedConv, levels basic and extended) stay on im2col: on NCHW data
oneDNN falls back to its own GEMM path, which measured no faster than ours (slower with two
threads: `FUSIONWATCH_BENCH_THREADS=2 python -m bench.conv_micro`).

oneDNN comes from the optional `onednn-cpu-gomp` wheel (`pip install fusionwatch[onednn]`,
which `make` installs): libdnnl is found through that wheel's file list (or sys.prefix/lib) and
loaded with ctypes on first use. It links the system's GNU OpenMP (libgomp). Where it is missing,
the platform is not x86_64 Linux, the backend is not numpy or the dtype is not float32,
`available()` is False and the kernels keep their im2col path, to the same results within fp32
tolerance (tests/runtime/test_onednn.py runs both).

Threads: oneDNN's OpenMP workers follow `set_threads` (`intra_op_num_threads`). They are Intel
OpenMP's where the mkl extra is installed (libiomp5 answers oneDNN's GNU OpenMP calls: one pool
with MKL's, whose wait between calls a session measures: runtime/kernels/openmp.py); else
libgomp's, with OMP_WAIT_POLICY set to passive unless the user set it, so that those workers
sleep between convolutions instead of spinning beside numba's work.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import sys
import threading

import numpy as np

from runtime.kernels import openmp
from runtime.kernels.native import wheel_library

_F32 = 3  # dnnl_f32
_FORMAT_ANY = 1  # dnnl_format_tag_any
_CPU = 1  # dnnl_cpu engine
_DEFAULT_STREAM = 1  # dnnl_stream_default_flags
_FORWARD_INFERENCE = 96  # dnnl_forward_inference
_CONVOLUTION_DIRECT = 1  # dnnl_convolution_direct
_BINARY_ADD = 0x1FFF0
_QUERY_WEIGHTS_MD = 131
_QUERY_IMPL_INFO = 8  # dnnl_query_impl_info_str
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS = 1, 17, 33, 41
_ARG_SRC_1 = 2
_ARG_POST_OP_BASE = 32768  # DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) = base * (i + 1)
_MAX_DIMS = 12

_Dims = ctypes.c_int64 * _MAX_DIMS
_ptr = ctypes.c_void_p


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _ptr)]


_library: ctypes.CDLL | None = None
_load_error: str | None = None
_loaded = False
_engine = _ptr()
_stream = _ptr()
# One CPU stream serves the process, and a primitive's memory objects are reused by every call
# (only their data pointers change), so calls take turns; each one uses every core anyway.
_stream_lock = threading.Lock()
_threads = 0  # the last count set_threads was given; 0: OpenMP's default
_ran = False  # whether a primitive has run: from then on libgomp has started its threads


class OneDnnError(RuntimeError):
    """A oneDNN call returned a status other than success."""


_STATUS = {
    1: "out of memory",
    2: "invalid arguments",
    3: "unimplemented",
    4: "no implementation left",
    5: "runtime error",
    6: "not required",
}


def _check(status: int, call: str) -> None:
    if status != 0:
        raise OneDnnError(f"oneDNN {call} failed: {_STATUS.get(status, f'status {status}')}")


def _load() -> ctypes.CDLL | None:
    global _library, _load_error, _loaded
    if _loaded:
        return _library
    _loaded = True
    if platform.machine().lower() not in ("x86_64", "amd64") or not sys.platform.startswith("linux"):
        _load_error = (
            f"the onednn-cpu-gomp wheel is x86_64 Linux only; this is {sys.platform} {platform.machine()}"
        )
        return None
    path = wheel_library("onednn-cpu-gomp", "libdnnl.so")
    if path is None:
        _load_error = "the onednn-cpu-gomp package is not installed (pip install fusionwatch[onednn])"
        return None
    # libiomp5 first and global, so that oneDNN's OpenMP calls run on MKL's pool
    # (runtime/kernels/openmp.py); without it they bind to libgomp, which reads its wait
    # policy when it starts, so that must be set before the library loads.
    openmp.load()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    try:
        library = ctypes.CDLL(str(path))
    except OSError as error:  # e.g. no libgomp.so.1 on this system
        _load_error = f"{path} could not be loaded: {error}"
        return None
    library.dnnl_primitive_desc_query_md.restype = _ptr
    library.dnnl_primitive_desc_query_md.argtypes = [_ptr, ctypes.c_int, ctypes.c_int]
    library.dnnl_primitive_desc_query.argtypes = [_ptr, ctypes.c_int, ctypes.c_int, _ptr]
    library.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    library.dnnl_memory_desc_get_size.argtypes = [_ptr]
    library.dnnl_memory_desc_create_with_strides.argtypes = [
        ctypes.POINTER(_ptr),
        ctypes.c_int,
        _Dims,
        ctypes.c_int,
        _Dims,
    ]
    library.dnnl_memory_desc_create_with_tag.argtypes = [
        ctypes.POINTER(_ptr),
        ctypes.c_int,
        _Dims,
        ctypes.c_int,
        ctypes.c_int,
    ]
    library.dnnl_convolution_forward_primitive_desc_create.argtypes = [
        ctypes.POINTER(_ptr),
        _ptr,
        ctypes.c_int,
        ctypes.c_int,
        _ptr,
        _ptr,
        _ptr,
        _ptr,
        _Dims,
        _Dims,
        _Dims,
        _Dims,
        _ptr,
    ]
    library.dnnl_matmul_primitive_desc_create.argtypes = [ctypes.POINTER(_ptr), _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]
    library.dnnl_primitive_execute.argtypes = [_ptr, _ptr, ctypes.c_int, ctypes.POINTER(_ExecArg)]
    library.dnnl_memory_set_data_handle.argtypes = [_ptr, _ptr]
    library.dnnl_memory_create.argtypes = [ctypes.POINTER(_ptr), _ptr, _ptr, _ptr]
    library.dnnl_reorder_primitive_desc_create.argtypes = [ctypes.POINTER(_ptr), _ptr, _ptr, _ptr, _ptr, _ptr]
    for name in (
        "dnnl_memory_desc_destroy",
        "dnnl_primitive_desc_destroy",
        "dnnl_primitive_destroy",
        "dnnl_memory_destroy",
        "dnnl_primitive_attr_destroy",
        "dnnl_post_ops_destroy",
        "dnnl_stream_wait",
    ):
        getattr(library, name).argtypes = [_ptr]
    _check(library.dnnl_engine_create(ctypes.byref(_engine), _CPU, 0), "engine_create")
    _check(library.dnnl_stream_create(ctypes.byref(_stream), _engine, _DEFAULT_STREAM), "stream_create")
    _library = library
    if _threads:
        _apply_threads()
    return library


def _after_fork_in_child() -> None:
    """GNU OpenMP's thread pool does not survive a fork: a child that runs an OpenMP region its
    parent had started hangs. So a child of a process that has run oneDNN sees it as absent,
    and its convolutions take the numpy path (a process pool should still spawn, not fork)."""
    global _library, _load_error
    if _ran and _library is not None:
        _library = None
        _load_error = (
            "this process was forked from one that had run oneDNN, and GNU OpenMP's threads do "
            "not survive a fork; start worker processes with spawn to use oneDNN in them"
        )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def available() -> bool:
    """True where oneDNN convolutions can be used in this process."""
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _load_error


def set_threads(count: int) -> None:
    """oneDNN's OpenMP thread count for the calling thread's runs (0 leaves the default, one per
    core). Kept until the library loads, if it has not yet: a model without convolutions never
    loads it."""
    global _threads
    if count:
        _threads = count
        if _library is not None:
            _apply_threads()


def _apply_threads() -> None:
    from threadpoolctl import threadpool_limits  # finds the libgomp that libdnnl brought in

    threadpool_limits(limits=_threads, user_api="openmp")


def _dims(values) -> _Dims:
    return _Dims(*[int(v) for v in values])


class _Handle:
    """One oneDNN object and the call that destroys it, released with the Python object."""

    def __init__(self, destroy: str) -> None:
        self.pointer = _ptr()
        self._destroy = destroy

    def __del__(self) -> None:
        if self.pointer and _library is not None:
            getattr(_library, self._destroy)(self.pointer)


def _memory_desc(dims, strides=None) -> _Handle:
    """A float32 descriptor with these logical dims, laid out by `strides` (elements) or, without
    them, in whatever layout the primitive prefers."""
    desc = _Handle("dnnl_memory_desc_destroy")
    if strides is None:
        call = _library.dnnl_memory_desc_create_with_tag(
            ctypes.byref(desc.pointer), len(dims), _dims(dims), _F32, _FORMAT_ANY
        )
    else:
        call = _library.dnnl_memory_desc_create_with_strides(
            ctypes.byref(desc.pointer), len(dims), _dims(dims), _F32, _dims(strides)
        )
    _check(call, "memory_desc_create")
    return desc


def _memory(desc_pointer, data=None) -> _Handle:
    memory = _Handle("dnnl_memory_destroy")
    _check(
        _library.dnnl_memory_create(ctypes.byref(memory.pointer), desc_pointer, _engine, data),
        "memory_create",
    )
    return memory


def _execute(primitive: _Handle, args: list[tuple[int, _Handle]]) -> None:
    """Run a primitive on the process's stream and wait for it (callers hold _stream_lock)."""
    global _ran
    _ran = True
    array = (_ExecArg * len(args))(*[_ExecArg(arg, memory.pointer) for arg, memory in args])
    _check(_library.dnnl_primitive_execute(primitive.pointer, _stream, len(args), array), "primitive_execute")
    _check(_library.dnnl_stream_wait(_stream), "stream_wait")


def _aligned(nbytes: int) -> tuple[np.ndarray, int]:
    """A buffer of at least nbytes and its 64-byte-aligned address, as oneDNN's kernels like."""
    raw = np.empty(nbytes + 64, np.uint8)
    return raw, raw.ctypes.data + (-raw.ctypes.data) % 64


def _strides(shape, order) -> list[int]:
    """Element strides of a C-contiguous array whose axes, outermost first, are `order`, for
    the logical dims `shape` (N, C, *spatial): order (0, 2, 3, 1) is channels-last."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return strides


def reorder(user_desc: _Handle, target_desc, user_memory: _Handle, target_memory: _Handle) -> None:
    """Copy a weight from the caller's layout into the one a primitive chose (done once)."""
    reorder_desc = _Handle("dnnl_primitive_desc_destroy")
    _check(
        _library.dnnl_reorder_primitive_desc_create(
            ctypes.byref(reorder_desc.pointer), user_desc.pointer, _engine, target_desc, _engine, None
        ),
        "reorder_primitive_desc_create",
    )
    primitive = _Handle("dnnl_primitive_destroy")
    _check(_library.dnnl_primitive_create(ctypes.byref(primitive.pointer), reorder_desc.pointer), "primitive_create")
    with _stream_lock:
        _execute(primitive, [(_ARG_SRC, user_memory), (_ARG_DST, target_memory)])


def implementation(primitive_desc: _Handle) -> str:
    """oneDNN's name for the kernel behind a primitive descriptor."""
    name = ctypes.c_char_p()
    _check(
        _library.dnnl_primitive_desc_query(primitive_desc.pointer, _QUERY_IMPL_INFO, 0, ctypes.byref(name)),
        "primitive_desc_query",
    )
    return name.value.decode()


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
        if _load() is None:
            raise RuntimeError(f"oneDNN is not available: {_load_error}")
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
        src = _memory_desc(src_dims, _strides(src_dims, order))
        dst = _memory_desc(dst_dims, _strides(dst_dims, order))
        if group == 1:
            user_weight_dims = list(weight.shape)
        else:
            user_weight_dims = [group, m // group, *weight.shape[1:]]
        user_weight = _memory_desc(user_weight_dims, _strides(user_weight_dims, range(len(user_weight_dims))))
        any_weight = _memory_desc(user_weight_dims)
        bias_desc = _memory_desc([m], [1]) if bias else None

        attr = _Handle("dnnl_primitive_attr_destroy")
        _check(_library.dnnl_primitive_attr_create(ctypes.byref(attr.pointer)), "primitive_attr_create")
        post_ops = _Handle("dnnl_post_ops_destroy")
        _check(_library.dnnl_post_ops_create(ctypes.byref(post_ops.pointer)), "post_ops_create")
        if residual:
            _check(
                _library.dnnl_post_ops_append_binary(post_ops.pointer, _BINARY_ADD, dst.pointer),
                "append_binary",
            )
        _check(_library.dnnl_primitive_attr_set_post_ops(attr.pointer, post_ops.pointer), "set_post_ops")

        primitive_desc = _Handle("dnnl_primitive_desc_destroy")
        _check(
            _library.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(primitive_desc.pointer),
                _engine,
                _FORWARD_INFERENCE,
                _CONVOLUTION_DIRECT,
                src.pointer,
                any_weight.pointer,
                bias_desc.pointer if bias_desc else None,
                dst.pointer,
                _dims(strides),
                _dims([d - 1 for d in dilations]),  # oneDNN counts the gaps, ONNX the step
                _dims(begin),
                _dims(end),
                attr.pointer,
            ),
            "convolution_forward_primitive_desc_create",
        )
        self._primitive = _Handle("dnnl_primitive_destroy")
        _check(
            _library.dnnl_primitive_create(ctypes.byref(self._primitive.pointer), primitive_desc.pointer),
            "primitive_create",
        )

        # The weight in the primitive's own layout, reordered once.
        weight_desc = _library.dnnl_primitive_desc_query_md(primitive_desc.pointer, _QUERY_WEIGHTS_MD, 0)
        self._weight_buffer, address = _aligned(_library.dnnl_memory_desc_get_size(weight_desc))
        self._weight = _memory(weight_desc, address)
        source = np.ascontiguousarray(weight, dtype=np.float32)
        reorder(user_weight, weight_desc, _memory(user_weight.pointer, source.ctypes.data), self._weight)
        self._primitive_desc = primitive_desc

        # Memory objects whose data pointers are set on each run.
        self._src = _memory(src.pointer)
        self._dst = _memory(dst.pointer)
        self._bias = _memory(bias_desc.pointer) if bias_desc else None
        self._z = _memory(dst.pointer) if residual else None

    @property
    def implementation(self) -> str:
        """oneDNN's name for the kernel it chose, e.g. "brgconv:avx512_core"; "ref:any" means its
        slow reference loops (a layout or shape its fast kernels don't take)."""
        return implementation(self._primitive_desc)

    def __call__(
        self, x: np.ndarray, bias: np.ndarray | None = None, z: np.ndarray | None = None
    ) -> np.ndarray:
        """The convolution's output, a fresh float32 array. A strided x or z (a Transpose's view)
        is copied first: oneDNN reads the layout it was given at creation."""
        out = np.empty(self.out_shape, np.float32)
        if not math.prod(self.out_shape):
            return out
        x = np.ascontiguousarray(x)
        z = None if z is None else np.ascontiguousarray(z)
        bias = None if bias is None else np.ascontiguousarray(bias)
        args = [(_ARG_SRC, self._src), (_ARG_WEIGHTS, self._weight), (_ARG_DST, self._dst)]
        with _stream_lock:
            _library.dnnl_memory_set_data_handle(self._src.pointer, x.ctypes.data)
            _library.dnnl_memory_set_data_handle(self._dst.pointer, out.ctypes.data)
            if self._bias is not None:
                _library.dnnl_memory_set_data_handle(self._bias.pointer, bias.ctypes.data)
                args.append((_ARG_BIAS, self._bias))
            if self._z is not None:
                _library.dnnl_memory_set_data_handle(self._z.pointer, z.ctypes.data)
                args.append((_ARG_POST_OP_BASE | _ARG_SRC_1, self._z))
            _execute(self._primitive, args)
        return out
