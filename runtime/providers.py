"""onnxruntime's `providers=` list, read as a choice of backend.

    InferenceSession(path, options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])

The list is in order of preference and the first provider that can start here wins; the whole
graph runs on it (our executor does not split a graph between devices as ONNX Runtime can).
A provider that cannot start is passed over, with a warning saying why, only when a later one
in the list can: a list naming CUDA alone fails on a machine without CUDA, as the caller asked
for nothing else. `session.get_providers()` names the provider that runs.

Names are onnxruntime's ("CUDAExecutionProvider") or the ones our traces carry ("FusionwatchCUDA").
An entry may be onnxruntime's `(name, options)` pair with empty options; options themselves
(device_id, arena settings) are not supported and are an error rather than silently ignored.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from runtime.backends import Backend, numpy_backend
from runtime.backends.cuda import CudaUnavailableError, cuda_backend

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

# Provider name -> what builds its backend (raising CudaUnavailableError where it cannot start).
_BUILDERS: dict[str, Callable[[], Backend]] = {
    CPU_PROVIDER: lambda: numpy_backend,
    "FusionwatchCPU": lambda: numpy_backend,
    CUDA_PROVIDER: cuda_backend,
    "FusionwatchCUDA": cuda_backend,
}


class ProviderFallbackWarning(UserWarning):
    """A preferred provider could not start and a later one in the list runs the session."""


def provider_names(providers: Sequence[Any]) -> list[str]:
    """The names in an onnxruntime-style providers list; ValueError for anything we don't run."""
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise ValueError(f"providers takes a list of provider names, not {type(providers).__name__}")
    if not providers:
        raise ValueError(f"providers is empty; name one of {sorted(_BUILDERS)}")
    names = []
    for entry in providers:
        name, options = (entry, {}) if isinstance(entry, str) else _pair(entry)
        if name not in _BUILDERS:
            raise ValueError(f"unknown execution provider {name!r}; fusionwatch runs {sorted(_BUILDERS)}")
        if options:
            raise ValueError(
                f"provider options are not supported (got {dict(options)} for {name}); "
                "the CUDA provider runs on CuPy's current device"
            )
        names.append(name)
    return names


def _pair(entry: Any) -> tuple[str, Any]:
    if isinstance(entry, tuple | list) and len(entry) == 2 and isinstance(entry[0], str):
        return entry[0], entry[1] or {}
    raise ValueError(f"a provider is a name or a (name, options) pair, not {entry!r}")


def backend_for(providers: Sequence[Any]) -> Backend:
    """The backend of the first provider in `providers` that starts here; see the module docstring."""
    names = provider_names(providers)
    passed_over = []
    for name in names:
        try:
            backend = _BUILDERS[name]()
        except CudaUnavailableError as error:
            passed_over.append(f"{name}: {error}")
            continue
        if passed_over:
            warnings.warn(
                f"running on {name}; passed over {'; '.join(passed_over)}",
                ProviderFallbackWarning,
                stacklevel=3,
            )
        return backend
    raise CudaUnavailableError(
        f"none of the requested providers {names} can run here, and {CPU_PROVIDER} was not among them "
        f"to fall back on: {'; '.join(passed_over)}"
    )
