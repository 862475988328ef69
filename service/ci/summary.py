"""A run's verdict as a forge shows it: a conclusion, a one-line title, and a markdown summary with the
fused ops each model × engine × level lost or gained against its baseline (with the cause the alert gives),
the timings against theirs with the job's own spread, the jobs that failed, and links to the commit.

Built from what the server answers (`GET /runs/{id}` and `GET /commits/{sha}/diff`), so the check run,
the commit status, the pull-request comment and the GitLab note all say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.domain.op_names import short_names
from service.domain.verdict_words import signed_pct
from service.domain.vocabulary import NOT_FINDINGS, AlertKind

CONCLUSIONS = {"ok": "success", "regression": "failure", "failed": "neutral", "running": "neutral"}
MAX_SUMMARY_CHARS = 60_000  # GitHub's check-run summary and comment bodies take 65,535
CAUSE_MISSES = 2  # near misses quoted as a drop's cause when the alert gives no cause of its own


@dataclass(frozen=True)
class Links:
    commit: str  # the forge's commit page
    dashboard: str  # fusionwatch's commit page
    run: str


@dataclass(frozen=True)
class CountChange:
    model: str
    engine: str
    level: str
    op: str
    before: int
    after: int
    cause: str


@dataclass(frozen=True)
class Summary:
    conclusion: str  # success, failure, neutral
    title: str
    markdown: str
    changed: bool  # a fused count moved, a regression was found or a job failed: worth a comment

    @property
    def description(self) -> str:
        """One line for a commit status (GitHub keeps 140 characters)."""
        return self.title[:140]


def summarize(project: str, run: dict[str, Any], diff: dict[str, Any], links: Links,
              timings_pending: bool = False) -> Summary:
    causes = _causes(run["alerts"])
    lost, gained = count_changes(diff, causes)
    lost += _pending_drops(run)
    failed = [job for job in run["jobs"] if job["state"] == "failed"]
    timing_alerts = [a for a in run["alerts"] if a["kind"] == AlertKind.TIMING_REGRESSION and a["state"] not in NOT_FINDINGS]
    verdict = run["verdict"]
    conclusion = CONCLUSIONS.get(verdict, "neutral")
    title = _title(verdict, lost, gained, timing_alerts, failed, len(run["jobs"]), timings_pending)
    lines = [f"### fusionwatch · {project} · {verdict}", "",
             f"Commit `{diff['commit'][:12]}` on `{diff['branch']}`, each result against its baseline. {title}.", ""]
    names = short_names([c.op for c in (*lost, *gained)])
    if lost:
        lines += ["**Fused ops lost**", "", "| model | engine | level | fused op | before → after | cause |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {_cell(c.model)} | {c.engine} | {c.level} | {_cell(names[c.op])} | {c.before} → {c.after} | "
                  f"{_cell(c.cause)} |" for c in lost]
        lines.append("")
    if gained:
        lines += ["**Fused ops gained**", "", "| model | engine | level | fused op | before → after |",
                  "|---|---|---|---|---|"]
        lines += [f"| {_cell(c.model)} | {c.engine} | {c.level} | {_cell(names[c.op])} | {c.before} → {c.after} |"
                  for c in gained]
        lines.append("")
    if not lost and not gained:
        lines += ["Fused-op counts: unchanged for every model, engine and level." if _has_baseline(diff)
                  else "Fused-op counts: no baseline yet (the first measurement of these series).", ""]
    lines += _timings(diff, run["alerts"], timings_pending)
    if failed:
        lines += ["**Jobs that failed**", ""]
        lines += [f"- {_cell(job['model'])}, {job['engine']}, {job['level']}: {_cell(str(job['error'])[:300])}"
                  for job in failed]
        lines.append("")
    lines.append(f"[commit]({links.commit}) · [fusionwatch commit page]({links.dashboard}) · [run]({links.run})")
    markdown = "\n".join(lines)
    if len(markdown) > MAX_SUMMARY_CHARS:
        markdown = markdown[:MAX_SUMMARY_CHARS] + f"\n\n… cut at {MAX_SUMMARY_CHARS} characters; see [the commit page]({links.dashboard})"
    changed = bool(lost or gained or failed or verdict == "regression")
    return Summary(conclusion, title, markdown, changed)


def count_changes(diff: dict[str, Any], causes: dict[tuple, str]) -> tuple[list[CountChange], list[CountChange]]:
    lost, gained = [], []
    for entry in diff["models"]:
        if entry["baseline_commit"] is None:
            continue
        key = (entry["model"], entry["engine"], entry["level"])
        for op, count in entry["fusions"].items():
            change = CountChange(*key, op, count["before"], count["after"], causes.get((*key, op), ""))
            if count["after"] < count["before"]:
                lost.append(change)
            elif count["after"] > count["before"]:
                gained.append(change)
    return lost, gained


def _pending_drops(run: dict[str, Any]) -> list[CountChange]:
    """Drops the counts taken before timing found (service/usecases/fusion_verdict.py) for jobs whose
    results, and so their alerts and the diff's rows, are not in yet."""
    return [CountChange(e["model"], e["engine"], e["level"], e["op"], e["before"], e["after"],
                        f"{e['rule'] or e['op']} {'fired less' if e['after'] else 'stopped firing'}; its cause is "
                        "explained when this job's result is in")
            for e in (run.get("fusions") or {}).get("lost", []) if e.get("pending")]


def _causes(alerts: list[dict[str, Any]]) -> dict[tuple, str]:
    """Per (model, engine, level, op), why it dropped: the alert's own cause where it carries one, else the
    near misses of the rule that makes the op (what the alert message quotes)."""
    causes: dict[tuple, str] = {}
    for alert in alerts:
        if alert["kind"] != AlertKind.FUSION_REGRESSION:
            continue
        for change in alert.get("changes") or []:
            cause = alert.get("cause_text")  # the server's own explanation, where it gives one
            if not cause:
                misses = [m for m in alert.get("near_misses") or [] if m.get("rule") == change.get("rule")]
                cause = "; ".join(f"{m.get('rule')}: {m.get('reason')}" for m in misses[:CAUSE_MISSES])
            # A fusion-regression's changes are its engines' and levels' entries for the one op it names.
            op = change.get("op") or alert["op"]
            rule = change.get("rule") or alert.get("rule") or op
            what = "stopped firing" if not change.get("after") else "fired less"
            # An alert may gather several engines' or levels' drops, each change naming its own.
            key = (alert["model"], change.get("engine", alert["engine"]), change.get("level", alert["level"]), op)
            causes[key] = (
                f"{rule} {what}: {cause}" if cause else f"{rule} {what}; no near misses reported")
    return causes


def _timings(diff: dict[str, Any], alerts: list[dict[str, Any]], pending: bool) -> list[str]:
    if pending:
        return ["**Timings**: still being measured; this check is updated when they are.", ""]
    flagged = {(a["model"], a["engine"], a["level"]): a for a in alerts if a["kind"] == AlertKind.TIMING_REGRESSION}
    rows, paired = [], False
    for entry in diff["models"]:
        timing, decided = entry["median_ms"], entry.get("timing") or {}
        if timing.get("after") is None:
            continue
        alert = flagged.get((entry["model"], entry["engine"], entry["level"]))
        if alert is not None:
            verdict = {"suspected": "suspected (re-measuring; not a finding)",
                       "info": "slower at level disabled (information)"}.get(alert["state"], "regression")
        else:
            verdict = "no timing alert" if timing.get("before") is not None else "first measurement"
        band = (f"{timing['p10']:.3f}–{timing['p90']:.3f}" if timing.get("p10") is not None
                and timing.get("p90") is not None else "-")
        before = "-" if timing.get("before") is None else f"{timing['before']:.3f}"
        after, change = f"{timing['after']:.3f}", signed_pct(timing.get("change_pct"))
        if decided.get("basis") == "paired":
            # The two jobs' medians ran at other moments of a shared machine; what was decided on is
            # the two models timed alternately in one job, so that change is the one shown.
            paired, before, after = True, f"{before}*", f"{after}*"
            change = f"{signed_pct(decided.get('change_pct'))} (paired)"
            verdict = f"{verdict}: {decided.get('statistic') or decided.get('word', '')}"
        rows.append(f"| {_cell(entry['model'])} | {entry['engine']} | {entry['level']} | {before} | "
                    f"{after} | {change} | {band} | {_cell(verdict)} |")
    if not rows:
        return []
    footnote = (["\\* each job's own median, measured at other moments: context only; the change beside it is the "
                 "paired one, from both models timed alternately in one job", ""] if paired else [])
    return ["**Timings** (median Execute ms; noise band: the 10th–90th percentile of this job's runs; the server "
            "decides against the series' own job-to-job noise)", "",
            "| model | engine | level | baseline | this commit | change | noise band | verdict |",
            "|---|---|---|---|---|---|---|---|", *rows, "", *footnote]



def _title(verdict: str, lost: list, gained: list, timing_alerts: list, failed: list, jobs: int,
           timings_pending: bool) -> str:
    parts = []
    if lost:
        ops = sorted(set(short_names([c.op for c in lost]).values()))
        parts.append(f"lost fused ops: {', '.join(ops[:4])}{' …' if len(ops) > 4 else ''}")
    if gained:
        parts.append(f"{len(gained)} fused-op count(s) rose")
    if timing_alerts:
        parts.append(f"{len(timing_alerts)} timing regression(s)")
    if failed:
        parts.append(f"{len(failed)} of {jobs} job(s) failed")
    if not parts:
        parts.append("fused-op counts as before" if verdict != "running" else "measuring")
    if timings_pending:
        parts.append("timings pending")
    return "; ".join(parts)


def _has_baseline(diff: dict[str, Any]) -> bool:
    return any(entry["baseline_commit"] is not None for entry in diff["models"])


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell: no pipe ends the cell, no newline ends the row."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")
