"""A model file's fused-op counts at one level of one engine, without timing it: the optimized graph
and one run (an engine counts the graph its session made, and a run proves it runs). What a job will
measure at length, known in the time it takes to optimize the file."""

from __future__ import annotations

from pathlib import Path

from optimizer import DEFAULT_LIMITS, LoadLimits
from service.adapters.engines import run_engine
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.domain.measurement import Measurement
from service.domain.protocol import Protocol


class CountsUnavailable(RuntimeError):
    """The engine ran the model but its optimized graph could not be read back."""


def count_fusions(
    path: Path, engine: str, level: str, protocol: Protocol, limits: LoadLimits = DEFAULT_LIMITS,
    custom_ops: CustomOps = NO_CUSTOM_OPS,
) -> Measurement:
    """A measurement with counts and no samples (its fingerprint is the job's). Raises EngineError or
    ModelLoadError as measuring would, CountsUnavailable when the engine's graph cannot be read."""
    timed = run_engine(engine, path, level, runs=1, warmup=0, threads=protocol.threads,
                       sequence_length=protocol.sequence_length, limits=limits, custom_ops=custom_ops)
    if timed.graph_error is not None:
        raise CountsUnavailable(timed.graph_error)
    return Measurement(engine=engine, engine_version=timed.engine_version, level=level, fusions=dict(timed.fusions),
                       ops_after=dict(timed.ops_after), nodes_after=timed.nodes_after, threads=protocol.threads,
                       inputs=dict(timed.inputs))
