"""Bisect: which commit to measure next when a regression spans commits that were never measured.

Between a good and a bad commit (oldest first, either given — the client's `git rev-list` — or the
recorded first-parent chain from bad back to good), each measured commit is judged against the two
ends: exactly for fused-op counts (equal to good's counts, or not), statistically for timings (the
side whose p10 is nearer, on a log scale, with the rank test's p-value against the other side). The
answer is the middle unmeasured commit between the last good and the first bad one after it, or,
once they are adjacent, the culprit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain.stats import mann_whitney_greater
from service.domain.vocabulary import AlertKind
from service.errors import Invalid, NotFound
from service.models import Alert, Commit, Model, Project, Result
from service.usecases.commits import get_commit
from service.usecases.projects import get_project

KINDS = ("fusion", "timing")
MAX_PATH = 10_000


def bisect_alert(session: Session, alert_id: int) -> dict[str, Any]:
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"no alert {alert_id}")
    if alert.kind not in (AlertKind.FUSION_REGRESSION, AlertKind.TIMING_REGRESSION) or alert.baseline_commit_id is None:
        raise Invalid(f"alert {alert_id} is a {alert.kind} alert without a baseline commit: nothing to bisect")
    bad_result = session.get(Result, alert.result_id)
    kind = "fusion" if alert.kind == AlertKind.FUSION_REGRESSION else "timing"
    return bisect(session, session.get(Project, alert.project_id), session.get(Commit, alert.baseline_commit_id),
                  session.get(Commit, alert.commit_id), bad_result.fingerprint, kind)


def bisect_range(
    session: Session,
    project_name: str,
    authorize: Callable[[Project], None],
    good_sha: str,
    bad_sha: str,
    model: str | None = None,
    engine: str | None = None,
    level: str | None = None,
    kind: str | None = None,
    commits: list[str] | None = None,
) -> dict[str, Any]:
    """Bisect between two commits the client names. The series is the one given by model, engine and level,
    or else the one the bad commit's latest regression alert is about. `authorize` is asked first: the
    client is about to measure, so it must be one that may write to the project."""
    project = get_project(session, project_name)
    authorize(project)
    good, bad = get_commit(session, project, good_sha), get_commit(session, project, bad_sha)
    if kind is not None and kind not in KINDS:
        raise Invalid(f"kind must be one of {list(KINDS)}, got {kind[:50]!r}")
    query = select(Result).where(Result.commit_id == bad.id)
    if model is not None:
        model_id = session.scalar(select(Model.id).where(Model.project_id == project.id, Model.name == model))
        query = query.where(Result.model_id == model_id)
    if engine is not None:
        query = query.where(Result.engine == engine)
    if level is not None:
        query = query.where(Result.level == level)
    candidates = session.scalars(query.order_by(Result.id.desc())).all()
    if not candidates:
        raise NotFound(f"commit {bad.sha[:12]} has no result for that model, engine and level")
    alerts = session.scalars(
        select(Alert).where(Alert.commit_id == bad.id, Alert.kind.in_((AlertKind.FUSION_REGRESSION, AlertKind.TIMING_REGRESSION))
                            ).order_by(Alert.id.desc())).all()
    ids = {r.id for r in candidates}
    chosen = next((a for a in alerts if a.result_id in ids), None)
    if chosen is None and len({r.fingerprint for r in candidates}) > 1:
        raise Invalid("several series were measured at the bad commit and none has an alert there: "
                      "name the model, engine and level")
    result = session.get(Result, chosen.result_id) if chosen else candidates[0]
    if kind is None:
        kind = "timing" if chosen is not None and chosen.kind == AlertKind.TIMING_REGRESSION else "fusion"
    return bisect(session, project, good, bad, result.fingerprint, kind, commits)


def bisect(
    session: Session,
    project: Project,
    good: Commit,
    bad: Commit,
    fingerprint: str,
    kind: str,
    commits: list[str] | None = None,
) -> dict[str, Any]:
    path = _between(session, project, good, bad, commits)
    latest = {
        row.commit_id: row
        for row in session.scalars(select(Result).where(Result.fingerprint == fingerprint).order_by(Result.id))
    }
    good_result, bad_result = latest.get(good.id), latest.get(bad.id)
    if good_result is None or bad_result is None:
        raise Invalid(f"both ends must be measured: good {good.sha[:12]} "
                      f"{'is' if good_result else 'is not'}, bad {bad.sha[:12]} {'is' if bad_result else 'is not'}")
    entries = []
    for sha in path:
        commit = session.scalar(select(Commit).where(Commit.project_id == project.id, Commit.sha == sha))
        result = latest.get(commit.id) if commit is not None else None
        entry: dict[str, Any] = {"commit": sha, "measured": result is not None, "verdict": None}
        if result is not None:
            entry |= _judge(kind, result, good_result, bad_result)
        entries.append(entry)
    last_good = max((i for i, e in enumerate(entries) if e["verdict"] == "good"), default=-1)
    first_bad = min((i for i, e in enumerate(entries) if e["verdict"] == "bad" and i > last_good), default=len(entries))
    unmeasured = [i for i in range(last_good + 1, first_bad) if not entries[i]["measured"]]
    culprit = next_commit = None
    if unmeasured:
        next_commit = entries[unmeasured[(len(unmeasured) - 1) // 2]]["commit"]
    else:
        culprit = entries[first_bad]["commit"] if first_bad < len(entries) else bad.sha
    return {
        "project": project.name, "kind": kind, "good": good.sha, "bad": bad.sha,
        "commits": entries, "next": next_commit, "culprit": culprit,
        "remaining": len(unmeasured), "steps_left": math.ceil(math.log2(len(unmeasured) + 1)),
    }


def _between(session: Session, project: Project, good: Commit, bad: Commit, commits: list[str] | None) -> list[str]:
    """The commits strictly between good and bad, oldest first."""
    if commits is not None:
        if len(commits) > MAX_PATH:
            raise Invalid(f"at most {MAX_PATH} commits between good and bad")
        return [c for c in commits if c not in (good.sha, bad.sha)]
    by_sha = {c.sha: c for c in session.scalars(select(Commit).where(Commit.project_id == project.id))}
    chain, current = [], bad
    while current.parents:
        parent = by_sha.get(current.parents[0])
        if parent is None:
            raise Invalid(f"commit {bad.sha[:12]}'s first-parent chain leaves the recorded commits at "
                          f"{current.parents[0][:12]} before reaching {good.sha[:12]}: pass the commits between")
        if parent.id == good.id:
            return list(reversed(chain))
        chain.append(parent.sha)
        current = parent
    raise Invalid(f"commit {good.sha[:12]} is not a first-parent ancestor of {bad.sha[:12]}: pass the commits between")


def _judge(kind: str, result: Result, good: Result, bad: Result) -> dict[str, Any]:
    if kind == "fusion":
        return {"verdict": "good" if result.fusions == good.fusions else "bad", "fusions": result.fusions}
    if not (result.p10_ms and good.p10_ms and bad.p10_ms):
        return {"verdict": None}
    here = math.log(result.p10_ms)
    nearer_good = abs(here - math.log(good.p10_ms)) <= abs(here - math.log(bad.p10_ms))
    samples = np.asarray(result.execute_ms)
    p = (mann_whitney_greater(bad.execute_ms, samples) if nearer_good
         else mann_whitney_greater(samples, good.execute_ms))
    return {"verdict": "good" if nearer_good else "bad", "p10_ms": result.p10_ms, "p_value": p}
