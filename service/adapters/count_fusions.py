"""A model file's fused-op counts at one level of one engine, without timing it: the optimized graph
only, as the engine makes it for a session (our optimizer's report; the graph onnxruntime writes). What
a job will measure at length, known in the time it takes to optimize the file."""

from __future__ import annotations

from pathlib import Path

from optimizer import DEFAULT_LIMITS, LoadLimits, check_model_file, optimize
from optimizer.fused_ops import fused_op_counts
from service.adapters.engines import EngineError, engine_named
from service.adapters.engines.base import failing_as
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import FeedError, describe_feeds, make_feeds
from service.adapters.engines.onnxruntime import optimized_counts
from service.domain.measurement import Measurement
from service.domain.protocol import Protocol


def count_fusions(
    path: Path, engine: str, level: str, protocol: Protocol, limits: LoadLimits = DEFAULT_LIMITS,
    custom_ops: CustomOps = NO_CUSTOM_OPS,
) -> Measurement:
    """A measurement with counts and no samples, its inputs those a job times (so its fingerprint is the
    job's). Raises ModelLoadError (the file, before either engine opens it) or EngineError."""
    model = check_model_file(path, limits)
    try:
        inputs = describe_feeds(make_feeds(model, protocol.sequence_length))
    except FeedError as error:
        raise EngineError(engine, level, path, f"cannot make inputs: {error}") from error
    runner = engine_named(engine)
    if engine == "fusionwatch":
        with failing_as(engine, level, path, "could not optimize"):
            report = optimize(path, level=level, limits=limits).report
        ops_after, nodes_after = dict(report.ops_after), report.nodes_after
        fusions = fused_op_counts(ops_after)
    else:
        ops_after, fusions = optimized_counts(path, level, (), custom_ops)
        nodes_after = sum(ops_after.values())
    return Measurement(engine=engine, engine_version=runner.version(), level=level, fusions=dict(fusions),
                       ops_after=dict(ops_after), nodes_after=nodes_after, threads=protocol.threads, inputs=inputs)
