"""Session options, shaped like onnxruntime.SessionOptions so caller code carries over.

Levels take our names ("all", "extended", "basic", "layout", "disabled"), ONNX Runtime's
(`ORT_ENABLE_ALL`, ...), or an `onnxruntime.GraphOptimizationLevel` member (matched by its
`.name`, so the runtime never imports onnxruntime).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from optimizer import LEVEL_NAMES

ORT_LEVEL_NAMES = {
    "ORT_ENABLE_ALL": "all",
    "ORT_ENABLE_LAYOUT": "layout",
    "ORT_ENABLE_EXTENDED": "extended",
    "ORT_ENABLE_BASIC": "basic",
    "ORT_DISABLE_ALL": "disabled",
}


def normalize_level(level: Any) -> str:
    """Our level name for any accepted spelling; a clear error for anything else."""
    name = getattr(level, "name", level)  # an onnxruntime GraphOptimizationLevel member
    if isinstance(name, str):
        if name.lower() in LEVEL_NAMES:
            return name.lower()
        if name.upper() in ORT_LEVEL_NAMES:
            return ORT_LEVEL_NAMES[name.upper()]
    choices = ", ".join([*LEVEL_NAMES, *ORT_LEVEL_NAMES])
    raise ValueError(f"unknown graph_optimization_level {level!r}; choose one of {choices}")


@dataclass
class SessionOptions:
    graph_optimization_level: Any = "all"
    disabled_optimizers: list[str] = field(default_factory=list)
    optimized_model_filepath: str | None = None
    enable_profiling: bool = False
    profile_file_prefix: str = "fusionwatch_profile"
    intra_op_num_threads: int = 0  # 0: leave the BLAS library's own default
    enable_gelu_approximation: bool = False
    # Keep freed intermediates' memory for the next run, as onnxruntime's arena does
    # (runtime/memory.py; process-wide, applied by the first session that asks).
    enable_cpu_mem_arena: bool = True
    # Where a model given as bytes or a ModelProto keeps its external data (onnxruntime's
    # session.model_external_initializers_file_folder_path). A path's own directory is used for
    # a path; without either, external data is refused (optimizer/model_io.py says why).
    external_data_dir: str | os.PathLike | None = None
    # A kernel family's library fixed instead of measured, e.g. {"gemm": "numpy"} (families and
    # candidates: runtime/kernels/libraries.py; runtime/kernel_choice.py measures the rest).
    kernel_libraries: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; run again at session creation since ORT-style code assigns fields later."""
        normalize_level(self.graph_optimization_level)
        if isinstance(self.disabled_optimizers, str):
            raise ValueError("disabled_optimizers takes a list of rule names, not one string")
        if not isinstance(self.enable_cpu_mem_arena, bool):
            raise ValueError(f"enable_cpu_mem_arena must be True or False, got {self.enable_cpu_mem_arena!r}")
        if not isinstance(self.kernel_libraries, dict):
            raise ValueError(f"kernel_libraries takes a dict such as {{'gemm': 'numpy'}}, got {self.kernel_libraries!r}")
        if not isinstance(self.intra_op_num_threads, int) or self.intra_op_num_threads < 0:
            raise ValueError(f"intra_op_num_threads must be an int >= 0, got {self.intra_op_num_threads!r}")

    @property
    def level(self) -> str:
        return normalize_level(self.graph_optimization_level)
