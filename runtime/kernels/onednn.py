"""The oneDNN binding: libdnnl loaded with ctypes, and the few calls our primitives need
(descriptors, memory objects, reorders, execution on the process's one CPU stream). The
primitives themselves live beside the kernels that use them: convolutions in
runtime/kernels/onednn_conv.py, products against a constant weight in onednn_matmul.py,
attention's per-head products in onednn_heads.py.

oneDNN comes from the optional `onednn-cpu-gomp` wheel (`pip install fusionwatch[onednn]`,
which `make` installs): libdnnl is found through that wheel's file list (or sys.prefix/lib) and
loaded on first use. It links the system's GNU OpenMP (libgomp). Where it is missing or the
platform is not x86_64 Linux, `available()` is False and the kernels keep their numpy paths, to
the same results within fp32 tolerance (tests/runtime/test_onednn.py runs both).

Threads: oneDNN's OpenMP workers follow `set_threads` (`intra_op_num_threads`). They are Intel
OpenMP's where the mkl extra is installed (libiomp5 answers oneDNN's GNU OpenMP calls: one pool
with MKL's, whose wait between calls a session measures: runtime/kernels/openmp.py); else
libgomp's, with OMP_WAIT_POLICY set to passive unless the user set it, so that those workers
sleep between calls instead of spinning beside numba's work.
"""

from __future__ import annotations

import ctypes
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
QUERY_WEIGHTS_MD = 131  # dnnl_query_weights_md
_QUERY_IMPL_INFO = 8  # dnnl_query_impl_info_str
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41  # DNNL_ARG_*
ARG_SRC_1 = 2
ARG_POST_OP_BASE = 32768  # DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) = base * (i + 1)
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
STREAM_LOCK = threading.Lock()
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


def check(status: int, call: str) -> None:
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
    check(library.dnnl_engine_create(ctypes.byref(_engine), _CPU, 0), "engine_create")
    check(library.dnnl_stream_create(ctypes.byref(_stream), _engine, _DEFAULT_STREAM), "stream_create")
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


def library() -> ctypes.CDLL:
    """The loaded libdnnl, for a primitive's own create calls; callers have checked `available()`."""
    return _library


def engine() -> ctypes.c_void_p:
    """The process's CPU engine, which every primitive and memory object is created on."""
    return _engine


def stream() -> ctypes.c_void_p:
    """The process's one CPU stream, which every primitive runs on."""
    return _stream


def note_run() -> None:
    """Count the process as having run a primitive (see `_after_fork_in_child`), for callers that
    execute primitives without `execute`."""
    global _ran
    _ran = True


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


def dims_array(values) -> _Dims:
    """Dimensions or strides as the fixed-size int64 array oneDNN's calls take."""
    return _Dims(*[int(v) for v in values])


class Handle:
    """One oneDNN object and the call that destroys it, released with the Python object."""

    def __init__(self, destroy: str) -> None:
        self.pointer = _ptr()
        self._destroy = destroy

    def __del__(self) -> None:
        if self.pointer and _library is not None:
            getattr(_library, self._destroy)(self.pointer)


def memory_desc(dims, strides=None) -> Handle:
    """A float32 descriptor with these logical dims, laid out by `strides` (elements) or, without
    them, in whatever layout the primitive prefers."""
    desc = Handle("dnnl_memory_desc_destroy")
    if strides is None:
        call = _library.dnnl_memory_desc_create_with_tag(
            ctypes.byref(desc.pointer), len(dims), dims_array(dims), _F32, _FORMAT_ANY
        )
    else:
        call = _library.dnnl_memory_desc_create_with_strides(
            ctypes.byref(desc.pointer), len(dims), dims_array(dims), _F32, dims_array(strides)
        )
    check(call, "memory_desc_create")
    return desc


def memory(desc_pointer, data=None) -> Handle:
    memory = Handle("dnnl_memory_destroy")
    check(
        _library.dnnl_memory_create(ctypes.byref(memory.pointer), desc_pointer, _engine, data),
        "memory_create",
    )
    return memory


def execute(primitive: Handle, args: list[tuple[int, Handle]]) -> None:
    """Run a primitive on the process's stream and wait for it (callers hold STREAM_LOCK)."""
    global _ran
    _ran = True
    array = (_ExecArg * len(args))(*[_ExecArg(arg, memory.pointer) for arg, memory in args])
    check(_library.dnnl_primitive_execute(primitive.pointer, _stream, len(args), array), "primitive_execute")
    check(_library.dnnl_stream_wait(_stream), "stream_wait")


def prepared_args(args: list[tuple[int, Handle]]) -> ctypes.Array:
    """A primitive's execute arguments built once, for onednn_call.PreparedCall: the memory objects stay,
    only the data handles they point at change between calls (building the array took ~1.7 µs a
    call, a tenth of a tiny model's product)."""
    return (_ExecArg * len(args))(*[_ExecArg(arg, memory.pointer) for arg, memory in args])


def aligned(nbytes: int) -> tuple[np.ndarray, int]:
    """A buffer of at least nbytes and its 64-byte-aligned address, as oneDNN's kernels like."""
    raw = np.empty(nbytes + 64, np.uint8)
    return raw, raw.ctypes.data + (-raw.ctypes.data) % 64


def strides_in_order(shape, order) -> list[int]:
    """Element strides of a C-contiguous array whose axes, outermost first, are `order`, for
    the logical dims `shape` (N, C, *spatial): order (0, 2, 3, 1) is channels-last."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return strides


def reorder(user_desc: Handle, target_desc, user_memory: Handle, target_memory: Handle) -> None:
    """Copy a weight from the caller's layout into the one a primitive chose (done once)."""
    reorder_desc = Handle("dnnl_primitive_desc_destroy")
    check(
        _library.dnnl_reorder_primitive_desc_create(
            ctypes.byref(reorder_desc.pointer), user_desc.pointer, _engine, target_desc, _engine, None
        ),
        "reorder_primitive_desc_create",
    )
    primitive = Handle("dnnl_primitive_destroy")
    check(_library.dnnl_primitive_create(ctypes.byref(primitive.pointer), reorder_desc.pointer), "primitive_create")
    with STREAM_LOCK:
        execute(primitive, [(ARG_SRC, user_memory), (ARG_DST, target_memory)])


def create_primitive(primitive_desc: Handle) -> Handle:
    """The primitive a descriptor describes."""
    primitive = Handle("dnnl_primitive_destroy")
    check(_library.dnnl_primitive_create(ctypes.byref(primitive.pointer), primitive_desc.pointer), "primitive_create")
    return primitive


def reordered_weight(primitive_desc: Handle, user_desc: Handle, source: np.ndarray) -> tuple[np.ndarray, Handle]:
    """A constant weight, laid out as `user_desc` says in `source`, copied once into the layout the
    primitive chose: the buffer that holds it, and the memory object over that buffer."""
    weight_desc = _library.dnnl_primitive_desc_query_md(primitive_desc.pointer, QUERY_WEIGHTS_MD, 0)
    buffer, address = aligned(_library.dnnl_memory_desc_get_size(weight_desc))
    weight = memory(weight_desc, address)
    reorder(user_desc, weight_desc, memory(user_desc.pointer, source.ctypes.data), weight)
    return buffer, weight


def implementation(primitive_desc: Handle) -> str:
    """oneDNN's name for the kernel behind a primitive descriptor."""
    name = ctypes.c_char_p()
    check(
        _library.dnnl_primitive_desc_query(primitive_desc.pointer, _QUERY_IMPL_INFO, 0, ctypes.byref(name)),
        "primitive_desc_query",
    )
    return name.value.decode()
