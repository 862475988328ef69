"""Record one measurement (from a job, or posted from elsewhere), find its baseline, raise its alerts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optimizer.fused_ops import fused_op_counts
from service.adapters.storage import ModelStore
from service.domain.measurement import Measurement, fingerprint
from service.domain.paired import PairedPolicy, with_decision
from service.domain.protocol import protocol_for
from service.domain.stats import summarize
from service.errors import Invalid
from service.models import Alert, Commit, Machine, Model, Project, Result, ResultFusion, Run
from service.usecases.baselines import find_baseline
from service.usecases.detect import detect
from service.usecases.history_points import record_point
from service.usecases.retention import prune_samples

MAX_SAMPLES = 10_000
MAX_NEAR_MISSES = 500


def get_or_create_machine(session: Session, description: dict[str, Any]) -> Machine:
    fields = {
        "machine_class": str(description.get("machine_class") or "cpu")[:32],
        "hostname": str(description.get("hostname") or "")[:255],
        "cpu": str(description.get("cpu") or "")[:255],
        "cores": int(description.get("cores") or 0),
        "isa": [str(x)[:32] for x in (description.get("isa") or [])][:64],
        "gpu": str(description.get("gpu") or "")[:255],
        "engine_versions": {str(k)[:64]: str(v)[:64] for k, v in (description.get("engine_versions") or {}).items()},
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    machine = session.scalar(select(Machine).where(Machine.fingerprint == digest))
    if machine is None:
        try:
            with session.begin_nested():
                machine = Machine(fingerprint=digest, **fields)
                session.add(machine)
        except IntegrityError:  # registered by a concurrent post meanwhile (PostgreSQL): that row is this one
            machine = session.scalar(select(Machine).where(Machine.fingerprint == digest))
    return machine


def record_result(
    session: Session,
    run: Run,
    model: Model,
    measurement: Measurement,
    machine: Machine,
    job_id: int | None = None,
    model_file_id: int | None = None,
    store: ModelStore | None = None,
) -> tuple[Result, list[Alert]]:
    """Store the result and the alerts its comparison raised; both in the caller's transaction. With
    `store`, a fusion-regression is explained on the stored model files (structure, repro, cost)."""
    m = measurement
    if len(m.execute_ms) > MAX_SAMPLES or len(m.model_run_ms) > MAX_SAMPLES:
        raise Invalid(f"at most {MAX_SAMPLES} timing samples per result")
    if any(not isinstance(v, int | float) or v < 0 for v in [*m.execute_ms, *m.model_run_ms]):
        raise Invalid("timing samples must be non-negative numbers of milliseconds")
    if m.canary_ms is not None and not m.canary_ms > 0:
        raise Invalid("canary_ms must be a positive number of milliseconds")
    if any(not isinstance(c, int) or c < 0 for c in [*m.fusions.values(), *m.ops_after.values()]):
        raise Invalid("fused-op and op counts must be non-negative integers")
    if m.ops_after:
        # A count means what the optimized graph runs, however the poster counted (optimizer/fused_ops.py).
        m = replace(m, fusions=fused_op_counts(m.ops_after))
    stats = summarize(m.execute_ms)
    project = session.get(Project, run.project_id)
    protocol = protocol_for(project.settings)
    if m.paired is not None and m.paired.get("source") == "posted":
        m = replace(m, paired=with_decision(m.paired, PairedPolicy(min_effect_pct=protocol.timing_threshold_pct)))
    result = Result(
        job_id=job_id,
        run_id=run.id,
        project_id=run.project_id,
        commit_id=run.commit_id,
        model_id=model.id,
        model_file_id=model_file_id,
        machine_id=machine.id,
        engine=m.engine,
        engine_version=m.engine_version[:64],
        level=m.level,
        machine_class=machine.machine_class,
        threads=m.threads,
        inputs=m.inputs,
        fingerprint=fingerprint(project.id, model.id, m, machine.machine_class),
        nodes_before=m.nodes_before,
        nodes_after=m.nodes_after,
        ops_after=m.ops_after,
        fusions=m.fusions,
        rules=m.rules,
        near_misses=m.near_misses[:MAX_NEAR_MISSES],
        graph_hash=m.graph_hash,
        execute_ms=list(m.execute_ms),
        model_run_ms=list(m.model_run_ms),
        median_ms=stats.median if stats else None,
        p10_ms=stats.p10 if stats else None,
        p90_ms=stats.p90 if stats else None,
        mad_ms=stats.mad if stats else None,
        top_kernels=m.top_kernels,
        kernel_libraries=dict(m.kernel_libraries),
        max_abs_error=m.max_abs_error,
        max_rel_error=m.max_rel_error,
        numeric_ok=m.numeric_ok,
        numeric_checks=list(m.numeric_checks),
        divergence=m.divergence,
        peak_bytes=m.peak_bytes,
        session_ms=m.session_ms,
        canary_ms=m.canary_ms,
        paired=m.paired,
    )
    session.add(result)
    session.flush()
    session.add_all(ResultFusion(result_id=result.id, op=op[:300], count=count) for op, count in m.fusions.items())
    record_point(session, result)
    baseline = find_baseline(session, result)
    alerts = detect(
        session,
        result,
        baseline,
        model,
        session.get(Commit, run.commit_id),
        session.get(Commit, baseline.commit_id) if baseline else None,
        protocol,
        store,
    )
    session.add_all(alerts)
    session.flush()
    prune_samples(session, result, protocol.keep_samples_commits)
    return result, alerts
