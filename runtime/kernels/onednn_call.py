"""A oneDNN primitive with one source and one destination run in one compiled call: both data
handles set, the primitive executed and the stream waited on from numba-compiled code.

Why: through ctypes the same sequence is four foreign calls and two `ndarray.ctypes` look-ups
(each look-up builds a helper object), a few microseconds a product: on the AMD EPYC of
docs/benchmarks.md (issue 31), `python -m bench.gemm_micro --threads 1 --entrants onednn/sleep
--shapes 16x128x512,16x512x128` went from 32 and 28 µs a call to 28 and 25 (best of 3,000, the
race's bias-GELU pass included), the tiny BERT's feed-forward products. Compiled code reads an
array's data pointer in place and calls the library through its function addresses.

The addresses are arguments, not constants baked into the machine code, so the compiled
function does not depend on where libdnnl was loaded and can be cached on disk like the row
loops (runtime/kernels/compiled.py). It releases the GIL, as ctypes does around its calls.
Callers hold onednn.STREAM_LOCK: a primitive's memory objects are shared by every call.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.extending import intrinsic

from runtime.kernels import onednn

_POINTER = llvm_ir.IntType(8).as_pointer()
_STATUS = llvm_ir.IntType(32)

# Positions in a PreparedCall's handle vector.
_SET_HANDLE, _EXECUTE, _WAIT, _SRC, _DST, _PRIMITIVE, _STREAM, _ARG_COUNT, _ARGS = range(9)


def _pointer_call(builder, address, arguments, argument_types):
    """Call the C function at `address` (an intp) returning a dnnl_status_t (int)."""
    function_type = llvm_ir.FunctionType(_STATUS, argument_types)
    function = builder.inttoptr(address, function_type.as_pointer())
    return builder.call(function, arguments)


@intrinsic
def _call_with_two_pointers(typingctx, address, first, second):
    """status f(void *, void *): dnnl_memory_set_data_handle."""
    signature = types.int32(types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        pointers = [builder.inttoptr(value, _POINTER) for value in args[1:]]
        return _pointer_call(builder, args[0], pointers, [_POINTER, _POINTER])

    return signature, codegen


@intrinsic
def _call_with_one_pointer(typingctx, address, first):
    """status f(void *): dnnl_stream_wait."""
    signature = types.int32(types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return _pointer_call(builder, args[0], [builder.inttoptr(args[1], _POINTER)], [_POINTER])

    return signature, codegen


@intrinsic
def _call_execute(typingctx, address, primitive, stream, count, arguments):
    """status f(primitive, stream, int, const dnnl_exec_arg_t *): dnnl_primitive_execute."""
    signature = types.int32(types.intp, types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        values = [
            builder.inttoptr(args[1], _POINTER),
            builder.inttoptr(args[2], _POINTER),
            builder.trunc(args[3], _STATUS),
            builder.inttoptr(args[4], _POINTER),
        ]
        return _pointer_call(builder, args[0], values, [_POINTER, _POINTER, _STATUS, _POINTER])

    return signature, codegen


def _compiled(function):
    """njit, cached on disk where numba finds a place to write (see compiled._compiled)."""
    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError as error:
        if "cannot cache" not in str(error):
            raise
        return njit(cache=False, nogil=True)(function)


@_compiled
def _run(handles, source, destination):
    """Set the two data handles, execute, wait; the first non-zero status, else 0."""
    status = _call_with_two_pointers(handles[_SET_HANDLE], handles[_SRC], source.ctypes.data)
    if status != 0:
        return status
    status = _call_with_two_pointers(handles[_SET_HANDLE], handles[_DST], destination.ctypes.data)
    if status != 0:
        return status
    status = _call_execute(
        handles[_EXECUTE], handles[_PRIMITIVE], handles[_STREAM], handles[_ARG_COUNT], handles[_ARGS]
    )
    if status != 0:
        return status
    return _call_with_one_pointer(handles[_WAIT], handles[_STREAM])


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


class PreparedCall:
    """`call(source, destination)` runs `primitive` on these arrays' memory: the primitive's
    source and destination memory objects are pointed at them, the rest of `args` (a weight
    reordered once) stays as prepared. Arrays are C-contiguous and of the shapes the memory
    objects describe; the caller checks that."""

    def __init__(self, primitive: onednn.Handle, source: onednn.Handle, destination: onednn.Handle, args) -> None:
        library = onednn.library()
        self._handles = np.array(
            [
                _address(library.dnnl_memory_set_data_handle),
                _address(library.dnnl_primitive_execute),
                _address(library.dnnl_stream_wait),
                source.pointer.value or 0,
                destination.pointer.value or 0,
                primitive.pointer.value or 0,
                onednn.stream().value or 0,
                len(args),
                ctypes.addressof(args),
            ],
            np.intp,
        )
        # The vector holds bare addresses: what they point at lives as long as this call.
        self._owners = (primitive, source, destination, args)
        # Counted as run from here (the fork check in onednn.py), rather than on every call.
        onednn.note_run()

    def __call__(self, source: np.ndarray, destination: np.ndarray) -> None:
        with onednn.STREAM_LOCK:
            status = _run(self._handles, source, destination)
        onednn.check(status, "primitive_execute")
