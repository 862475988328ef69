"""Read the history of results: the series per model × engine × level with their change points (and
where those disagree with the timing alerts), and one commit's diff against its baselines."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain import verdict_words
from service.domain.vocabulary import AlertKind
from service.models import Alert, Commit, Model, Project, Result
from service.queries.timing_words import timing_alert_states
from service.usecases.baselines import find_baseline
from service.usecases.change_point_windows import SeriesWindows
from service.usecases.commits import get_commit
from service.usecases.history_points import SeriesPoints, series_points, series_windows
from service.usecases.projects import get_project


def history(
    session: Session,
    project: Project,
    model: Model | None = None,
    engine: str | None = None,
    level: str | None = None,
    limit: int = 1000,
    computed: list[SeriesWindows] | None = None,
) -> list[dict[str, Any]]:
    """One series per (model, engine, level, machine class), points in commit order (oldest first): the
    latest result at each of the series' last `limit` commits (a re-measurement replaces the earlier one).

    Each point was rendered when its result was stored (usecases/history_points.py); entries carry
    them as `Points`, for the reply to splice in.

    Change-point windows computed on the way are added to `computed`, for the caller to store
    (usecases/change_point_windows.py: store_computed) once the reply is out."""
    found = []
    for kept in series_points(session, project, model, engine, level, limit):
        model_name, engine_name, level_name, machine_class = kept.key
        entry = {"model": model_name, "engine": engine_name, "level": level_name, "machine_class": machine_class,
                 "points": kept.points}
        windows = _mark_change_points(session, project, entry, kept)
        if computed is not None and windows.computed:
            computed.append(windows)
        found.append(entry)
    return found


AGREE_WITHIN = 2  # commits between a change point and an alert that still count as the same step

def _mark_change_points(
    session: Session, project: Project, entry: dict[str, Any], series: SeriesPoints
) -> SeriesWindows:
    """The series' change points (E-divisive means over each commit's p10), each with the timing alert
    raised near it, and `disagreements`: rises the alerts missed, and alerts no change point backs.
    Returns the windows asked, with those computed."""
    shas, timed, position, model_id = series.shas, series.timed, series.positions, series.model_id
    alerts = session.execute(
        select(Alert, Commit.sha).join(Commit, Commit.id == Alert.commit_id).where(
            Alert.project_id == project.id, Alert.kind == AlertKind.TIMING_REGRESSION, Alert.model_id == model_id,
            Alert.engine == entry["engine"], Alert.level == entry["level"],
        ).order_by(Alert.id)
    ).all()
    alerted = {position[sha]: alert for alert, sha in alerts if sha in position}
    entry["change_points"], entry["disagreements"] = [], []
    backed: set[int] = set()
    windows = series_windows(session, model_id, series.key)
    for cp in series.change_points(windows):
        at = timed[cp.index]
        near = [i for i in alerted if abs(i - at) <= AGREE_WITHIN]
        alert = alerted[min(near, key=lambda i: abs(i - at))] if near else None
        backed.update(near)
        change = (cp.after - cp.before) / cp.before * 100
        entry["change_points"].append({
            "commit": shas[at], "index": at, "before_p10_ms": cp.before, "after_p10_ms": cp.after,
            "change_pct": change, "p_value": cp.p_value,
            "alert": {"id": alert.id, "state": alert.state} if alert else None,
        })
        if alert is None and change > 0:
            entry["disagreements"].append({
                "commit": shas[at], "what": "change point without a timing alert",
                "change_pct": change,
            })
    for i, alert in sorted(alerted.items()):
        if i not in backed and alert.state != "suspected":
            entry["disagreements"].append({
                "commit": shas[i], "what": "timing alert without a change point",
                "alert": {"id": alert.id, "state": alert.state},
            })
    return windows


def commit_diff(session: Session, project_name: str, sha: str) -> dict[str, Any]:
    project = get_project(session, project_name)
    commit = get_commit(session, project, sha)
    results = session.execute(
        select(Result, Model.name).join(Model, Model.id == Result.model_id)
        .where(Result.commit_id == commit.id).order_by(Result.id)
    ).all()
    latest: dict[str, tuple[Result, str]] = {}
    for result, name in results:
        latest[result.fingerprint] = (result, name)
    entries = []
    timing_states = timing_alert_states(session, commit.id)
    for result, name in latest.values():
        baseline = find_baseline(session, result)
        base_commit = session.get(Commit, baseline.commit_id) if baseline else None
        ops = sorted(set(result.ops_after) | set(baseline.ops_after if baseline else {}))
        entries.append(
            {
                "model": name,
                "engine": result.engine,
                "level": result.level,
                "engine_version": result.engine_version,
                "baseline_commit": base_commit.sha if base_commit else None,
                "fusions": _changes(baseline.fusions if baseline else {}, result.fusions),
                "ops": {op: c for op, c in _changes(baseline.ops_after if baseline else {}, result.ops_after).items()
                        if op in ops and c["before"] != c["after"]},
                "median_ms": {"before": baseline.median_ms if baseline else None, "after": result.median_ms,
                              "change_pct": _pct(baseline.median_ms if baseline else None, result.median_ms),
                              "p10": result.p10_ms, "p90": result.p90_ms},
                "top_kernels": result.top_kernels,
                "kernel_libraries": {"before": baseline.kernel_libraries if baseline else None,
                                     "after": result.kernel_libraries},
                "near_misses": result.near_misses,  # every one stored: machines read all of them
                # What the timing decision said, in words (service/domain/verdict_words.py), and the
                # baseline timed beside this result in its job, when it was (service/domain/paired.py).
                "timing": verdict_words.shown(result.timing_verdict,
                                              timing_states.get((result.model_id, result.engine, result.level))),
                "paired": result.paired,
            }
        )
    return {"project": project.name, "commit": commit.sha, "branch": commit.branch, "models": entries}


def _changes(before: dict[str, int], after: dict[str, int]) -> dict[str, dict[str, int]]:
    return {op: {"before": before.get(op, 0), "after": after.get(op, 0)} for op in sorted(set(before) | set(after))}


def _pct(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (after - before) / before * 100
