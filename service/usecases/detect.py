"""Compare a result with its baseline and say what changed, in words a user acts on.

fusion-regression and fusion-change: fused-op counts against the baseline (fusion_alerts.py: one
alert per lost op, with its cause, resolved by the commit that restores it; rises are information).
timing-regression: against a window of measured ancestors, suspected then confirmed
(`timing_alerts.py`, deciding with `timing.decide`). numeric-mismatch: the level's outputs left the tolerance
of level `disabled`, or a tensor holds NaN/inf the unfused graph does not (no baseline needed); the
message names the first diverging tensor and the fusion that made it.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.adapters.engines.compare import describe_row
from service.adapters.storage import ModelStore
from service.domain.protocol import Protocol
from service.domain.vocabulary import FUSION_KINDS, AlertKind
from service.models import Alert, Commit, Model, Result
from service.usecases import timing_alerts
from service.usecases.fusion_alerts import detect_fusions


def detect(
    session: Session,
    result: Result,
    baseline: Result | None,
    model: Model,
    commit: Commit,
    baseline_commit: Commit | None,
    protocol: Protocol,
    store: ModelStore | None = None,
) -> list[Alert]:
    alerts: list[Alert] = []
    where = f"model {model.name}, {result.engine} {result.engine_version}, level {result.level}"
    common = dict(
        project_id=result.project_id,
        run_id=result.run_id,
        model_id=result.model_id,
        engine=result.engine,
        level=result.level,
        commit_id=result.commit_id,
        result_id=result.id,
    )
    if result.numeric_ok is False:
        alerts.append(_numeric_alert(result, commit, protocol, where, common))
    if baseline is None or baseline_commit is None:
        return alerts
    common |= dict(baseline_commit_id=baseline_commit.id, baseline_result_id=baseline.id)
    if _fusions_already_reported(session, result):
        return alerts + _timing(session, result, common, where, protocol)
    alerts += detect_fusions(session, result, baseline, model, commit, baseline_commit, protocol, common, store)
    return alerts + _timing(session, result, common, where, protocol)


def _numeric_alert(result: Result, commit: Commit, protocol: Protocol, where: str, common: dict) -> Alert:
    """Names the first tensor that diverged from the unfused graph, and the fusion whose output it is,
    when the mark-all check found one (service/adapters/engines/numerics.py)."""
    first = (result.divergence or {}).get("first")
    # Each output out of tolerance with the bound it left, which depends on its type (float16's is not
    # float32's, service/domain/tolerances.py); results stored before outputs were named quote the protocol's.
    failed = _failed_outputs(result)
    bounds = "; ".join(failed) if failed else f"tolerance rtol {protocol.rtol:g}, atol {protocol.atol:g}"
    message = (
        f"{where}: outputs differ from level disabled at commit {commit.sha[:12]} "
        f"(max abs error {result.max_abs_error:.3g}, max rel error {result.max_rel_error:.3g}; {bounds})"
    )
    if first:
        message += "; " + describe_row(first, result.divergence.get("feed_set"))
    return Alert(
        kind=AlertKind.NUMERIC_MISMATCH, after=result.max_abs_error, message=message,
        rule=first.get("rule") if first else None, op=(first.get("fused_op") or first.get("op")) if first else None,
        **common,
    )  # fmt: skip


def _failed_outputs(result: Result) -> list[str]:
    """The worst comparison's outputs out of tolerance, else the first failing feed set's (level
    `disabled`, whose check against the other engine keeps no divergence record)."""
    named = (result.divergence or {}).get("failed_outputs")
    if named:
        return list(named)
    for check in result.numeric_checks or []:
        if not check.get("ok", True) and check.get("failed_outputs"):
            return list(check["failed_outputs"])
    return []


def _timing(session: Session, result: Result, common: dict, where: str, protocol: Protocol) -> list[Alert]:
    timing_common = {k: v for k, v in common.items() if k not in ("baseline_commit_id", "baseline_result_id")}
    return timing_alerts.evaluate(session, result, timing_common, where, protocol.timing_threshold_pct)


def _fusions_already_reported(session: Session, result: Result) -> bool:
    """A re-measurement of a commit (service/usecases/remeasure.py) counts the same fusions as the first
    measurement did: the fusion alerts that one raised are not raised twice."""
    earlier = select(Result.id).where(
        Result.commit_id == result.commit_id, Result.fingerprint == result.fingerprint, Result.id != result.id
    )
    return session.scalar(
        select(Alert.id).where(Alert.kind.in_(FUSION_KINDS), Alert.result_id.in_(earlier)).limit(1)
    ) is not None
