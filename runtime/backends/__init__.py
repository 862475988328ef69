"""The seam between kernels and the array library they run on.

Kernels compute with `self.xp` (numpy's API), never importing numpy's functions for array
work directly, so the same kernel runs on CuPy where a GPU is present. A backend names its
array module and how arrays cross to and from the host.
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

    def from_host(self, array: np.ndarray) -> Any:
        return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        return array if isinstance(array, np.ndarray) else self.xp.asnumpy(array)


numpy_backend = Backend("cpu", np)
