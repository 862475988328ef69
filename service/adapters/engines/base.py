"""What an engine is, and how it fails.

An engine takes one model file, one optimization level and the feeds to time it on, and returns
an EngineResult (result.py). Two exist (the registry in __init__.py): ours (native.py: our
optimizer and SequentialExecutor) and onnxruntime as the reference (onnxruntime.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.result import EngineResult


class EngineError(RuntimeError):
    """An engine could not load or run a model.

    A RuntimeError, not a ValueError: the caller's arguments were valid (those errors are
    ValueErrors, raised before any engine starts); it is this model meeting this engine that
    failed. The message names the engine, the level and the file; the engine's own exception
    is chained as `__cause__`.
    """

    def __init__(self, engine: str, level: str, model: str | Path, problem: str) -> None:
        self.engine = engine
        self.level = level
        self.model = str(model)
        self.problem = problem
        super().__init__(f"{engine} at level {level}: {model}: {problem}")


class Engine(Protocol):
    name: str

    def version(self) -> str: ...

    def run(
        self,
        model_path: Path,
        level: str,
        feeds: Mapping[str, np.ndarray],
        *,
        runs: int,
        warmup: int,
        threads: int,
        disabled: tuple[str, ...] = (),
        custom_ops: CustomOps = NO_CUSTOM_OPS,
    ) -> EngineResult: ...

    def optimized_graph(
        self, model_path: Path, level: str, disabled: tuple[str, ...] = (), custom_ops: CustomOps = NO_CUSTOM_OPS
    ) -> onnx.ModelProto: ...

    def open_timer(
        self,
        model_path: Path,
        level: str,
        feeds: Mapping[str, np.ndarray],
        *,
        threads: int,
        disabled: tuple[str, ...] = (),
        custom_ops: CustomOps = NO_CUSTOM_OPS,
    ) -> Callable[[], float]:
        """A session for `model_path` at `level`, as `run` opens it but without profiling: each call of
        the returned function runs it once on `feeds` and returns that run's wall time in ms (the paired
        measurement, service/adapters/paired_measure.py, alternates two of them)."""
        ...


def wall_timer(engine: str, level: str, model: str | Path, run: Callable[[], object]) -> Callable[[], float]:
    """`run` as a function that returns its wall time in ms, failing as the engine's runs fail."""

    def run_once() -> float:
        with failing_as(engine, level, model, "failed while running"):
            started = time.perf_counter()
            run()
            return (time.perf_counter() - started) * 1000

    return run_once


@contextmanager
def failing_as(engine: str, level: str, model: str | Path, step: str) -> Iterator[None]:
    """Turn whatever an engine raises during `step` into an EngineError naming engine, level and file.

    Only the calls into an engine go inside: engines raise their own exception types
    (onnxruntime's are bare Exception subclasses), and each is a fact about the model.
    """
    try:
        yield
    except EngineError:
        raise
    except Exception as error:
        raise EngineError(engine, level, model, f"{step}: {type(error).__name__}: {error}") from error
