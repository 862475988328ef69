"""fusionwatch's own ONNX graph optimizer: ONNX Runtime-compatible levels, rules and reports.

    from optimizer import optimize
    result = optimize("model.onnx", level="extended")
    result.report.fusions      # {"com.microsoft.BiasGelu": 2, ...}
    result.report.near_misses  # why the rest did not fuse
"""

from optimizer.driver import optimize
from optimizer.levels import LEVEL_NAMES, LEVELS, known_rule_names, rules_for_level
from optimizer.model_io import (
    DEFAULT_LIMITS,
    LoadLimits,
    ModelLoadError,
    UnsafeModelError,
    check_model_file,
    load_model,
    read_model_proto,
    save_model,
)
from optimizer.report import NearMiss, OptimizeReport, OptimizeResult

__all__ = [
    "DEFAULT_LIMITS",
    "LEVEL_NAMES",
    "LEVELS",
    "LoadLimits",
    "ModelLoadError",
    "UnsafeModelError",
    "check_model_file",
    "read_model_proto",
    "NearMiss",
    "OptimizeReport",
    "OptimizeResult",
    "known_rule_names",
    "load_model",
    "optimize",
    "rules_for_level",
    "save_model",
]
