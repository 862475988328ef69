"""A run's fusion verdict: did any fused op stop firing, known as soon as every job's counts are.

A job whose result is recorded speaks through its alerts (fusion_alerts.py: the lost op, its cause);
a job still waiting to be timed, through the counts taken before any job of the run was timed
(service/commands/count_run_fusions.py), compared with its baseline's as the alert will compare them
(service/domain/fusion_changes.py: a drop taken up by the op's other form is no loss). Those drops carry
no cause yet: explaining one rebuilds and times both graphs, which the job's result does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain.fusion_changes import count_changes, separate_absorbed
from service.domain.vocabulary import NOT_FINDINGS, AlertKind
from service.models import Alert, Commit, Job, Result, Run
from service.usecases.baselines import find_baseline
from service.usecases.fusion_alerts import restorations

FINISHED = ("done", "failed")


@dataclass
class FusionVerdict:
    done: bool  # every job's counts are known: recorded with its result, or taken before timing
    verdict: str  # regression (a drop is known, whatever is still running), running, failed, ok
    lost: list[dict[str, Any]] = field(default_factory=list)  # model, engine, level, op, rule, before, after, pending

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "verdict": self.verdict, "lost": self.lost}


def fusion_verdict(session: Session, run: Run, jobs: list[tuple[Job, str]], alerts: list[Alert]) -> FusionVerdict:
    names = {job.model_id: name for job, name in jobs}
    lost = [
        {"model": names.get(alert.model_id, ""), "engine": entry.get("engine"), "level": entry.get("level"),
         "op": alert.op, "rule": alert.rule, "before": entry.get("before"), "after": entry.get("after"),
         "pending": False}
        for alert in alerts if alert.kind == AlertKind.FUSION_REGRESSION and alert.state not in NOT_FINDINGS
        for entry in alert.changes
    ]
    waiting = [(job, name) for job, name in jobs if job.state not in FINISHED]
    for job, name in waiting:
        if job.counts and "fingerprint" in job.counts and job.level != "disabled":
            lost += _drops(session, run, job, name)
    done = all(job.counts is not None for job, _ in waiting)
    failed = any(job.state == "failed" or "error" in (job.counts or {}) for job, _ in jobs)
    if lost:
        verdict = "regression"
    elif not done:
        verdict = "running"
    else:
        verdict = "failed" if failed else "ok"
    return FusionVerdict(done, verdict, lost)


def _drops(session: Session, run: Run, job: Job, model: str) -> list[dict[str, Any]]:
    """What the job's counts lost against its baseline's, as its fusion-regression alerts will say."""
    counts = job.counts
    baseline = _baseline_counts(session, run, job)
    if baseline is None:
        return []
    before, ops_before = baseline
    drops, rises = count_changes(before, counts["fusions"])
    commit = session.get(Commit, run.commit_id)
    restored = restorations(session, run.project_id, job.model_id, job.engine, job.level, counts["fusions"], commit)
    kept, _ = separate_absorbed(drops, rises, restored=sum(amount for _, _, amount in restored),
                                ops_before=ops_before or None, ops_after=counts.get("ops_after") or None)
    return [{"model": model, "engine": job.engine, "level": job.level, "op": c["op"], "rule": c["rule"],
             "before": c["before"], "after": c["after"], "pending": True} for c in kept]


def _baseline_counts(session: Session, run: Run, job: Job) -> tuple[dict[str, int], dict[str, int]] | None:
    """(fusions, ops_after) of the job's baseline: a parent commit's counts where a job of it was counted
    (its results may still be being timed: a commit pushed right after its parent), else the nearest
    measured ancestor's result (service/usecases/baselines.py)."""
    fingerprint = job.counts["fingerprint"]
    commit = session.get(Commit, run.commit_id)
    if commit.parents:
        parents = select(Commit.id).where(Commit.project_id == run.project_id, Commit.sha.in_(commit.parents))
        rows = session.scalars(
            select(Job.counts).join(Run, Run.id == Job.run_id)
            .where(Run.commit_id.in_(parents), Job.model_id == job.model_id, Job.engine == job.engine,
                   Job.level == job.level, Job.counts.is_not(None))
            .order_by(Job.id.desc())
        ).all()
        for counts in rows:
            if counts.get("fingerprint") == fingerprint:
                return counts["fusions"], counts.get("ops_after") or {}
    result = find_baseline(session, Result(fingerprint=fingerprint, commit_id=run.commit_id))
    return (result.fusions, result.ops_after or {}) if result is not None else None
