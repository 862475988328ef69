"""Custom ops, for models whose exports carry ops no engine ships (a fusion barrier worth measuring).

An operator of the service lists Python modules in FUSIONWATCH_CUSTOM_OPS (comma-separated); each may
define `KERNELS` (kernel classes for our executor, runtime.kernels.base.Kernel subclasses) and
`ORT_LIBRARIES` (shared libraries to register with onnxruntime, e.g. onnxruntime-extensions' for ops
written with its `onnx_op` decorator). The setting is the server's, never a project's: importing a
module runs its code.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CustomOps:
    kernels: tuple[type, ...] = ()
    ort_libraries: tuple[str, ...] = ()


NO_CUSTOM_OPS = CustomOps()


def load_custom_ops(modules: Sequence[str] | str) -> CustomOps:
    if isinstance(modules, str):
        modules = [m.strip() for m in modules.split(",") if m.strip()]
    kernels: list[type] = []
    libraries: list[str] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            raise ValueError(f"custom-op module {name!r} (FUSIONWATCH_CUSTOM_OPS) cannot be imported: {error}") from error
        kernels.extend(getattr(module, "KERNELS", ()))
        libraries.extend(str(path) for path in getattr(module, "ORT_LIBRARIES", ()))
    return CustomOps(tuple(kernels), tuple(libraries))
