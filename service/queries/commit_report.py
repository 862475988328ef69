"""What the dashboard's commit page reads: the commit's runs and their progress, and per result the
diff against its baseline — fused-op counts, the op histogram, per-kernel times — with the near misses
of every rule whose fused op dropped, which say in words why it no longer fires; and the worst numeric
check's per-node error table, where a fused graph first left its unfused one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from optimizer.levels import rule_dependencies
from service.adapters.engines.compare import describe_row
from service.domain import verdict_words
from service.domain.fusion_changes import count_changes, rule_for_op, separate_absorbed, taken_up_by
from service.domain.kernel_changes import kernel_changes
from service.models import Alert, Commit, Model, Project, Result, Run
from service.queries.overview import level_order, percent_change
from service.queries.timing_words import timing_alert_states
from service.usecases.baselines import find_baseline
from service.usecases.commits import get_commit
from service.usecases.near_miss_order import readable
from service.usecases.runs import RunStatus, run_status

KERNEL_CHANGES = 8  # the largest per-kernel time changes shown per result


@dataclass
class Change:
    name: str
    before: float | None
    after: float | None

    @property
    def delta(self) -> float:
        return (self.after or 0) - (self.before or 0)

    @property
    def change_pct(self) -> float | None:
        return percent_change(self.before, self.after)


@dataclass
class ResultDiff:
    model: str
    engine: str
    engine_version: str
    level: str
    machine_class: str
    baseline_commit: str | None
    median: Change
    p10_ms: float | None
    p90_ms: float | None
    fusions: list[Change]  # every fused op either side has
    ops: list[Change]  # ops whose count moved
    kernels: list[Change]  # largest absolute time changes first
    stopped_rules: list[str]  # rules whose fused op dropped, nothing taking it up
    near_misses: list[dict[str, Any]] = field(default_factory=list)  # those rules' and their producers' near misses
    near_miss_lines: list[str] = field(default_factory=list)  # the same as a person reads them (near_miss_order.py)
    depends_on: list[str] = field(default_factory=list)  # the rules that produce the stopped rules' anchors
    stopped_entirely: bool = False  # every dropped fused op fell to zero: the rules stopped firing
    # Drops no fusion was lost by, each with what took it up ("BiasGelu 4 → 0: taken up by FastGelu 0 → 4").
    absorbed_lines: list[str] = field(default_factory=list)
    kernels_side_by_side: bool = False  # profiled on both files alternately in the paired job, not two jobs
    # Our engine's kernel library per family, this result's and the baseline's ({} where not recorded).
    libraries: dict[str, str] = field(default_factory=dict)
    baseline_libraries: dict[str, str] = field(default_factory=dict)
    # The timing decision in words, with its statistic (service/domain/verdict_words.py); None: none made.
    timing: dict[str, Any] | None = None

    @property
    def libraries_changed(self) -> bool:
        return bool(self.libraries and self.baseline_libraries and self.libraries != self.baseline_libraries)


    @property
    def fusions_changed(self) -> bool:
        return any(c.before != c.after for c in self.fusions)


@dataclass
class NumericTable:
    """The worst numeric check at the commit: where it first diverged and the per-node rows."""

    model: str
    engine: str
    level: str
    feed_set: str
    status: str
    reason: str | None
    first: str | None  # the sentence an alert would say (service/adapters/engines/compare.py describe_row)
    tensors: int
    diverging: int
    rows: list[dict[str, Any]]
    checks: list[dict[str, Any]]  # per feed set: what it fed and what it found


@dataclass
class CommitReport:
    project: str
    sha: str
    branch: str
    message: str
    author: str
    timestamp: Any
    parents: list[str]
    runs: list[RunStatus]
    diffs: list[ResultDiff]
    alerts: list[Alert]
    numerics: NumericTable | None = None


def commit_report(session: Session, project: Project, sha: str) -> CommitReport:
    commit = get_commit(session, project, sha)
    run_ids = session.scalars(select(Run.id).where(Run.commit_id == commit.id).order_by(Run.id)).all()
    results = session.execute(
        select(Result, Model.name).join(Model, Model.id == Result.model_id)
        .where(Result.commit_id == commit.id).order_by(Result.id)
    ).all()
    latest = {result.fingerprint: (result, name) for result, name in results}  # a re-measurement wins
    baselines = [find_baseline(session, result) for result, _ in latest.values()]
    states = timing_alert_states(session, commit.id)
    diffs = [_diff(session, result, name, baseline, states.get((result.model_id, result.engine, result.level)))
             for (result, name), baseline in zip(latest.values(), baselines, strict=True)]
    diffs.sort(key=lambda d: (d.model, d.engine, level_order(d.level), d.machine_class))
    alerts = list(session.scalars(select(Alert).where(Alert.commit_id == commit.id).order_by(Alert.id)))
    return CommitReport(
        project=project.name, sha=commit.sha, branch=commit.branch, message=commit.message, author=commit.author,
        timestamp=commit.timestamp or commit.created_at, parents=list(commit.parents or []),
        runs=[run_status(session, run_id) for run_id in run_ids], diffs=diffs, alerts=alerts,
        numerics=_worst_numerics(list(latest.values())),
    )


def _worst_numerics(results: list[tuple[Result, str]]) -> NumericTable | None:
    """A mismatching result before a matching one, then the most diverging tensors, then the largest
    output error; None when no result at the commit has a mark-all comparison."""
    checked = [(r, name) for r, name in results if r.divergence]

    def badness(item: tuple[Result, str]) -> tuple:
        result, _ = item
        error = result.max_abs_error if result.max_abs_error is not None else 0.0
        return (result.numeric_ok is False, result.divergence.get("diverging", 0), error)

    if not checked:
        return None
    result, name = max(checked, key=badness)
    worst = result.divergence
    first = worst.get("first")
    return NumericTable(
        model=name, engine=result.engine, level=result.level, feed_set=worst.get("feed_set", ""),
        status=worst.get("status", ""), reason=worst.get("reason"),
        first=describe_row(first) if first else None, tensors=worst.get("tensors", 0),
        diverging=worst.get("diverging", 0), rows=list(worst.get("rows", [])), checks=list(result.numeric_checks or []),
    )  # fmt: skip


def _diff(session: Session, result: Result, model_name: str, baseline: Result | None,
          timing_alert_state: str | None = None) -> ResultDiff:
    before_fusions = baseline.fusions if baseline else {}
    fusions = _counts(before_fusions, result.fusions)
    ops = [c for c in _counts(baseline.ops_after if baseline else {}, result.ops_after) if c.before != c.after]
    dropped, absorbed_lines = _lost(baseline, result)
    side_by_side = (result.paired or {}).get("kernels")
    stopped = list(dict.fromkeys(rule_for_op().get(op, op) for op in dropped))
    depends_on = [dep for rule in stopped for dep in rule_dependencies(rule) if dep not in stopped]
    asked = [*stopped, *dict.fromkeys(depends_on)]
    misses = [m for m in result.near_misses if m.get("rule") in asked]
    return ResultDiff(
        model=model_name,
        engine=result.engine,
        engine_version=result.engine_version,
        level=result.level,
        machine_class=result.machine_class,
        baseline_commit=session.get(Commit, baseline.commit_id).sha if baseline else None,
        median=Change("median", baseline.median_ms if baseline else None, result.median_ms),
        p10_ms=result.p10_ms,
        p90_ms=result.p90_ms,
        fusions=fusions,
        ops=ops,
        kernels=(_kernel_changes(side_by_side["baseline"], side_by_side["candidate"]) if side_by_side else
                 _kernel_changes(baseline.top_kernels if baseline else [], result.top_kernels)),
        kernels_side_by_side=bool(side_by_side),
        stopped_rules=stopped,
        near_misses=misses,
        near_miss_lines=readable(misses, asked),
        depends_on=list(dict.fromkeys(depends_on)),
        stopped_entirely=bool(dropped) and all(not c.after for c in fusions if c.name in dropped),
        absorbed_lines=absorbed_lines,
        libraries=dict(result.kernel_libraries or {}),
        baseline_libraries=dict(baseline.kernel_libraries or {}) if baseline else {},
        timing=verdict_words.shown(result.timing_verdict, timing_alert_state),
    )


def _lost(baseline: Result | None, result: Result) -> tuple[list[str], list[str]]:
    """(the fused ops whose drop lost a fusion, a line for each drop that did not), as the fusion alerts
    judge them (service/domain/fusion_changes.py): a drop taken up by a larger fusion or the same nodes'
    other form is no loss, and at level disabled no rule ran, so no count there is a fusion's."""
    if baseline is None or result.level == "disabled":
        return [], []
    drops, rises = count_changes(baseline.fusions, result.fusions)
    lost, absorbed = separate_absorbed(drops, rises, ops_before=baseline.ops_after or None,
                                       ops_after=result.ops_after or None)

    def short(change) -> str:
        return f"{change['op'].rsplit('.', 1)[-1]} {change['before']} → {change['after']}"

    lines = []
    for drop in absorbed:
        by = taken_up_by(drop, rises)
        lines.append(f"{short(drop)}: taken up by {', '.join(short(c) for c in by)}" if by else
                     f"{short(drop)}: made up for by fused ops an earlier regression lost, restored here")
    return [c["op"] for c in lost], lines


def _counts(before: dict[str, int], after: dict[str, int]) -> list[Change]:
    return [Change(op, before.get(op, 0), after.get(op, 0)) for op in sorted(set(before) | set(after))]


def _kernel_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[Change]:
    return [Change(c.op, c.before, c.after) for c in kernel_changes(before, after, KERNEL_CHANGES)]
