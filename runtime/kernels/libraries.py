"""Which library a session's kernels use for each kernel family that has a choice of several.

Products against constant weights ("gemm") can run on MKL's packed SGEMM, oneDNN's matmul or
numpy's BLAS (OpenBLAS); channels-last convolutions ("conv") on oneDNN or im2col + numpy's
BLAS; MKL's and oneDNN's OpenMP workers, between calls, sleep or spin a while ("wait"). Which is fastest depends on the CPU (MKL takes its AVX-512 paths on Intel only), so a
session measures and decides (runtime/kernel_choice.py), then builds and runs its kernels
inside `using(choices)`; the kernels read `chosen(family)`.

A context variable rather than a kernel argument: every kernel family would otherwise take a
parameter only two of them read, and a kernel built outside a session (a test, a benchmark)
gets `None`, the default each library module documents (MKL where installed, oneDNN where
installed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from runtime.kernels import openmp

# Candidates per family, in the order a tie goes to (the one the project used before measuring).
CANDIDATES: dict[str, list[str]] = {
    "gemm": ["mkl-packed", "onednn", "numpy"],
    "conv": ["onednn", "numpy"],
    # How MKL's and oneDNN's idle OpenMP workers wait between calls (runtime/kernels/openmp.py).
    "wait": openmp.WAITS,
}

_CHOSEN: ContextVar[Mapping[str, str] | None] = ContextVar("fusionwatch_kernel_libraries", default=None)


def chosen(family: str) -> str | None:
    """The library the session being built or run chose for `family`; None outside a session."""
    choices = _CHOSEN.get()
    return None if choices is None else choices.get(family)


def _checked(choices: Mapping[str, str]) -> dict[str, str]:
    unknown = {f: lib for f, lib in choices.items() if lib not in CANDIDATES.get(f, ())}
    if unknown:
        raise ValueError(f"unknown kernel libraries {unknown}; the candidates are {CANDIDATES}")
    return dict(choices)


@contextmanager
def using(choices: Mapping[str, str]) -> Iterator[None]:
    token = _CHOSEN.set(_checked(choices))
    try:
        with openmp.waiting(choices.get("wait")):
            yield
    finally:
        _CHOSEN.reset(token)


class Using:
    """`using(choices)` for a session's every run, checked once: `with session_choices():` enters
    them for one run. Each call makes its own context, so runs on several threads do not share
    one; entering costs a context-variable set and, where the wait is applied, two of libiomp5's
    calls (the generator-based `using` cost ~4 µs a run, 2% of a tiny model's)."""

    __slots__ = ("_blocktime", "_choices")

    def __init__(self, choices: Mapping[str, str]) -> None:
        self._choices = _checked(choices)
        self._blocktime = openmp.blocktime_for(self._choices.get("wait"))

    def __call__(self) -> _Entered:
        return _Entered(self._choices, self._blocktime)


class _Entered:
    __slots__ = ("_before", "_blocktime", "_choices", "_token")

    def __init__(self, choices: dict[str, str], blocktime: int | None) -> None:
        self._choices, self._blocktime = choices, blocktime

    def __enter__(self) -> None:
        self._token = _CHOSEN.set(self._choices)
        if self._blocktime is not None:
            self._before = openmp.swap_blocktime(self._blocktime)

    def __exit__(self, *exc_info: object) -> None:
        if self._blocktime is not None:
            openmp.swap_blocktime(self._before)
        _CHOSEN.reset(self._token)
