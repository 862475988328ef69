"""The CUDA backend: the runtime's kernels on CuPy arrays, on the current CUDA device.

    from runtime.backends.cuda import cuda_backend
    session = InferenceSession(path, options, backend=cuda_backend())
    # or, as with onnxruntime:
    session = InferenceSession(path, options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])

Every kernel runs its array-API path with `xp` = cupy; weights are copied to the device once,
when the plan is built, feeds on every run, and `session.run` copies its outputs back (which
also waits for the device). The host-only fast paths step aside by themselves: the numba loops
take only numpy arrays (`compiled.accepts`) and MKL's packed GEMM only numpy (`xp is np`).

Products run on cuBLAS in full float32: CuPy uses TF32 tensor cores only when the environment
sets CUPY_TF32=1, which would loosen float32 results to about 1e-3 relative.

CuPy is imported here, on first use, never when the runtime is imported, so the runtime needs
it only where this backend is asked for; a missing CuPy or a machine without a usable CUDA
device is a `CudaUnavailableError` that says which and what to install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.backends import Backend

INSTALL_HINT = "pip install cupy-cuda12x (or cupy-cuda13x, matching the CUDA driver)"


class CudaUnavailableError(RuntimeError):
    """The CUDA backend cannot start here: CuPy is missing or sees no usable CUDA device."""


@dataclass(frozen=True)
class CupyBackend(Backend):
    def from_host(self, array: np.ndarray) -> Any:
        if array.dtype.kind in "OSUV":
            # CuPy holds numbers only; say which tensor kind failed rather than CuPy's bare dtype error.
            raise TypeError(f"the CUDA backend holds numeric tensors only, not {array.dtype} ones")
        return self.xp.asarray(array)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()


def cuda_backend() -> CupyBackend:
    """The CuPy backend on the current CUDA device, or CudaUnavailableError saying why not.

    Not cached: CuPy's import is cached by Python already, and a cached backend would hide a
    device that went away (or a test that takes CuPy away) behind an earlier success."""
    try:
        import cupy
    except ImportError as error:
        raise CudaUnavailableError(
            f"the CUDA backend needs CuPy, which is not importable here ({error}); {INSTALL_HINT}"
        ) from error
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise CudaUnavailableError(f"CuPy {cupy.__version__} found no usable CUDA device: {error}") from error
    if count < 1:
        raise CudaUnavailableError(f"CuPy {cupy.__version__} found no CUDA device")
    return CupyBackend("cuda", cupy)
