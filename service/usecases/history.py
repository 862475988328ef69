"""Read the history of results: the series per model × engine × level, and one commit's diff against
its baselines."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Commit, Model, Project, Result
from service.usecases.baselines import find_baseline
from service.usecases.commits import get_commit


def _point(result: Result, commit: Commit) -> dict[str, Any]:
    return {
        "commit": commit.sha,
        "branch": commit.branch,
        "message": commit.message.splitlines()[0][:200] if commit.message else "",
        "timestamp": commit.timestamp.isoformat() if commit.timestamp else None,
        "result_id": result.id,
        "engine_version": result.engine_version,
        "graph_hash": result.graph_hash,
        "fusions": result.fusions,
        "nodes_after": result.nodes_after,
        "median_ms": result.median_ms,
        "p10_ms": result.p10_ms,
        "p90_ms": result.p90_ms,
        "mad_ms": result.mad_ms,
        "samples": len(result.execute_ms),
        "numeric_ok": result.numeric_ok,
    }


def history(
    session: Session,
    project: Project,
    model: Model | None = None,
    engine: str | None = None,
    level: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """One series per (model, engine, level, machine class), points in commit order (oldest first)."""
    query = (
        select(Result, Commit, Model.name)
        .join(Commit, Commit.id == Result.commit_id)
        .join(Model, Model.id == Result.model_id)
        .where(Result.project_id == project.id)
    )
    if model is not None:
        query = query.where(Result.model_id == model.id)
    if engine is not None:
        query = query.where(Result.engine == engine)
    if level is not None:
        query = query.where(Result.level == level)
    rows = session.execute(query.order_by(Commit.seq.desc(), Result.id.desc()).limit(limit * 20)).all()
    series: dict[tuple, dict[str, Any]] = {}
    for result, commit, model_name in reversed(rows):
        key = (model_name, result.engine, result.level, result.machine_class)
        entry = series.setdefault(
            key,
            {"model": model_name, "engine": result.engine, "level": result.level,
             "machine_class": result.machine_class, "points": []},
        )
        points = entry["points"]
        if points and points[-1]["commit"] == commit.sha:
            points[-1] = _point(result, commit)  # a re-measurement replaces the earlier one
        else:
            points.append(_point(result, commit))
    for entry in series.values():
        entry["points"] = entry["points"][-limit:]
    return list(series.values())


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
