"""Fused-op counts against the baseline: one alert per problem, with its cause, and a lifecycle.

fusion-regression: a fused op's count dropped (optimizer/fused_ops.py says what counts), at a level
where rules run. One alert per (project, commit, model, lost op); each engine and level that lost it
is an entry of its `changes`. The first result to raise it explains it (cause.py): the cause, a
verified reproduction model of each side (stored with the model files), and, where the baseline's
file is stored, what the fusion was worth in time (cost.py). A later commit whose results restore
the count at every entry resolves it (`resolved`, `resolved_by`), instead of opening anything new.

fusion-change: counts rose, or a drop was taken up by a rise (an op absorbed into a larger fusion,
or one standing where a restored op now stands again; service/domain/fusion_changes.py decides which):
information (state `info`), never attention.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.adapters.storage import ModelStore
from service.domain.fusion_changes import count_changes, separate_absorbed
from service.domain.protocol import Protocol
from service.domain.vocabulary import AlertKind
from service.models import Alert, Commit, Model, ModelFile, Result
from service.models.base import utc_now
from service.usecases.cause import Files, explain
from service.usecases.cost import lost_fusion_cost

log = logging.getLogger("fusionwatch.alerts")

UNRESOLVED = ("open", "acknowledged")


def detect_fusions(
    session: Session, result: Result, baseline: Result, model: Model, commit: Commit, baseline_commit: Commit,
    protocol: Protocol, common: dict[str, Any], store: ModelStore | None,
) -> list[Alert]:
    """The fusion alerts `result` raises, updates or resolves; the ones to show for it are returned."""
    if result.level == "disabled":
        return []  # no rule runs there: the counts describe the export, and a drop is no lost fusion
    drops, rises = count_changes(baseline.fusions, result.fusions)
    if drops or rises:  # unchanged counts open nothing, so most results write without waiting on others
        _lock_model(session, model)
    restored = _resolve(session, result, commit)
    kept, absorbed = separate_absorbed(drops, rises, restored=sum(restored.values()),
                                       ops_before=baseline.ops_after or None, ops_after=result.ops_after or None)
    rises += absorbed  # reported with the rises that took them up, as information
    alerts = []
    for change in kept:
        alerts.append(_regression(session, result, baseline, model, commit, baseline_commit, change, protocol,
                                  common, store))
    if rises:
        where = f"model {model.name}, {result.engine} {result.engine_version}, level {result.level}"
        against = f"at commit {commit.sha[:12]} against baseline {baseline_commit.sha[:12]}"
        parts = [f"{c['rule']}: {c['op']} {c['before']} → {c['after']}" if c["rule"] else
                 f"{c['op']} {c['before']} → {c['after']} (in the export as written: no rule makes it)" for c in rises]
        message = f"{'; '.join(parts)} for {where} {against}"
        if absorbed:  # a drop shown here, not as a regression: say why
            dropped = ", ".join(f"{c['op'].rsplit('.', 1)[-1]} {c['before']} → {c['after']}" for c in absorbed)
            message += (f". No fusion lost: {dropped} is taken up by what rose here (the same nodes fused in "
                        "another form or a larger fusion, or a fusion an earlier regression lost, restored)")
        lead = rises[0]
        alerts.append(Alert(
            kind=AlertKind.FUSION_CHANGE, state="info", op=lead["op"], rule=lead["rule"], before=lead["before"],
            after=lead["after"], change_pct=lead["change_pct"], changes=rises,
            message=message, near_misses=[], **common,
        ))
    return alerts


def _lock_model(session: Session, model: Model) -> None:
    """One writer at a time decides a model's fusion alerts (PostgreSQL): two engines' results of one
    commit would otherwise both open the alert that is one problem. SQLite writes one at a time.
    FOR NO KEY UPDATE, not FOR UPDATE: the foreign-key check of every result inserted for this model
    takes FOR KEY SHARE on its row, and FOR UPDATE would hold those inserts until this transaction ends."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(Model.id).where(Model.id == model.id).with_for_update(key_share=True))


def _regression(session, result, baseline, model, commit, baseline_commit, change, protocol, common, store) -> Alert:
    entry = {"engine": result.engine, "engine_version": result.engine_version, "level": result.level,
             "before": change["before"], "after": change["after"], "change_pct": change["change_pct"],
             "baseline_commit": baseline_commit.sha, "result_id": result.id}
    alert = session.scalar(select(Alert).where(
        Alert.kind == AlertKind.FUSION_REGRESSION, Alert.project_id == result.project_id, Alert.commit_id == commit.id,
        Alert.model_id == model.id, Alert.op == change["op"]))
    if alert is not None:
        if not any(e.get("engine") == result.engine and e.get("level") == result.level for e in alert.changes):
            alert.changes = [*alert.changes, entry]
            alert.message = _message(alert, model, commit)
        return alert
    files = _files(session, store, result, baseline)
    cause, repros = explain(change["op"], change["rule"], result, baseline, files)
    if repros and store is not None:
        for side, data in repros.items():
            stored = store.put(f"{side}.onnx", {f"{side}.onnx": data})
            cause["structure"]["repro"][side] = {"sha256": stored.sha256, "filename": stored.filename}
    if files.baseline is not None and change["rule"]:
        cause["cost"] = lost_fusion_cost(change["op"], change["rule"], result.engine, result.level, files.baseline,
                                         protocol)
    elif files.baseline is None:
        cause["cost"] = {"error": "the baseline's model file is not stored (it was measured elsewhere and posted), "
                                  "so there is nothing to time with and without the rule"}
    alert = Alert(
        kind=AlertKind.FUSION_REGRESSION, state="open", op=change["op"], rule=change["rule"], before=change["before"],
        after=change["after"], change_pct=change["change_pct"], changes=[entry], message="",
        near_misses=cause["near_misses"], cause=cause, **common,
    )
    alert.message = _message(alert, model, commit)
    return alert


def _message(alert: Alert, model: Model, commit: Commit) -> str:
    """One line: what was lost, where, against what, and why."""
    what = "stopped firing" if alert.after == 0 else "fired less"
    engines = ", ".join(f"{e['engine']} {e['engine_version']} {e['level']}" for e in alert.changes)
    baselines = sorted({e["baseline_commit"][:12] for e in alert.changes})
    line = (f"{alert.rule or alert.op} {what}: {alert.op} {int(alert.before)} → {int(alert.after)} for model {model.name} "
            f"({engines}) at commit {commit.sha[:12]} against baseline {', '.join(baselines)}")
    cause = (alert.cause or {}).get("text")
    cost = ((alert.cause or {}).get("cost") or {}).get("text")
    return line + (f". Cause: {cause}" if cause else "") + (f" {cost}." if cost else "")


def _files(session: Session, store: ModelStore | None, result: Result, baseline: Result) -> Files:
    def path(result_row: Result):
        if store is None or result_row.model_file_id is None:
            return None
        file = session.get(ModelFile, result_row.model_file_id)
        try:
            return store.get(file.sha256, file.filename, file.data_files).path
        except FileNotFoundError:
            log.warning("stored model file missing", extra={"model_file_id": file.id})
            return None

    return Files(current=path(result), baseline=path(baseline))


def _resolve(session: Session, result: Result, commit: Commit) -> dict[str, int]:
    """Mark the entries of earlier regressions of this model that `result` restores; resolve an alert
    once all its entries are restored. Returns how much of each op this result restored."""
    restored: dict[str, int] = {}
    touched: dict[int, tuple[Alert, list[dict[str, Any]]]] = {}
    for alert, index, amount in restorations(session, result.project_id, result.model_id, result.engine, result.level,
                                             result.fusions, commit):
        restored[alert.op] = restored.get(alert.op, 0) + amount
        entries = touched.setdefault(alert.id, (alert, list(alert.changes)))[1]
        entries[index] = entries[index] | {"restored_by": commit.sha}
    for alert, entries in touched.values():
        alert.changes = entries
        if all(e.get("restored_by") for e in entries):
            alert.state, alert.resolved_by_commit_id, alert.resolved_at = "resolved", commit.id, utc_now()
            log.info("fusion regression resolved", extra={"alert_id": alert.id, "commit": commit.sha[:12]})
    return restored


def restorations(session: Session, project_id: int, model_id: int, engine: str, level: str, fusions: dict[str, int],
                 commit: Commit) -> list[tuple[Alert, int, int]]:
    """(alert, index of its entry, count restored) for each entry, at this engine and level, of an earlier
    unresolved regression of the model that the counts `fusions` at `commit` bring back. Reads only."""
    found = []
    candidates = session.scalars(select(Alert).where(
        Alert.kind == AlertKind.FUSION_REGRESSION, Alert.project_id == project_id, Alert.model_id == model_id,
        Alert.state.in_(UNRESOLVED), Alert.commit_id != commit.id)).all()
    for alert in candidates:
        raised_at = session.get(Commit, alert.commit_id)
        if raised_at is None or raised_at.seq > commit.seq:
            continue
        for index, entry in enumerate(alert.changes):
            if (entry.get("engine"), entry.get("level")) == (engine, level) and not entry.get(
                    "restored_by") and fusions.get(alert.op, 0) >= entry["before"]:
                found.append((alert, index, entry["before"] - entry["after"]))
    return found
