"""`python -m bench.detect --diagnose`: why each planted step of 10% or more was not confirmed within
two commits.

For every such miss it prints the series, its noise source and project kind, and for each result
posted from the commit before the step to the second after it (a commit's re-measurements on lines of
their own): the job's change against the step's pre-step window (the window the service had when the
step's first job arrived), the bar it had to reach, the window's noise, the rank test's p-value, the
canary's verdict, and the timing alert the service kept at that commit. A miss then reads as one of:
the jobs never crossed the bar (the statistic or the noise estimate), they crossed but disagreed (the
agreement rule), or they crossed and were confirmed too late (the confirmation protocol).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select

from service.domain import timing
from service.models import Alert, Commit, Model, Project, Result
from service.usecases import timing_alerts

BIG_STEP = 0.10
SHOWN_AFTER = 2  # commits after the step's, as "within 2" counts


def diagnose(session, truth: dict, report: dict, misses: list[tuple[str, str]]) -> None:
    """Print the diagnosis of every (project, model) in `misses`."""
    threshold = report["threshold_pct"]
    projects = {p.name: p.id for p in session.scalars(select(Project))}
    print(f"\n{len(misses)} step(s) of ≥ {BIG_STEP:.0%} not confirmed within {SHOWN_AFTER} commits:")
    for project, model in misses:
        t = truth[(project, model)]
        model_id = session.scalar(select(Model.id).where(Model.project_id == projects[project], Model.name == model))
        results = session.scalars(
            select(Result).where(Result.project_id == projects[project], Result.model_id == model_id).order_by(Result.id)
        ).all()
        seq = {c.id: int(c.sha[1:]) for c in session.scalars(select(Commit).where(Commit.project_id == projects[project]))}
        alerts = {a.commit_id: a for a in session.scalars(
            select(Alert).where(Alert.kind == timing_alerts.KIND, Alert.project_id == projects[project],
                                Alert.model_id == model_id).order_by(Alert.id))}
        latest: dict[int, Result] = {}
        by_commit: dict[int, list[Result]] = defaultdict(list)
        for r in results:
            latest[seq[r.commit_id]] = r
            by_commit[seq[r.commit_id]].append(r)
        ancestry = [latest[c] for c in sorted(latest, reverse=True) if c < t["step_at"]]
        window = timing_alerts.baseline_window(ancestry, alerts, timing.DEFAULT_POLICY.window)
        jobs = [timing_alerts.as_job(r) for r in window]
        print(f"- {project}/{model} ({t['kind']}, noise source {t['source']}): step {t['step']:.0%} at commit "
              f"{t['step_at']}, pre-step window {len(window)} jobs")
        for c in range(t["step_at"] - 1, t["step_at"] + SHOWN_AFTER + 1):
            for i, r in enumerate(by_commit.get(c, [])):
                v = timing.decide(timing_alerts.as_job(r), jobs, threshold, timing_alerts.code_changed(r, window),
                                  history=[timing_alerts.as_job(x) for x in ancestry[: timing.DEFAULT_POLICY.window * 5]])
                alert = alerts.get(r.commit_id) if i == 0 else None
                kept = ""
                if alert is not None:
                    confirmed = next((seq[x.commit_id] for x in results if x.id == alert.confirmed_result_id), None)
                    kept = f"; alert {alert.state} {alert.change_pct:+.1f}%" + (
                        f" by commit {confirmed}" if confirmed is not None else "")
                print(f"    commit {c}{' re-measure' if i else ''}: {v.change_pct:+.1f}% vs bar {v.min_effect_pct:.1f}% "
                      f"(noise {v.noise_pct:.1f}%, p {v.p_value:.2g}, canary slow {v.canary_slow_pct:.1f}%, "
                      f"code {'changed' if v.code_changed else 'same'}) → {'crossed' if v.regressed else 'no'}{kept}")
