"""Measure one model file with one engine at one level, the way the project's protocol says.

The worker, `fusionwatch run` (client mode) and `fusionwatch analyze` all call `measure`, so a result
measured anywhere carries the same fields: our optimizer's report (fused counts, per-rule fires,
near misses, graph hash), every timing sample, the top kernels, and the numeric check of the
level's outputs against level `disabled`: at every other level the same engine's unfused graph, every
surviving tensor compared on every feed set (service/adapters/engines/numerics.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from optimizer import DEFAULT_LIMITS, LoadLimits, check_model_file, optimize
from service.adapters.canary import time_canary
from service.adapters.engines import EngineResult, run_engine
from service.adapters.engines.compare import Comparison, Producer, Surviving, Tally
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import SYNTHESIZED, synthesized_feed_sets
from service.adapters.engines.numerics import check_numerics
from service.adapters.engines.precision import TensorTolerances, narrowest_floats, reduction_depths
from service.domain.measurement import Measurement
from service.domain.protocol import Protocol
from service.domain.tolerances import Tolerances


def measure(
    path: str | Path,
    engine: str,
    level: str,
    protocol: Protocol,
    limits: LoadLimits = DEFAULT_LIMITS,
    disabled_rules: list[str] | tuple[str, ...] = (),
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    feed_sets: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    unusable_feed_sets: Mapping[str, str] | None = None,
) -> Measurement:
    """Raises EngineError (a model the engine cannot load or run) or ModelLoadError.

    `feed_sets` are a project's own inputs by name (service/adapters/feed_sets.py), checked beside the
    synthesized ones at every level but `disabled`; `unusable_feed_sets` ({name: why}) are recorded as
    not checked."""
    path = Path(path)
    timed = run_engine(
        engine,
        path,
        level,
        runs=protocol.runs,
        warmup=protocol.warmup,
        threads=protocol.threads,
        sequence_length=protocol.sequence_length,
        limits=limits,
        disabled=disabled_rules,
        custom_ops=custom_ops,
    )
    # Our optimizer's view of the same level, for both engines: the near misses are what say why a
    # fusion onnxruntime also lost did not fire. Our engine's session has just optimized the model at
    # this level with these rules disabled, so its report is this one.
    report = timed.optimizer_report
    if report is None:
        report = optimize(path, level=level, disabled=list(disabled_rules), limits=limits).report
    if level == "disabled":
        max_abs, max_rel, ok, numeric_checks, divergence = _check_disabled(timed, path, protocol, limits, custom_ops)
    else:
        check = check_numerics(
            engine, path, level, _feed_sets(path, protocol, limits, feed_sets), protocol.tolerances(),
            disabled=disabled_rules, custom_ops=custom_ops, threads=protocol.threads,
        )  # fmt: skip
        max_abs, max_rel, ok = check.max_abs, check.max_rel, check.ok
        numeric_checks, worst = check.summaries(), check.worst
        numeric_checks += [
            {"feed_set": name, "status": "unavailable", "ok": True, "reason": reason[:1000]}
            for name, reason in (unusable_feed_sets or {}).items()
        ]
        divergence = worst.to_dict() if worst is not None else None
    return Measurement(
        engine=engine,
        engine_version=timed.engine_version,
        level=level,
        fusions=dict(timed.fusions),
        execute_ms=list(timed.execute_samples_ms),
        model_run_ms=list(timed.model_run_samples_ms),
        ops_after=dict(timed.ops_after),
        nodes_before=report.nodes_before,
        nodes_after=timed.nodes_after,
        graph_hash=report.graph_hash if engine == "fusionwatch" else None,
        near_misses=[m for m in report.to_dict()["near_misses"]],
        rules={name: {"fired": stats.fired, "ms": round(stats.ms, 3)} for name, stats in report.rules.items()},
        top_kernels=list(timed.top_kernels),
        threads=protocol.threads,
        inputs=dict(timed.inputs),
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        numeric_ok=ok,
        numeric_checks=numeric_checks,
        divergence=divergence,
        peak_bytes=timed.peak_bytes,
        session_ms=timed.session_ms,
        canary_ms=time_canary(),  # right after the model's runs: the same moment of the machine
        kernel_libraries=dict(timed.kernel_libraries),
    )


def _feed_sets(
    path: Path, protocol: Protocol, limits: LoadLimits, own: Mapping[str, Mapping[str, np.ndarray]] | None
) -> dict[str, Mapping[str, np.ndarray]]:
    """The synthesized feed sets (timed, left- and right-padded), then the project's own."""
    sets: dict[str, Mapping[str, np.ndarray]] = dict(synthesized_feed_sets(check_model_file(path, limits), protocol.sequence_length))
    sets.update(own or {})
    return sets


def _check_disabled(
    timed: EngineResult, path: Path, protocol: Protocol, limits: LoadLimits, custom_ops: CustomOps
) -> tuple[float, float, bool, list[dict[str, Any]], None]:
    """Level `disabled` has no fusion to compare against: its outputs are checked against our engine's
    at `disabled` (onnxruntime's against ours; ours against itself) on the timed feeds."""
    tolerances = protocol.tolerances()
    if timed.engine == "fusionwatch":
        reference_outputs, narrow, depths = timed.outputs, {}, {}
    else:
        reference_outputs = run_engine(
            "fusionwatch", path, "disabled", runs=1, warmup=0, threads=protocol.threads,
            sequence_length=protocol.sequence_length, limits=limits, custom_ops=custom_ops,
        ).outputs  # fmt: skip
        graph = ir.serde.deserialize_graph(onnx.load(str(path), load_external_data=False).graph)
        narrow, depths = narrowest_floats(graph), reduction_depths(graph)
    found = compare_outputs(timed.outputs, reference_outputs, tolerances, narrow, depths)
    max_abs, max_rel = found.outputs_max_abs, found.outputs_max_rel
    summary = {
        "feed_set": SYNTHESIZED, "inputs": dict(timed.inputs), "status": "compared", "ok": found.ok,
        "tensors": found.tensors, "diverging": found.diverging,
        "max_abs": max_abs if max_abs < float("inf") else "inf", "max_rel": max_rel if max_rel < float("inf") else "inf",
        "first": None, "failed_outputs": list(found.failed_outputs),
    }  # fmt: skip
    return max_abs, max_rel, found.ok, [summary], None


def compare_outputs(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    tolerances: Tolerances,
    narrow: Mapping[str, str] | None = None,
    depths: Mapping[str, int] | None = None,
) -> Comparison:
    """Every output both runs produced, each at its type's tolerance (`narrow`: the narrowest type each
    output's value passed through; `depths`: the reductions it was computed through, 1 where not given;
    service/adapters/engines/precision.py); `outputs_max_abs`, `outputs_max_rel`, `ok`, and the outputs
    out of tolerance named with it (`failed_outputs`)."""
    names = [name for name in reference if name in outputs]
    surviving = [Surviving(name, Producer("", "graph output"), Producer("", "graph output"), graph_output=True) for name in names]
    tally = Tally(SYNTHESIZED, surviving, TensorTolerances(tolerances, dict(narrow or {}), dict(depths or {})))
    tally.add(names, dict(reference), dict(outputs))
    return tally.comparison()
