"""`SessionOptions.enable_cpu_mem_arena`: freed intermediates' memory kept for the next run.

Our intermediates are numpy arrays, and numpy takes them from malloc. glibc serves a large
allocation with a fresh mmap and gives the pages back when it is freed (and trims the heap's
free top), so each run's buffers fault their pages in again on first touch: about 1,500 page
faults a run on ResNet-50, and with two threads writing a convolution's output they queue on
the process's page-table lock. onnxruntime keeps a memory arena for this; we ask glibc for the
same effect: allocations up to its mmap ceiling (32 MiB) come from the heap, and freed memory
stays there instead of being trimmed. A process then holds on to its peak working set, as an
onnxruntime session with its arena does.

It is process-wide and one-way (glibc has no per-session setting): the first session created
with the option on (the default, as onnxruntime's) applies it. Elsewhere than glibc it does
nothing. `bench/memory.py` shows the effect.
"""

from __future__ import annotations

import ctypes
import platform
import threading

_M_TRIM_THRESHOLD = -1  # mallopt parameters, glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_CEILING = 32 * 1024 * 1024  # the largest M_MMAP_THRESHOLD glibc accepts on 64-bit
_TRIM_CEILING = 2**31 - 1  # mallopt takes an int: trim only beyond 2 GiB of free heap top

_lock = threading.Lock()
_applied: bool | None = None  # None: not tried; True/False: what mallopt answered


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse; True where it took effect."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = _apply()
        return _applied


def _apply() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success, 0 on a value it refuses.
    trimmed = mallopt(_M_TRIM_THRESHOLD, _TRIM_CEILING)
    mapped = mallopt(_M_MMAP_THRESHOLD, _MMAP_CEILING)
    return bool(trimmed and mapped)
