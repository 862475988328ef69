"""Read the history of results: the series per model × engine × level with their change points (and
where those disagree with the timing alerts), and one commit's diff against its baselines."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Text, cast, func, select
from sqlalchemy.orm import Session

from service.alerts.change_points import WindowResults, change_points
from service.models import Alert, Commit, Model, Project, Result
from service.usecases.baselines import find_baseline
from service.usecases.commits import get_commit


def history(
    session: Session,
    project: Project,
    model: Model | None = None,
    engine: str | None = None,
    level: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """One series per (model, engine, level, machine class), points in commit order (oldest first): the
    latest result at each of the series' last `limit` commits (a re-measurement replaces the earlier one).

    Only the columns a point shows are read, never the timing samples themselves (their count is
    counted by the database), and the database picks each series' last `limit` commits, so a read
    of 10,000 commits costs what its rows cost."""
    filters = [Result.project_id == project.id]
    if model is not None:
        filters.append(Result.model_id == model.id)
    if engine is not None:
        filters.append(Result.engine == engine)
    if level is not None:
        filters.append(Result.level == level)
    # Narrow first: the latest result per series and commit, from the series index alone; then each
    # series' last `limit` commits; only then the wide columns, for the rows kept (sorted here, since a
    # database sorting wide rows took longer than reading them).
    series_key = (Result.model_id, Result.engine, Result.level, Result.machine_class)
    latest = (
        select(func.max(Result.id).label("id"), *series_key, Result.commit_id)
        .where(*filters)
        .group_by(*series_key, Result.commit_id)
        .subquery()
    )
    partition = (latest.c.model_id, latest.c.engine, latest.c.level, latest.c.machine_class)
    ranked = (
        select(latest.c.id, func.row_number().over(partition_by=partition, order_by=Commit.seq.desc()).label("rank"),
               func.count().over(partition_by=partition).label("total"))
        .join(Commit, Commit.id == latest.c.commit_id)
        .subquery()
    )
    query = (
        select(
            Result.id, Model.name.label("model"), Result.engine, Result.level, Result.machine_class,
            Result.engine_version, Result.graph_hash, cast(Result.fusions, Text).label("fusions"), Result.nodes_after,
            Result.median_ms, Result.p10_ms, Result.p90_ms, Result.mad_ms,
            func.json_array_length(Result.execute_ms).label("samples"), Result.numeric_ok,
            Commit.sha, Commit.branch, Commit.message, Commit.timestamp, ranked.c.total, Commit.seq,
        )
        .select_from(ranked)
        .join(Result, Result.id == ranked.c.id)
        .join(Commit, Commit.id == Result.commit_id)
        .join(Model, Model.id == Result.model_id)
        .where(ranked.c.rank <= limit)
    )
    rows = sorted(session.execute(query).all(), key=lambda row: (row[-1], row[0]))  # (seq, result id)
    # Fused-op counts read as text and parsed once per distinct value: a series repeats the same few.
    parsed: dict[str | None, dict[str, int]] = {None: {}}
    series: dict[tuple, dict[str, Any]] = {}
    totals: dict[tuple, int] = {}  # commits in each whole series, of which the last `limit` are read
    for (result_id, model_name, engine_name, level_name, machine_class, engine_version, graph_hash, fusions_text,
         nodes_after, median_ms, p10_ms, p90_ms, mad_ms, samples, numeric_ok, sha, branch, message, timestamp,
         total, _) in rows:
        key = (model_name, engine_name, level_name, machine_class)
        points = series.get(key)
        if points is None:
            points = series[key] = []
            totals[key] = total
        fusions = parsed.get(fusions_text)
        if fusions is None:
            fusions = parsed[fusions_text] = json.loads(fusions_text)
        points.append({
            "commit": sha,
            "branch": branch,
            # The first line's first 200 characters, without splitting a 10,000-character message whole.
            "message": message[:201].splitlines()[0][:200] if message else "",
            "timestamp": timestamp.isoformat() if timestamp else None,
            "result_id": result_id,
            "engine_version": engine_version,
            "graph_hash": graph_hash,
            "fusions": fusions,
            "nodes_after": nodes_after,
            "median_ms": median_ms,
            "p10_ms": p10_ms,
            "p90_ms": p90_ms,
            "mad_ms": mad_ms,
            "samples": samples or 0,
            "numeric_ok": numeric_ok,
        })
    found = []
    for key, points in series.items():
        entry = {"model": key[0], "engine": key[1], "level": key[2], "machine_class": key[3], "points": points}
        _mark_change_points(session, project, entry, first=totals[key] - len(points))
        found.append(entry)
    return found


AGREE_WITHIN = 2  # commits between a change point and an alert that still count as the same step

# Change points are computed per window of the series and each window's result kept
# (service/alerts/change_points.py): a read after a new result recomputes the last window or two, not
# E-divisive's permutation tests over all 10,000 commits.
_windows_seen = WindowResults()


def _mark_change_points(session: Session, project: Project, entry: dict[str, Any], first: int) -> None:
    """The series' change points (E-divisive means over each commit's p10), each with the timing alert
    raised near it, and `disagreements`: rises the alerts missed, and alerts no change point backs.
    `first` is the position of the first point read in the whole series (the windows are placed on it)."""
    points = entry["points"]
    timed = [(i, p) for i, p in enumerate(points) if p["p10_ms"]]
    values = [p["p10_ms"] for _, p in timed]
    found = change_points(values, first=first, results=_windows_seen) if len(timed) >= 6 else []
    model_id = session.scalar(select(Model.id).where(Model.project_id == project.id, Model.name == entry["model"]))
    alerts = session.execute(
        select(Alert, Commit.sha).join(Commit, Commit.id == Alert.commit_id).where(
            Alert.project_id == project.id, Alert.kind == "timing-regression", Alert.model_id == model_id,
            Alert.engine == entry["engine"], Alert.level == entry["level"],
        ).order_by(Alert.id)
    ).all()
    position = {p["commit"]: i for i, p in enumerate(points)}
    alerted = {position[sha]: alert for alert, sha in alerts if sha in position}
    entry["change_points"], entry["disagreements"] = [], []
    backed: set[int] = set()
    for cp in found:
        at = timed[cp.index][0]
        near = [i for i in alerted if abs(i - at) <= AGREE_WITHIN]
        alert = alerted[min(near, key=lambda i: abs(i - at))] if near else None
        backed.update(near)
        change = (cp.after - cp.before) / cp.before * 100
        entry["change_points"].append({
            "commit": points[at]["commit"], "index": at, "before_p10_ms": cp.before, "after_p10_ms": cp.after,
            "change_pct": change, "p_value": cp.p_value,
            "alert": {"id": alert.id, "state": alert.state} if alert else None,
        })
        if alert is None and change > 0:
            entry["disagreements"].append({
                "commit": points[at]["commit"], "what": "change point without a timing alert",
                "change_pct": change,
            })
    for i, alert in sorted(alerted.items()):
        if i not in backed and alert.state != "suspected":
            entry["disagreements"].append({
                "commit": points[i]["commit"], "what": "timing alert without a change point",
                "alert": {"id": alert.id, "state": alert.state},
            })


def commit_diff(session: Session, project: Project, sha: str) -> dict[str, Any]:
    commit = get_commit(session, project, sha)
    results = session.execute(
        select(Result, Model.name).join(Model, Model.id == Result.model_id)
        .where(Result.commit_id == commit.id).order_by(Result.id)
    ).all()
    latest: dict[str, tuple[Result, str]] = {}
    for result, name in results:
        latest[result.fingerprint] = (result, name)
    entries = []
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
                              "change_pct": _pct(baseline.median_ms if baseline else None, result.median_ms)},
                "top_kernels": result.top_kernels,
                "near_misses": result.near_misses[:50],
            }
        )
    return {"project": project.name, "commit": commit.sha, "branch": commit.branch, "models": entries}


def _changes(before: dict[str, int], after: dict[str, int]) -> dict[str, dict[str, int]]:
    return {op: {"before": before.get(op, 0), "after": after.get(op, 0)} for op in sorted(set(before) | set(after))}


def _pct(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (after - before) / before * 100
