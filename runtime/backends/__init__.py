"""The seam between kernels and the array library they run on.

Kernels compute with `self.xp` (numpy's API), never importing numpy's functions for array
work directly, so the same kernel runs on CuPy where a GPU is present. A backend names its
array module and how arrays cross to and from the host.

`numpy_backend` is the default. The CUDA one (runtime/backends/cuda.py, CuPy) is built by
`cuda_backend()` there, which imports CuPy on first use, so the runtime never needs it
installed; sessions pick it with `providers=["CUDAExecutionProvider", ...]` (runtime/providers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Backend:
    name: str
    xp: ModuleType

    @property
    def runs_cuda_kernels(self) -> bool:
        """Whether kernels take their CUDA fused paths (runtime/kernels/cuda_fused.py) on this
        backend: the one place a backend's name decides which code runs."""
        return self.name == "cuda"

    def from_host(self, array: np.ndarray) -> Any:
        return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        return array if isinstance(array, np.ndarray) else self.xp.asnumpy(array)

    def synchronize(self) -> None:
        """Wait for the work queued so far. A device backend runs kernels asynchronously, so the
        profiler calls this before reading a node's end time; on the host there is nothing to wait for."""


numpy_backend = Backend("cpu", np)
