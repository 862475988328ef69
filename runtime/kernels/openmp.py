"""The one OpenMP runtime MKL and oneDNN share, and how long its idle workers wait before sleeping.

One runtime, not two: MKL's threads are Intel OpenMP's (libiomp5, from the intel-openmp wheel
the mkl wheel brings), and the onednn-cpu-gomp build of oneDNN calls GNU OpenMP's entry points
(GOMP_parallel and the like), which libiomp5 also exports. Loaded first and globally, libiomp5
serves both, so MKL's products and oneDNN's take turns on one pool of workers instead of two
pools each waking its own. Without it (no mkl extra), oneDNN binds to the system's libgomp and
this module's settings do nothing (`available()` is False).

How long a worker spins after a parallel region before it sleeps (Intel OpenMP's blocktime) is
a measured choice (runtime/kernel_choice.py), the two candidates being:
  "sleep"  0 ms, the default and what the project ran before: a worker sleeps as soon as its
           call is done, leaving the core to the single-thread passes between products and
           to other processes (KMP_BLOCKTIME's own 200 ms made BERT-base 4x slower on the
           loaded 2-core Xeon: runtime/kernels/gemm.py).
  "spin"   1 ms: a worker spins through the short single-thread passes between a model's
           products (0.05-0.6 ms on BERT-base) and starts the next call at once, as
           onnxruntime's and OpenBLAS's spinning workers do. A sleeping worker has to be
           woken for every call, and the call waits for it (`python -m bench.openmp_wait`
           counts the calls that had both threads working).
           On a quiet VM the idle virtual CPU of a sleeping worker halts (this Firecracker
           guest has halt polling off: haltpoll.guest_halt_poll_ns=0), and a race there
           measured oneDNN's BERT-base products, workers sleeping, at 237 ms against 104 on
           the same CPU under load, where no CPU sits idle.
The race times each OpenMP library with both; `waiting` (which `libraries.using` enters) applies
the session's choice to the calling thread's parallel regions for the duration of a run
(libiomp5 keeps blocktime per thread), so sessions with different choices do not disturb one
another.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

from runtime.kernels.native import wheel_library

BLOCKTIME_MS = {"sleep": 0, "spin": 1}
WAITS = list(BLOCKTIME_MS)  # in the order a tie goes to

_runtime: ctypes.CDLL | None = None
_loaded = False
_user_blocktime: str | None = None  # KMP_BLOCKTIME as the user set it before we loaded, if they did


def load() -> ctypes.CDLL | None:
    """libiomp5, loaded once with its symbols global (before MKL and oneDNN load, so that both
    bind to it); None where the intel-openmp wheel is not installed."""
    global _runtime, _loaded, _user_blocktime
    if _loaded:
        return _runtime
    _loaded = True
    path = wheel_library("intel-openmp", "libiomp5.so")
    if path is None:
        return None
    # Read when libiomp5 starts its pool: sleeping is the default between runs; a session
    # that measured spinning faster sets it for its runs (`waiting`), unless the user set it.
    _user_blocktime = os.environ.get("KMP_BLOCKTIME")
    os.environ.setdefault("KMP_BLOCKTIME", "0")
    runtime = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    runtime.kmp_set_blocktime.argtypes = [ctypes.c_int]
    runtime.kmp_set_blocktime.restype = None
    runtime.kmp_get_blocktime.restype = ctypes.c_int
    _runtime = runtime
    return runtime


def available() -> bool:
    return load() is not None


def user_blocktime() -> str | None:
    """KMP_BLOCKTIME where the user set it: then it holds, and no wait is raced or applied."""
    load()
    return _user_blocktime


def settable() -> bool:
    """Whether sessions choose the wait here: Intel OpenMP is loaded and the user left it alone."""
    return available() and _user_blocktime is None


def blocktime_for(wait: str | None) -> int | None:
    """The blocktime (ms) that `waiting(wait)` sets, or None where it leaves the wait as it is."""
    if wait is not None and wait not in BLOCKTIME_MS:
        raise ValueError(f"unknown OpenMP wait {wait!r}; the candidates are {WAITS}")
    if wait is None or load() is None or _user_blocktime is not None:
        return None
    return BLOCKTIME_MS[wait]


def swap_blocktime(milliseconds: int) -> int:
    """Set the calling thread's blocktime; the one it replaced. Only where `blocktime_for` gave one."""
    before = _runtime.kmp_get_blocktime()
    _runtime.kmp_set_blocktime(milliseconds)
    return before


@contextlib.contextmanager
def waiting(wait: str | None) -> Iterator[None]:
    """Run the block with the calling thread's workers waiting as `wait` says ("sleep" or
    "spin"); None, no libiomp5, or a KMP_BLOCKTIME the user set leaves the wait as it is."""
    if wait is not None and wait not in BLOCKTIME_MS:
        raise ValueError(f"unknown OpenMP wait {wait!r}; the candidates are {WAITS}")
    runtime = load() if wait is not None else None
    if runtime is None or _user_blocktime is not None:
        yield
        return
    before = runtime.kmp_get_blocktime()
    runtime.kmp_set_blocktime(BLOCKTIME_MS[wait])
    try:
        yield
    finally:
        runtime.kmp_set_blocktime(before)
