"""Timing alerts over a series: gather the baseline window, decide, and keep the alerts' states.

A timing alert starts `suspected` at the commit whose result crossed the bar (`timing.decide`) and is
delivered only once `confirmed`: when a re-measurement of that commit, or the next measured commit,
also crosses it against the same window. One slow job on a shared machine is thereby never delivered,
while a real step is, one measurement later. The window is the last K measured ancestors with the
result's fingerprint (nearest first, as `baselines.find_baseline` walks them), without commits whose
timing alert is still only suspected (likely slow moments) and ending at the latest confirmed one
(the series' level changed there, so older jobs would measure the old level).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.alerts import timing
from service.models import Alert, Commit, Result
from service.models.base import utc_now
from service.usecases.baselines import measured_ancestors

KIND = "timing-regression"


def measured_ancestry(session: Session, result: Result, policy: timing.TimingPolicy) -> list[Result]:
    """The measured ancestors a window is drawn from, nearest first (service/usecases/baselines.py). Five
    windows' worth: baseline_window skips suspected alerts that were never confirmed, and the decision
    estimates the series' job-to-job noise from all of them (`timing.decide`'s history)."""
    return measured_ancestors(session, result, limit=policy.window * 5, timings_only=True)


def series_timing_alerts(session: Session, fingerprint: str) -> dict[int, Alert]:
    """Timing alerts of one series by commit id (the latest per commit)."""
    rows = session.scalars(
        select(Alert).join(Result, Result.id == Alert.result_id)
        .where(Alert.kind == KIND, Result.fingerprint == fingerprint).order_by(Alert.id)
    )
    return {alert.commit_id: alert for alert in rows}


def baseline_window(
    ancestry: list[Result], alerts: dict[int, Alert], size: int
) -> list[Result]:
    window: list[Result] = []
    for result in ancestry:
        alert = alerts.get(result.commit_id)
        if alert is not None and alert.confirmed_at is None:
            continue  # suspected and never confirmed: a slow moment, not the series' level
        window.append(result)
        if len(window) == size or alert is not None:
            break  # a confirmed alert: the level changed at this commit
    return window


def code_changed(result: Result, baseline: Result) -> bool:
    """False only when both the optimized graph's hash and the engine version are known and equal."""
    return not (
        result.graph_hash is not None
        and result.graph_hash == baseline.graph_hash
        and result.engine_version == baseline.engine_version
    )


def library_change(result: Result, baseline: Result) -> str:
    """"; our engine ran on other kernel libraries than the baseline (gemm mkl-packed → onednn) ..."
    when both recorded theirs and they differ, else "". The libraries are measured per machine
    (runtime/kernel_choice.py), so such a step can be the choice's, not the commit's."""
    before, after = baseline.kernel_libraries or {}, result.kernel_libraries or {}
    if not before or not after or before == after:
        return ""
    changed = ", ".join(
        f"{family} {before.get(family, '?')} → {after.get(family, '?')}"
        for family in sorted(set(before) | set(after))
        if before.get(family) != after.get(family)
    )
    return (
        f"; our engine ran on other kernel libraries than the baseline ({changed}): the session's "
        "measured choice changed, which can be the step rather than the commit"
    )


def as_job(result: Result) -> timing.Job:
    return timing.Job(samples=result.execute_ms, canary_ms=result.canary_ms)


def evaluate(
    session: Session,
    result: Result,
    common: dict,
    where: str,
    threshold_pct: float,
    policy: timing.TimingPolicy = timing.DEFAULT_POLICY,
) -> list[Alert]:
    """The alerts this result raised (suspected) or confirmed; `common` holds the Alert columns that name
    the result (project, run, model, engine, level, commit, result)."""
    if not result.execute_ms:
        return []
    alerts = series_timing_alerts(session, result.fingerprint)
    ancestry = measured_ancestry(session, result, policy)
    here = alerts.get(result.commit_id)
    if here is not None:  # a re-measurement of an alerted commit: confirm it, never raise a second
        if here.state != "suspected":
            return []
        return _confirm_if_agrees(session, here, result, alerts, threshold_pct, policy)
    if ancestry and (pending := alerts.get(ancestry[0].commit_id)) is not None and pending.state == "suspected":
        confirmed = _confirm_if_agrees(session, pending, result, alerts, threshold_pct, policy)
        if confirmed:
            return confirmed  # the next commit agrees: the same step, not a second one
    window = baseline_window(ancestry, alerts, policy.window)
    if not window:
        return []
    verdict = timing.decide(as_job(result), [as_job(r) for r in window], threshold_pct,
                            code_changed(result, window[0]), policy, [as_job(r) for r in ancestry])
    if verdict is None or not verdict.regressed:
        return []
    baseline_commit = session.get(Commit, window[0].commit_id)
    commit = session.get(Commit, result.commit_id)
    return [
        Alert(
            kind=KIND,
            state="suspected",
            before=verdict.before_ms,
            after=verdict.after_ms,
            change_pct=verdict.change_pct,
            message=(
                f"SequentialExecutor::Execute regressed for {where} at commit {commit.sha[:12]} against "
                f"baseline {baseline_commit.sha[:12]}: {verdict.why}{library_change(result, window[0])}"
            ),
            **common,
            baseline_commit_id=baseline_commit.id,
            baseline_result_id=window[0].id,
        )
    ]


def _confirm_if_agrees(
    session: Session,
    alert: Alert,
    result: Result,
    alerts: dict[int, Alert],
    threshold_pct: float,
    policy: timing.TimingPolicy,
) -> list[Alert]:
    """Confirm `alert` when `result` crosses the bar against the window the alert was raised on, by about
    the same amount (`timing.agree`)."""
    alerted = session.get(Result, alert.result_id)
    ancestry = measured_ancestry(session, alerted, policy)
    window = baseline_window(ancestry, alerts, policy.window)
    if not window:
        return []
    jobs, changed, history = [as_job(r) for r in window], code_changed(alerted, window[0]), [as_job(r) for r in ancestry]
    first = timing.decide(as_job(alerted), jobs, threshold_pct, changed, policy, history)
    verdict = timing.decide(as_job(result), jobs, threshold_pct, changed, policy, history)
    if first is None or verdict is None or not timing.agree(first, verdict, policy):
        return []
    commit = session.get(Commit, result.commit_id)
    what = "a re-measurement" if result.commit_id == alert.commit_id else f"the next commit {commit.sha[:12]}"
    alert.state, alert.confirmed_result_id, alert.confirmed_at = "confirmed", result.id, utc_now()
    alert.message += f". Confirmed by {what}: {verdict.change_pct:+.1f}% against the same window"
    return [alert]
