"""Engines: run one model through one engine at one optimization level, get fused-op counts and timings.

    from service.adapters.engines import run_engine
    result = run_engine("fusionwatch", "model.onnx", "extended", runs=10)
    result.fusions            # {"com.microsoft.BiasGelu": 2, ...}
    result.execute_ms.median  # SequentialExecutor::Execute, warm-up runs left out

Engines: `fusionwatch` (native.py: our optimizer and SequentialExecutor) and `onnxruntime`
(onnxruntime.py: the reference). Both get the same feeds (feeds.py) and fill the same
EngineResult (result.py). A model an engine cannot load or run raises EngineError (base.py);
an unknown engine or level, or a bad count, is a ValueError raised before anything runs.
"""

from __future__ import annotations

from pathlib import Path

from optimizer import DEFAULT_LIMITS, LEVEL_NAMES, LoadLimits, ModelLoadError, check_model_file
from service.adapters.engines.base import Engine, EngineError
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import FeedError, make_feeds, sequence_inputs
from service.adapters.engines.native import FusionwatchEngine
from service.adapters.engines.onnxruntime import OnnxruntimeEngine
from service.adapters.engines.result import EngineResult, TimingStats

# Ours first: it is what is being watched; onnxruntime is the reference beside it.
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (FusionwatchEngine(), OnnxruntimeEngine())}

__all__ = [
    "ENGINES",
    "Engine",
    "EngineError",
    "EngineResult",
    "FeedError",
    "TimingStats",
    "engine_named",
    "run_engine",
]


def engine_named(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def run_engine(
    name: str,
    model_path: str | Path,
    level: str,
    runs: int = 10,
    warmup: int = 2,
    threads: int = 0,
    sequence_length: int = 128,
    limits: LoadLimits = DEFAULT_LIMITS,
    disabled: list[str] | tuple[str, ...] = (),
    custom_ops: CustomOps = NO_CUSTOM_OPS,
) -> EngineResult:
    """Optimize MODEL at `level` with engine `name`, run it `warmup + runs` times, and report.

    Timings are over the last `runs` runs. `disabled` names optimizer rules to switch off, by ONNX
    Runtime's names, in either engine. Symbolic input dimensions other than the batch
    become `sequence_length` (see feeds.py).
    """
    engine = engine_named(name)
    if level not in LEVEL_NAMES:
        raise ValueError(f"unknown optimization level {level!r}; choose one of {', '.join(LEVEL_NAMES)}")
    for label, value, least in (
        ("runs", runs, 1),
        ("warmup", warmup, 0),
        ("threads", threads, 0),
        ("sequence_length", sequence_length, 1),
    ):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{label} must be an int >= {least}, got {value!r}")
    path = Path(model_path)
    if not path.is_file():
        raise EngineError(name, level, path, "no such model file")
    try:
        # The one checked loader, before either engine opens the file: onnxruntime resolves
        # external data itself, so it is only given files whose data stays in their directory.
        # The graph only: feeds need input types and embedding table shapes, not weights on disk.
        model = check_model_file(path, limits)
    except ModelLoadError as error:  # its message starts with the file, which EngineError names already
        raise EngineError(name, level, path, str(error).removeprefix(f"{path}: ")) from error
    try:
        feeds = make_feeds(model, sequence_length)
    except FeedError as error:
        raise EngineError(name, level, path, f"cannot make inputs: {error}") from error
    try:
        return engine.run(
            path, level, feeds, runs=runs, warmup=warmup, threads=threads, disabled=tuple(disabled),
            custom_ops=custom_ops,
        )  # fmt: skip
    except EngineError as error:
        lengthened = sequence_inputs(model)
        if not lengthened or not error.problem.startswith("failed while running"):
            raise
        # The usual cause with an export that takes fewer positions than the default 128: its
        # position table is shorter, and an Add or a Gather deep in the graph says only "shapes".
        raise EngineError(
            name, level, path,
            f"{error.problem} (the symbolic dimensions of {', '.join(repr(n) for n in lengthened[:4])} were "
            f"set to the sequence length {sequence_length}; a model that takes fewer positions needs a "
            "smaller one: `--sequence-length N`, or the project's `sequence_length` setting)",
        ) from error  # fmt: skip
