"""Finding a shared library that a pip wheel installed, for the ctypes bindings to MKL
(gemm.py) and oneDNN (onednn.py): such wheels put their .so files in the environment's lib/
folder, outside any Python package, so the wheel's own file list is asked first.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path


def wheel_library(distribution: str, name: str) -> Path | None:
    """The first existing file named `name`* that `distribution` installed, else one in
    sys.prefix/lib (a conda or hand-made environment); None where there is neither."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    candidates = [Path(f.locate()).resolve() for f in files if Path(str(f)).name.startswith(name)]
    candidates += sorted(Path(sys.prefix, "lib").glob(f"{name}*"))
    return next((path for path in candidates if path.is_file()), None)
