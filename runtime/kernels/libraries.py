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


@contextmanager
def using(choices: Mapping[str, str]) -> Iterator[None]:
    unknown = {f: lib for f, lib in choices.items() if lib not in CANDIDATES.get(f, ())}
    if unknown:
        raise ValueError(f"unknown kernel libraries {unknown}; the candidates are {CANDIDATES}")
    token = _CHOSEN.set(dict(choices))
    try:
        with openmp.waiting(choices.get("wait")):
            yield
    finally:
        _CHOSEN.reset(token)
