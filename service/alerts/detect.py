"""Compare a result with its baseline and say what changed, in words a user acts on.

fusion-regression: fused ops' counts dropped (exact, immediate); one alert per result, led by the op
that lost the most, every drop in `changes`. fusion-change: counts rose (info), the same way, with any
drop that a rise explains (an op absorbed into a larger fusion, see `absorbed_into`).
timing-regression: against a window of measured ancestors, suspected then confirmed
(`timing_alerts.py`, deciding with `timing.decide`). numeric-mismatch: the level's outputs left the tolerance
of level `disabled`, or a tensor holds NaN/inf the unfused graph does not (no baseline needed); the
message names the first diverging tensor and the fusion that made it.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import select
from sqlalchemy.orm import Session

from optimizer import rules_for_level
from service.alerts import timing_alerts
from service.engines.compare import describe_row
from service.models import Alert, Commit, Model, Result
from service.protocol import Protocol

NEAR_MISSES_QUOTED = 3
FUSION_KINDS = ("fusion-regression", "fusion-change")


@cache
def rule_for_op() -> dict[str, str]:
    """Fused op key → the rule that emits it ("com.microsoft.BiasGelu" → "BiasGeluFusion")."""
    names: dict[str, str] = {}
    for rule in rules_for_level("all", enable_gelu_approximation=True):
        for op in rule.emits:
            names.setdefault(op, rule.name)
    return names


@cache
def absorbed_into() -> dict[str, frozenset[str]]:
    """Fused op key → the fused ops a rule anchored on it makes out of it ("com.microsoft.Gelu" →
    BiasGelu, FastGelu). When those rose by as much as it dropped, the op was absorbed into a larger
    fusion (a re-enabled BiasGeluFusion takes GeluFusion's Gelus back), which is no regression."""
    found: dict[str, set[str]] = {}
    for rule in rules_for_level("all", enable_gelu_approximation=True):
        for anchor in rule.anchors:
            found.setdefault(anchor, set()).update(op for op in rule.emits if op != anchor)
    return {op: frozenset(ops) for op, ops in found.items()}


def detect(
    session: Session,
    result: Result,
    baseline: Result | None,
    model: Model,
    commit: Commit,
    baseline_commit: Commit | None,
    protocol: Protocol,
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
    against = f"at commit {commit.sha[:12]} against baseline {baseline_commit.sha[:12]}"
    common |= dict(baseline_commit_id=baseline_commit.id, baseline_result_id=baseline.id)
    drops, rises = [], []
    if _fusions_already_reported(session, result):
        return alerts + _timing(session, result, common, where, protocol)
    for op in sorted(set(baseline.fusions) | set(result.fusions)):
        before, after = baseline.fusions.get(op, 0), result.fusions.get(op, 0)
        change = {"op": op, "rule": rule_for_op().get(op), "before": before, "after": after,
                  "change_pct": (after - before) / before * 100 if before else None}
        if after < before:
            drops.append(change)
        elif after > before:
            rises.append(change)
    rose = {c["op"]: c["after"] - c["before"] for c in rises}
    absorbed = [c for c in drops
                if sum(rose.get(op, 0) for op in absorbed_into().get(c["op"], ())) >= c["before"] - c["after"]]
    drops = [c for c in drops if c not in absorbed]
    rises += absorbed  # reported with the rises that absorbed them, as information
    if drops:
        # The op that lost the most (relatively) leads; every drop is in `changes` and the message.
        drops.sort(key=lambda c: (c["after"] / c["before"], c["op"]))
        rank = {rule: i for i, rule in enumerate(dict.fromkeys(c["rule"] for c in drops if c["rule"]))}
        # The leading rule's near misses first: they are the likeliest answer to "why".
        misses = sorted((m for m in result.near_misses if m.get("rule") in rank), key=lambda m: rank[m["rule"]])
        parts = []
        for c in drops:
            what = "stopped firing" if c["after"] == 0 else "fired less"
            parts.append(f"{c['rule'] or c['op']} {what}: {c['op']} {c['before']} → {c['after']}")
        reasons = "; ".join(f"{m.get('rule')}: {m.get('reason')}" for m in misses[:NEAR_MISSES_QUOTED])
        message = f"{'; '.join(parts)} for {where} {against}"
        message += f". Near misses: {reasons}" if reasons else ". No near misses were reported for these rules"
        alerts.append(_fusion_alert("fusion-regression", drops, message, misses, common))
    if rises:
        parts = [f"{c['rule'] or c['op']}: {c['op']} {c['before']} → {c['after']}" for c in rises]
        alerts.append(_fusion_alert("fusion-change", rises, f"{'; '.join(parts)} for {where} {against}", [], common))
    return alerts + _timing(session, result, common, where, protocol)


def _numeric_alert(result: Result, commit: Commit, protocol: Protocol, where: str, common: dict) -> Alert:
    """Names the first tensor that diverged from the unfused graph, and the fusion whose output it is,
    when the mark-all check found one (service/engines/numerics.py)."""
    first = (result.divergence or {}).get("first")
    message = (
        f"{where}: outputs differ from level disabled at commit {commit.sha[:12]} "
        f"(max abs error {result.max_abs_error:.3g}, max rel error {result.max_rel_error:.3g}; "
        f"tolerance rtol {protocol.rtol:g}, atol {protocol.atol:g})"
    )
    if first:
        message += "; " + describe_row(first, result.divergence.get("feed_set"))
    return Alert(
        kind="numeric-mismatch", after=result.max_abs_error, message=message,
        rule=first.get("rule") if first else None, op=(first.get("fused_op") or first.get("op")) if first else None,
        **common,
    )  # fmt: skip


def _timing(session: Session, result: Result, common: dict, where: str, protocol: Protocol) -> list[Alert]:
    timing_common = {k: v for k, v in common.items() if k not in ("baseline_commit_id", "baseline_result_id")}
    return timing_alerts.evaluate(session, result, timing_common, where, protocol.timing_threshold_pct)


def _fusions_already_reported(session: Session, result: Result) -> bool:
    """A re-measurement of a commit (service/alerts/remeasure.py) counts the same fusions as the first
    measurement did: the fusion alerts that one raised are not raised twice."""
    earlier = select(Result.id).where(
        Result.commit_id == result.commit_id, Result.fingerprint == result.fingerprint, Result.id != result.id
    )
    return session.scalar(
        select(Alert.id).where(Alert.kind.in_(FUSION_KINDS), Alert.result_id.in_(earlier)).limit(1)
    ) is not None


def _fusion_alert(kind: str, changes: list[dict], message: str, misses: list[dict], common: dict) -> Alert:
    lead = changes[0]
    return Alert(
        kind=kind, op=lead["op"], rule=lead["rule"], before=lead["before"], after=lead["after"],
        change_pct=lead["change_pct"], changes=changes, message=message, near_misses=misses, **common,
    )
