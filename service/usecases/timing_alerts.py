"""Timing alerts over a series: gather the baseline window, decide, and keep the alerts' states.

A timing alert starts `suspected` at the commit whose result crossed the screen (`timing.decide`) and
is delivered only once `confirmed`: when the jobs measured after it, a re-measurement of that commit
and then with it the next measured commit's job, cross the bar together against the same window
(`_confirm_if_agrees`). One slow job on a shared machine is thereby never delivered,
while a real step is, one measurement later. The window is the last K measured ancestors with the
result's fingerprint (nearest first, as `baselines.find_baseline` walks them), without commits whose
timing alert is still only suspected (likely slow moments) and ending at the latest confirmed one
(the series' level changed there, so older jobs would measure the old level).

The alerted commit's re-measurement decides which commit a step belongs to, because unlike the
alerted job it was not picked for crossing the bar: when it came back at the old level, the next
commit's agreeing job is a step of its own right after a slow moment, and raises its own alert
(`timing.slow_moment_before`); when it already sat at the new level and the step was nonetheless
raised again at the next commit (the first job disagreed in size with the rest), the confirmation
goes back to the commit where the step began (`_step_began_before`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain import paired, timing, verdict_words
from service.domain.kernel_changes import kernel_changes
from service.domain.vocabulary import AlertKind
from service.models import Alert, Commit, Result
from service.models.base import utc_now
from service.usecases.baselines import measured_ancestors

KIND = AlertKind.TIMING_REGRESSION

# The levels of each series measured on a result's machine class, nearest first (`machine_levels`).
Machine = Callable[[], Sequence[np.ndarray]]


def measured_ancestry(session: Session, result: Result, policy: timing.TimingPolicy) -> list[Result]:
    """The measured ancestors a window is drawn from, nearest first (service/usecases/baselines.py). Five
    windows' worth: baseline_window skips suspected alerts that were never confirmed, and the decision
    estimates the series' job-to-job noise from all of them (`timing.decide`'s history)."""
    return measured_ancestors(session, result, limit=policy.window * 5, timings_only=True)


def machine_levels(session: Session, result: Result, policy: timing.TimingPolicy) -> list[np.ndarray]:
    """The levels (fastest runs) of every series measured on `result`'s machine class before it, nearest
    first, from the class's `policy.machine_jobs` latest results of any project: each series in the order
    its jobs ran, re-measurements included (a slow job that was re-measured ran all the same)."""
    rows = session.execute(
        select(Result.fingerprint, Result.execute_ms)
        .where(Result.machine_class == result.machine_class, Result.id < result.id)
        .order_by(Result.id.desc()).limit(policy.machine_jobs)
    )
    series: dict[str, list[float]] = {}
    for fingerprint, samples in rows:
        if samples:
            series.setdefault(fingerprint, []).append(timing.level(samples, policy))
    return [np.asarray(levels) for levels in series.values()]


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


def code_changed(result: Result, window: list[Result], policy: timing.TimingPolicy = timing.DEFAULT_POLICY) -> bool:
    """False only when the optimized graph's hash and the engine version are known and equal to those of
    the window's nearest `policy.same_code_jobs` results. Not only the nearest one: when a step's own
    commit changed the graph but its job happened to stay under the bar, the next commit has the same
    graph as the step's and would otherwise face the doubled bar of "nothing changed", though its
    window's level was measured on the old code."""
    return not all(
        result.graph_hash is not None
        and result.graph_hash == baseline.graph_hash
        and result.engine_version == baseline.engine_version
        for baseline in window[: policy.same_code_jobs]
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


@dataclass(frozen=True)
class Screened:
    """What a result was screened on: the verdict, and the window, code change and history it was
    decided against (the confirmation decides against the same)."""

    verdict: timing.TimingVerdict | None
    window: list
    changed: bool
    history: list


def screen(result, ancestry: list, alerts: dict, threshold_pct: float, policy: timing.TimingPolicy) -> Screened | None:
    """Does `result` (a Result, or the replay's stand-in) pass the screen that makes a suspicion? Its job
    alone against its window (`suspect_k` noises), else its job pooled with those of the up to
    `policy.screen_jobs - 1` commits before it, against the window before them (`noise_k` / √jobs): a
    step whose first jobs each stayed under the screen shows in their mean. Only commits without an
    alert of their own are pooled: an alert's jobs are already being followed. None without a window."""
    window = baseline_window(ancestry, alerts, policy.window)
    if not window:
        return None
    history = [as_job(r) for r in ancestry]
    job = as_job(result)
    changed = code_changed(result, window, policy)
    alone = Screened(timing.decide(job, [as_job(r) for r in window], threshold_pct, changed, policy, history,
                                   screening=True), window, changed, history)
    if alone.verdict is None or alone.verdict.regressed:
        return alone
    for before in range(1, policy.screen_jobs):
        if len(ancestry) <= before or ancestry[before - 1].commit_id in alerts:
            break
        earlier = baseline_window(ancestry[before:], alerts, policy.window)
        if not earlier:
            break
        pooled = [*reversed(history[:before]), job]
        changed_then = code_changed(ancestry[before - 1], earlier, policy)  # the step, if any, began there
        verdict = timing.decide(pooled, [as_job(r) for r in earlier], threshold_pct, changed_then, policy,
                                history[before:])
        if verdict is not None and verdict.regressed:
            return Screened(verdict, earlier, changed_then, history[before:])
    return alone


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
    if (verdict := paired.stored_verdict(result.paired)) is not None:
        result.timing_verdict = verdict_words.from_paired(verdict)
        return _paired(session, result, verdict, common, where)
    alerts = series_timing_alerts(session, result.fingerprint)
    ancestry = measured_ancestry(session, result, policy)
    here = alerts.get(result.commit_id)
    if here is not None:  # a re-measurement of an alerted commit: confirm it, never raise a second
        if here.state != "suspected":
            return []
        since = _since_alert(session, here, result, policy)
        return (_confirm_if_agrees(session, here, result, alerts, threshold_pct, policy, since)
                or _measure_again(here, result, alerts, threshold_pct, policy, since))
    if (alert := pending(ancestry, alerts)) is not None:
        since = _since_alert(session, alert, result, policy)
        confirmed = _confirm_if_agrees(session, alert, result, alerts, threshold_pct, policy, since)
        if confirmed:
            alerted = session.get(Commit, confirmed[0].commit_id)
            result.timing_verdict = verdict_words.confirming(alerted.sha, confirmed[0].change_pct or 0.0)
            return confirmed  # the next commit agrees: the same step, not a second one
    screened = screen(result, ancestry, alerts, threshold_pct, policy)
    result.timing_verdict = verdict_words.from_window(screened.verdict if screened else None, policy.min_noise_jobs)
    if screened is None or screened.verdict is None or not screened.verdict.regressed:
        return []
    verdict, window = screened.verdict, screened.window
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


def _paired(session: Session, result: Result, verdict: paired.PairedVerdict, common: dict, where: str) -> list[Alert]:
    """A result whose baseline was timed beside it in the same job is judged on those pairs alone
    (service/domain/paired.py): a regression is confirmed at once (a slow moment of the machine slowed
    both sides), anything else raises nothing; an inconclusive job says so on the commit page."""
    if verdict.word != paired.REGRESSED:
        return []
    # Level disabled runs the export as written, which no user ships: its change is information.
    state, lead = ("info", "At level disabled (no optimizer: the export as written), ") if result.level == "disabled" else (
        "confirmed", "")
    pairs = result.paired
    baseline_sha = pairs.get("baseline_commit")
    baseline_commit = session.scalar(select(Commit).where(
        Commit.project_id == result.project_id, Commit.sha == baseline_sha)) if baseline_sha else None
    commit = session.get(Commit, result.commit_id)
    against = f"baseline {baseline_sha[:12]}" if baseline_sha else "its baseline"
    how = "posted with the result" if pairs.get("source") == "posted" else f"measured in one job ({pairs.get('stopped')})"
    return [Alert(
        kind=KIND, state=state, confirmed_at=utc_now(), confirmed_result_id=result.id,
        before=float(np.median(pairs["baseline_ms"])), after=float(np.median(pairs["candidate_ms"])),
        change_pct=verdict.change_pct,
        message=(f"{lead}SequentialExecutor::Execute regressed for {where} at commit {commit.sha[:12]} against {against}, "
                 f"the two timed alternately, {how}: {verdict.describe()}{_kernels_moved(pairs)}"),
        **common,
        baseline_commit_id=baseline_commit.id if baseline_commit is not None else None,
    )]


def _kernels_moved(pairs: dict) -> str:
    """The kernels that moved most, as the job profiled both files alternately after its verdict
    (paired_measure.kernels_side_by_side); nothing when it did not."""
    kernels = pairs.get("kernels")
    if not kernels:
        return ""
    moved = kernel_changes(kernels.get("baseline", []), kernels.get("candidate", []), KERNELS_QUOTED)
    return ("; the kernels that moved most, both files profiled alternately (per run, baseline → candidate; – "
            f"not among the slowest): {', '.join(c.describe() for c in moved)}") if moved else ""


KERNELS_QUOTED = 4


def pending(ancestry: list, alerts: dict):
    """The suspected alert at the previous measured commit, which a result at this one may confirm; None
    when there is none."""
    alert = alerts.get(ancestry[0].commit_id) if ancestry else None
    return alert if alert is not None and alert.state == "suspected" else None


def confirmation(alerted, ancestry: list, alerts: dict, remeasured: list, later: list, threshold_pct: float,
                 policy: timing.TimingPolicy, machine: Machine = lambda: ()) -> timing.TimingVerdict | None:
    """The verdict that confirms the alert raised on `alerted` (a Result, or the replay's stand-in), or
    None: the jobs measured since it, `remeasured` (the alerted commit's re-measurements) and `later`
    (the results of the commits after it), cross the bar together against the window the alert was
    raised on, by about the same amount as the alerted job (`timing.agree`), unless the re-measurements
    say the alerted job was a slow moment before a step at a later commit (`timing.slow_moment_before`).
    The alerted job itself is left out of the pool: it was picked for crossing the screen, so it would
    carry a noise that crossed the bar into every later test. `ancestry` is the alerted result's;
    `machine` gives the levels of the series measured on the machine class (`machine_levels`)."""
    screened = screen(alerted, ancestry, alerts, threshold_pct, policy)
    if screened is None or screened.verdict is None:
        return None
    first, changed, history = screened.verdict, screened.changed, screened.history
    jobs = [as_job(r) for r in screened.window]
    remeasured, later = _calm(remeasured, jobs, policy), _calm(later, jobs, policy)
    if not remeasured and not later:
        return None
    verdict = timing.decide([as_job(r) for r in (*remeasured, *later)], jobs, threshold_pct, changed, policy, history)
    if verdict is None or not timing.agree(first, verdict, policy):
        return None
    if _too_common(screened, [as_job(r) for r in (alerted, *remeasured, *later)], ancestry, alerts, policy, machine):
        return None
    if remeasured and later:
        again = timing.decide([as_job(r) for r in remeasured], jobs, threshold_pct, changed, policy, history)
        after = timing.decide([as_job(r) for r in later], jobs, threshold_pct, changed, policy, history)
        if again is not None and after is not None and timing.slow_moment_before(again, after):
            return None
    return verdict


@dataclass(frozen=True)
class OneMore:
    """Why an unconfirmed alert's re-measurements ask for one more (`measure_again`)."""

    verdict: timing.TimingVerdict  # the re-measurements' verdict against the alert's window
    why: str  # NEAR_THE_NEW_LEVEL, TOO_COMMON or SLOW_MOMENT


NEAR_THE_NEW_LEVEL, TOO_COMMON, SLOW_MOMENT = "near the new level", "too common", "slow moment"


def measure_again(alerted, ancestry: list, alerts: dict, remeasured: list, threshold_pct: float,
                  policy: timing.TimingPolicy, machine: Machine = lambda: ()) -> OneMore | None:
    """Why an unconfirmed alert's re-measurements ask for one more, when they do: fewer than
    `policy.remeasures` so far, and
    - their mean sits under the bar but nearer the alerted job's level than the window's
      (`timing.at_the_new_level`). A step's re-measurement lands there often (its one job faces the
      full bar), a slow moment's rarely; one more job then halves the pool's noise within the same CI
      round instead of leaving the decision to the next commit;
    - or past the bar, but jobs that slow are too common in the series' or the machine's history to
      confirm on so few (`timing.null_chance`);
    - or every one of them ran in a slow moment of the machine (`timing.in_slow_moment`), which
      cannot confirm a step (`confirmation` pools only calm jobs).
    None otherwise."""
    if not remeasured or len(remeasured) >= policy.remeasures:
        return None
    screened = screen(alerted, ancestry, alerts, threshold_pct, policy)
    if screened is None or screened.verdict is None:
        return None
    window = [as_job(r) for r in screened.window]
    calm = _calm(remeasured, window, policy)
    again = timing.decide([as_job(r) for r in (calm or remeasured)], window, threshold_pct, screened.changed, policy,
                          screened.history)
    if again is None:
        return None
    if not calm:
        return OneMore(again, SLOW_MOMENT) if timing.agree(screened.verdict, again, policy) \
            or timing.at_the_new_level(again, screened.verdict) else None
    if not again.regressed:
        return OneMore(again, NEAR_THE_NEW_LEVEL) if timing.at_the_new_level(again, screened.verdict) else None
    common = timing.agree(screened.verdict, again, policy) and _too_common(
        screened, [as_job(r) for r in (alerted, *calm)], ancestry, alerts, policy, machine)
    return OneMore(again, TOO_COMMON) if common else None


def _calm(results: list, window: list[timing.Job], policy: timing.TimingPolicy) -> list:
    """The results whose canary ran at the window's pace. A job timed in a slow moment of the machine
    cannot tell a step from the moment: on a machine whose slow moments are common (epyc1's capture:
    a sixth of all jobs 30-100% slow, two thirds of them with a slow canary), two such jobs in a row
    were the false alarms the null chance let through, so only calm jobs confirm."""
    return [r for r in results if not timing.in_slow_moment(as_job(r), window, policy)]


def _too_common(screened: Screened, jobs: list[timing.Job], ancestry: list, alerts: dict,
                policy: timing.TimingPolicy, machine: Machine) -> bool:
    """Would the series' history alone give these jobs (the alerted one and those confirming it), each as
    slow as it is against the window, more often than the policy's budget (`timing.too_common`)? The
    history's commits whose alert was suspected and never confirmed hold their re-measurement; the
    suspected job's own change is counted beside it, but for the nearest commits' (a step that began
    there leaves a suspicion at each of its first commits: they are the step, not the machine). The
    machine's other series are judged as well (`timing.null_chance`); they are a query, read only here."""
    replaced = [alert.change_pct for r in ancestry[policy.tail_neighbours:]
                if (alert := alerts.get(r.commit_id)) is not None and alert.state == "suspected"
                and alert.change_pct is not None]
    return timing.too_common(screened.history, timing.changes(jobs, screened.verdict.before_ms, policy), policy,
                             replaced, machine())


@dataclass(frozen=True)
class _SinceAlert:
    """What deciding on a suspected alert reads, once per posted result: the alerted result, its measured
    ancestry and the alerted commit's other re-measurements (in the order they came), and the machine's
    series (read at most once, and only if a confirmation is judged: both deciders may ask)."""

    alerted: Result
    ancestry: list[Result]
    remeasured: list[Result]
    machine: Machine


def _since_alert(session: Session, alert: Alert, result: Result, policy: timing.TimingPolicy) -> _SinceAlert:
    alerted = session.get(Result, alert.result_id)
    remeasured = list(session.scalars(
        select(Result).where(Result.commit_id == alert.commit_id, Result.fingerprint == alerted.fingerprint,
                             Result.id != alert.result_id, Result.id != result.id).order_by(Result.id)))
    return _SinceAlert(alerted, measured_ancestry(session, alerted, policy), remeasured,
                       functools.cache(lambda: machine_levels(session, result, policy)))


def _measure_again(alert: Alert, result: Result, alerts: dict[int, Alert], threshold_pct: float,
                   policy: timing.TimingPolicy, since: _SinceAlert) -> list[Alert]:
    """[alert], still suspected, when `result` (a re-measurement of its commit) asks for one more
    (`measure_again`): remeasure.py queues it, a client re-posts."""
    verdict = measure_again(since.alerted, since.ancestry, alerts, [*since.remeasured, result], threshold_pct, policy,
                            since.machine)
    if verdict is None:
        return []
    times = f". Re-measured {len(since.remeasured) + 1} time(s): {verdict.verdict.change_pct:+.1f}%"
    alert.message += times + {
        TOO_COMMON: ", past the bar, but this series or its machine has had jobs that slow too often to confirm on so "
                    "few, so measured once more",
        NEAR_THE_NEW_LEVEL: ", nearer this level than the window's but not past the bar, so measured once more",
        SLOW_MOMENT: ", but the machine was in a slow moment (the canary ran slow), which cannot confirm a step, so "
                     "measured once more",
    }[verdict.why]
    return [alert]


def _confirm_if_agrees(
    session: Session,
    alert: Alert,
    result: Result,
    alerts: dict[int, Alert],
    threshold_pct: float,
    policy: timing.TimingPolicy,
    since: _SinceAlert,
) -> list[Alert]:
    """Confirm `alert` when `result`, a re-measurement of its commit or the next commit's result, agrees
    with it together with the jobs measured since it (`confirmation`)."""
    ancestry = since.ancestry
    here = result.commit_id == alert.commit_id
    remeasured, later = ([*since.remeasured, result], []) if here else (since.remeasured, [result])
    verdict = confirmation(since.alerted, ancestry, alerts, remeasured, later, threshold_pct, policy,
                           since.machine)
    if verdict is None:
        return []
    commit = session.get(Commit, result.commit_id)
    what = "a re-measurement" if here else f"the next commit {commit.sha[:12]}"
    note = f". Confirmed by {what}: {verdict.change_pct:+.1f}% against the same window"
    earlier = _step_began_before(session, alert, ancestry, alerts, verdict, threshold_pct, policy)
    if earlier is not None:  # raised one commit late: the step began at the previous commit
        alert.message += (f". {what[0].upper()}{what[1:]} agreed ({verdict.change_pct:+.1f}%), but the step began at "
                          "the previous commit, whose alert was confirmed instead")
        note = (f". Confirmed by {what} ({commit.sha[:12]}: {verdict.change_pct:+.1f}% against the window); the step "
                f"began here, this commit's re-measurement already being nearer the new level than the old")
        alert = earlier
    alert.state, alert.confirmed_result_id, alert.confirmed_at = "confirmed", result.id, utc_now()
    alert.message += note
    return [alert]


def _step_began_before(
    session: Session,
    alert: Alert,
    ancestry: list[Result],
    alerts: dict[int, Alert],
    verdict: timing.TimingVerdict,
    threshold_pct: float,
    policy: timing.TimingPolicy,
) -> Alert | None:
    """The still-suspected alert at the commit before `alert`'s when the step `verdict` confirms began
    there: that commit's first job crossed the bar but disagreed in size with the next ones, so `alert`
    was raised one commit late. Its re-measurement tells a step from a slow moment just before the step
    (`timing.slow_moment_before`): it must sit nearer the new level than the old one."""
    if not ancestry:
        return None
    previous = ancestry[0]  # the latest result at the commit before: its re-measurement, if it had one
    earlier = alerts.get(previous.commit_id)
    if earlier is None or earlier.state != "suspected" or earlier.result_id == previous.id:
        return None
    earlier_ancestry = measured_ancestry(session, session.get(Result, earlier.result_id), policy)
    window = baseline_window(earlier_ancestry, alerts, policy.window)
    if not window:
        return None
    again = timing.decide(as_job(previous), [as_job(r) for r in window], threshold_pct,
                          code_changed(previous, window, policy), policy, [as_job(r) for r in earlier_ancestry])
    return earlier if again is not None and timing.at_the_new_level(again, verdict) else None
