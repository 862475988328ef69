"""`make bench-detect`: precision, recall and detection delay of fusionwatch's alerts on planted regressions.

Series are simulated from timings really measured on this machine (`bench/data/detect_noise.npz`,
written by `bench/detect_measure.py`): each simulated result is one measured job drawn at random
(`Series.result`: its samples bootstrapped, with its canary). Planted into each series, at known
commits: one timing step (every sample × (1 + step), from that commit on; steps of 2–30%) and,
elsewhere, one fusion drop (BiasGelu 2 → 0 with a new graph hash, timings untouched).

Half the projects are "engine" projects (a new engine version at every commit: code always changed),
half "model" projects (one engine version; the graph hash changes at a fifth of the commits, and at
every planted step and drop). Every commit's results go in one document through POST /api/v1/results
of the real app, in process, on SQLite in a temporary directory: the service's own code path. A
result the reply marks as a suspected timing regression is re-measured (another job drawn for that
series, posted for the same commit), as the service queues one for its own jobs.

A timing alert counts when confirmed (only those are delivered). It is a true positive when raised at
the step's commit or one of the ten after it; "within 2" means confirmed by the second commit after
the step. Everything else confirmed is a false alarm, counted per 1,000 series-commits.

Without `--data` (`make bench-detect`) it does this for every noise capture listed in
`bench/detect_captures.py`, each on its own at 48 series × 100 commits (every noise source × step
once), replays each capture's paired null pairs through `bench.detect_paired`, and prints one table:
a row per capture, the captures not held out pooled, and the held-out capture's row last. It tunes
nothing: the rules are the service's, as committed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from bench import detect_captures
from bench.detect_diagnose import diagnose
from bench.tokens import bench_token
from service.adapters import migrate
from service.adapters.db import make_engine, make_session_factory
from service.app import create_app
from service.core.config import Settings
from service.domain.protocol import Protocol
from service.models import Alert, Commit, Model, Result

DATA = Path(__file__).resolve().parent / "data" / "detect_noise.npz"
STEPS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.30)
FUSIONS = {"com.microsoft.BiasGelu": 2, "com.microsoft.SkipLayerNormalization": 4}
DROPPED = {"com.microsoft.SkipLayerNormalization": 4}
MATCH_AFTER = 10  # a confirmed alert this many commits after a step still belongs to it


@dataclass
class Series:
    """One simulated series: its planted changes and the measured jobs its noise is drawn from. The
    measured jobs were 2–3 s apart; a project's commits (and a re-measurement, queued behind the rest
    of a CI round) are minutes apart, so each result is a job drawn at random: one measured job's
    samples, bootstrapped, with its canary."""

    model: str
    kind: str  # "engine": a new engine version every commit; "model": graph hash changes at marked commits
    step: float
    step_at: int
    drop_at: int
    graph_changes: np.ndarray  # bool [commits]: the graph hash changes here (model projects)
    measured: np.ndarray  # [jobs, runs]
    canary: np.ndarray  # [jobs]
    rng: np.random.Generator
    drawn: dict[int, list[int]] = field(default_factory=dict)  # the jobs each commit's results were drawn from

    def result(self, c: int) -> dict:
        """This series' result at commit c: a freshly drawn job with the planted changes applied. A
        re-measurement of the commit is another recorded job than its earlier results': the same one
        again would be one slow moment counted twice (a capture of 70 jobs gives that 1 time in 70, as
        often as a machine's slow mode itself)."""
        taken = self.drawn.setdefault(c, [])
        free = [j for j in range(self.measured.shape[0]) if j not in taken]
        job = free[int(self.rng.integers(len(free)))]
        taken.append(job)
        runs = self.measured.shape[1]
        samples = self.measured[job, self.rng.integers(runs, size=runs)].astype(np.float64)
        factor = 1 + self.step if c >= self.step_at else 1.0
        dropped = c >= self.drop_at
        # Graph hashes are what the optimizer prints (hex digits); POST /results takes letters and digits.
        if self.kind == "engine":
            version, graph = f"1.{c}", "gdropped" if dropped else "g"
        else:
            marks = self.graph_changes[: c + 1].copy()
            marks[[m for m in (self.step_at, self.drop_at) if m <= c]] = True
            version, graph = "1.0", f"g{int(marks.sum())}"
        return {
            "model": self.model, "engine": "fusionwatch", "engine_version": version, "level": "all",
            "fusions": DROPPED if dropped else FUSIONS, "graph_hash": graph, "threads": 1,
            "execute_ms": [round(v * factor, 4) for v in samples], "canary_ms": round(float(self.canary[job]), 4),
        }


def plan(rng: np.random.Generator, first: int, series: int, commits: int, sources: int) -> list[dict]:
    plans = []
    for s in range(series):
        step_at = int(rng.integers(20, commits - 12))
        drop_at = int(rng.integers(10, commits - 5))
        while abs(drop_at - step_at) < 12:
            drop_at = int(rng.integers(10, commits - 5))
        plans.append({"step": STEPS[((first + s) // sources) % len(STEPS)], "step_at": step_at, "drop_at": drop_at})
    return plans


def run(args) -> dict:
    data = np.load(args.data)
    measured, canaries = data["execute_ms"], data["canary_ms"]
    meta = json.loads(str(data["meta"]))
    rng = np.random.default_rng(args.seed)
    shm = Path("/dev/shm")  # SQLite's fsyncs dominate on disk; in memory the service's code is what is timed
    tmp = Path(tempfile.mkdtemp(prefix="bench-detect-", dir=shm if shm.is_dir() else None))
    url = f"sqlite:///{tmp / 'fusionwatch.db'}"
    migrate.upgrade(url)
    truth: dict[tuple[str, str], dict] = {}
    remeasured = 0
    started = time.perf_counter()
    with TestClient(create_app(url, Settings(data_dir=tmp / "data"))) as client:
        client.headers["Authorization"] = f"Bearer {bench_token(url, 'bench-detect', 'write')}"  # as CI posts
        for p in range(args.projects):
            project = f"p{p}"
            kind = "engine" if p % 2 == 0 else "model"
            settings = {"timing_threshold_pct": args.threshold_pct}
            client.post("/api/v1/projects", json={"name": project, "settings": settings}).raise_for_status()
            plans = plan(rng, p * args.series, args.series, args.commits, measured.shape[0])
            # Every (measured series, step) pair equally often: series g takes source g mod 6, step (g // 6) mod 8.
            first = p * args.series
            graph_changes = rng.random((args.series, args.commits)) < 0.2
            series = {}
            for s, planned in enumerate(plans):
                source = (first + s) % measured.shape[0]
                series[f"m{s:02d}"] = Series(f"m{s:02d}", kind, **planned, graph_changes=graph_changes[s],
                                             measured=measured[source], canary=canaries[source], rng=rng)
                truth[(project, f"m{s:02d}")] = {**planned, "kind": kind, "source": source}
            for c in range(args.commits):
                document = {
                    "project": project, "commit": {"sha": f"c{c}", "parents": [f"c{c - 1}"] if c else []},
                    "machine": {"machine_class": "cpu", "cpu": meta["cpu"], "cores": meta["cores"]},
                }
                reply = client.post("/api/v1/results", json={**document, "results": [x.result(c) for x in series.values()]})
                reply.raise_for_status()
                # A suspected timing alert gets its re-measurement, as the service queues one for its own
                # jobs (service/usecases/remeasure.py) and a client re-posts: a new job of that series, this commit.
                # A re-measurement that leaves its alert suspected and asks for one more gets it the same way.
                again = _suspected(reply)
                while again:
                    remeasured += len(again)
                    reply = client.post("/api/v1/results", json={
                        **document, "results": [series[name].result(c) for name in again],
                    })
                    reply.raise_for_status()
                    again = _suspected(reply)
            print(f"project {project} ({kind}): {args.series} series × {args.commits} commits, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            report = {**score(session, truth, args, meta), "remeasured": remeasured}
            if args.diagnose:
                diagnose(session, truth, report, report["timing"]["big_step_misses"])
            return report
    finally:
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)  # in /dev/shm: memory, not disk


def _suspected(reply) -> list[str]:
    """The models whose timing alert the reply left suspected: each is re-measured."""
    return sorted({a["model"] for a in reply.json()["alerts"]
                   if a["kind"] == "timing-regression" and a["state"] == "suspected"})


def score(session, truth: dict, args, meta: dict) -> dict:
    seq = {c.id: (c.project_id, int(c.sha[1:])) for c in session.scalars(select(Commit))}
    names = {m.id: m.name for m in session.scalars(select(Model))}
    projects = {pid: f"p{i}" for i, pid in enumerate(sorted({p for p, _ in seq.values()}))}
    result_commit = dict(session.execute(select(Result.id, Result.commit_id)).all())
    rows = session.scalars(select(Alert).where(Alert.kind.in_(("timing-regression", "fusion-regression"))))
    fusion, timing_alerts = defaultdict(list), defaultdict(list)
    suspected = 0
    for a in rows:
        key = (projects[a.project_id], names[a.model_id])
        at = seq[a.commit_id][1]
        if a.kind == "fusion-regression":
            fusion[key].append(at)
        elif a.state == "suspected":
            suspected += 1
        else:
            timing_alerts[key].append((at, seq[result_commit[a.confirmed_result_id]][1]))
    series_commits = len(truth) * args.commits
    fusion_hits = sum(fusion[k] == [t["drop_at"]] for k, t in truth.items())
    fusion_false = sum(len([a for a in fusion[k] if a != t["drop_at"]]) for k, t in truth.items())
    by_step = defaultdict(lambda: {"n": 0, "within2": 0, "any": 0, "delays": []})
    false_alarms, true_alerts, false_by_kind = 0, 0, defaultdict(int)
    by_source = defaultdict(lambda: {"false": 0, "big": 0, "big_within2": 0})
    big_misses = []
    for k, t in truth.items():
        row = by_step[t["step"]]
        row["n"] += 1
        matched = [(at, conf) for at, conf in timing_alerts[k] if t["step_at"] <= at <= t["step_at"] + MATCH_AFTER]
        false = len(timing_alerts[k]) - len(matched)
        false_alarms += false
        false_by_kind[t["kind"]] += false
        source = by_source[t["source"]]
        source["false"] += false
        source["big"] += t["step"] >= 0.10
        true_alerts += len(matched)
        if matched:
            delay = min(conf for _, conf in matched) - t["step_at"]
            row["any"] += 1
            row["delays"].append(delay)
            row["within2"] += delay <= 2
            source["big_within2"] += delay <= 2 and t["step"] >= 0.10
        if t["step"] >= 0.10 and not (matched and delay <= 2):
            big_misses.append(list(k))
    total_alerts = true_alerts + false_alarms
    report = {
        "cpu": meta["cpu"], "cores": meta["cores"], "series": len(truth), "commits": args.commits,
        "threshold_pct": args.threshold_pct,
        "noise": {k: meta.get(k) for k in ("measured_at", "protocol", "load_1min")},
        "fusion": {"drops": len(truth), "recall_exact": fusion_hits / len(truth), "false_alarms": fusion_false},
        "timing": {
            "confirmed_alerts": total_alerts, "suspected_never_confirmed": suspected,
            "precision": true_alerts / total_alerts if total_alerts else 1.0,
            "false_alarms": false_alarms,
            "false_per_1000_series_commits": false_alarms / series_commits * 1000,
            "false_by_project_kind": dict(false_by_kind),
            "by_step": {f"{int(round(s * 100))}%": {
                "series": r["n"], "recall_within_2": r["within2"] / r["n"], "recall_within_10": r["any"] / r["n"],
                "median_delay": float(np.median(r["delays"])) if r["delays"] else None,
            } for s, r in sorted(by_step.items())},
            "by_measured_series": [{
                **meta["series"][i], "series": sum(t["source"] == i for t in truth.values()),
                "false_alarms": r["false"], "recall_10pct_up_within_2": r["big_within2"] / r["big"] if r["big"] else None,
            } for i, r in sorted(by_source.items())],
            "big_step_misses": big_misses,
        },
    }
    return report


def print_report(report: dict) -> None:  # noqa: C901 (one table after another)
    print(f"\nfusionwatch detection benchmark: {report['series']} series × {report['commits']} commits, "
          f"noise measured on {report['cpu']} ({report['cores']} cores, shared), threshold {report['threshold_pct']:g}%")
    print(f"noise: {report['noise']}")
    f = report["fusion"]
    print(f"fusion drops: {f['drops']}, recall at the exact commit {f['recall_exact']:.1%}, false alarms {f['false_alarms']}")
    t = report["timing"]
    print(f"timing: {t['confirmed_alerts']} confirmed alerts, precision {t['precision']:.3f}, "
          f"false alarms {t['false_alarms']} = {t['false_per_1000_series_commits']:.2f} per 1,000 series-commits "
          f"(by project kind {t['false_by_project_kind']}); {t['suspected_never_confirmed']} suspected never confirmed "
          f"(not delivered); {report['remeasured']} re-measurements")
    print("| step | series | recall ≤ 2 commits | recall ≤ 10 commits | median delay (commits) |")
    print("|---|---|---|---|---|")
    for step, r in t["by_step"].items():
        delay = "-" if r["median_delay"] is None else f"{r['median_delay']:g}"
        print(f"| {step} | {r['series']} | {r['recall_within_2']:.1%} | {r['recall_within_10']:.1%} | {delay} |")
    print("\nby the measured series the noise came from (job-to-job noise differs tenfold):")
    print("| measured series | series | false alarms | recall of steps ≥ 10% within 2 commits |")
    print("|---|---|---|---|")
    for r in t["by_measured_series"]:
        recall = "-" if r["recall_10pct_up_within_2"] is None else f"{r['recall_10pct_up_within_2']:.1%}"
        print(f"| {r['model']} {r['engine']} {r['level']} | {r['series']} | {r['false_alarms']} | {recall} |")


def add_series_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulated series' sizes, seed and noise data: shared with bench.detect_replay, whose
    series must be these exactly."""
    parser.add_argument("--projects", type=int, default=8)
    parser.add_argument("--series", type=int, default=30, help="models per project")
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--threshold-pct", type=float, default=Protocol().timing_threshold_pct)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--data", type=Path, default=DATA)


def main() -> None:
    parser = argparse.ArgumentParser(description="precision, recall and delay of alerts on planted regressions")
    add_series_arguments(parser)
    # Without --data: every capture (bench/detect_captures.py), each through the app at this smaller
    # size (48 series × 100 commits: every noise source × step once; 1.5-2 minutes a capture on 2 busy cores).
    parser.set_defaults(data=None, projects=2, series=24)
    parser.add_argument("--capture", nargs="*", help="labels from bench/detect_captures.py (default: all); "
                        "ignored with --data, which reports one unpaired noise file in full")
    parser.add_argument("--paired-series", type=int, default=320,
                        help="paired replay: series per capture (10 × every source × step)")
    parser.add_argument("--paired-commits", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--diagnose", action="store_true",
                        help="for each step of 10%% or more missed within 2 commits, print its jobs against the bar")
    args = parser.parse_args()
    if args.data is None:
        report = run_captures(args)
    else:
        report = run(args)
        print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def run_captures(args) -> dict:
    """Each capture replayed on its own, unpaired through the app and paired through bench.detect_paired,
    then the table: one row per capture, the non-held-out ones pooled, the held-out row last."""
    from bench import detect_paired  # here: it takes STEPS from this module

    rows, reports, pooled_u, pooled_p = [], {}, [], []
    for capture in detect_captures.named(args.capture):
        unpaired = paired_ = None
        loads = []
        if capture.unpaired:
            args.data = detect_captures.DATA / capture.unpaired
            report = run(argparse.Namespace(**vars(args)))
            unpaired = unpaired_figures(report)
            loads.append(_load(report["noise"]["load_1min"]))
            reports[f"{capture.label} unpaired"] = report
        if capture.paired:
            levels, block_s, meta = detect_paired.load(detect_captures.DATA / capture.paired)
            counts = detect_paired.replay(levels, block_s, args.paired_series, args.paired_commits, args.seed)
            paired_ = detect_paired.summarize(counts)
            loads.append(_load(meta["load_1min"]))
            reports[f"{capture.label} paired"] = {**paired_, "meta": meta, "jobs": int(levels.shape[1])}
            if not capture.held_out:
                pooled_p.append(counts)
        if unpaired and not capture.held_out:
            pooled_u.append(unpaired)
        print(f"{capture.label}: {capture.how}\n    unpaired {unpaired}\n    paired {paired_}", flush=True)
        rows.append((capture, unpaired, paired_, " / ".join(loads)))
    pooled = detect_captures.Capture("pooled (not held out)", None, None, "")
    rows.insert(sum(not c.held_out for c, *_ in rows), (
        pooled, _sum(pooled_u) if pooled_u else None,
        detect_paired.summarize(detect_paired.pool(pooled_p)) if pooled_p else None, ""))
    print(f"\nunpaired: {args.projects * args.series} series × {args.commits} commits a capture through POST /results "
          f"(seed {args.seed}); paired: {args.paired_series} series × {args.paired_commits} commits a capture "
          f"(bench.detect_paired)")
    detect_captures.print_table(rows)
    return {"captures": reports, "table": [[c.label, u, p, load] for c, u, p, load in rows]}


def unpaired_figures(report: dict) -> dict:
    t = report["timing"]
    big = [r for step, r in t["by_step"].items() if int(step.rstrip("%")) >= 10]
    caught = sum(round(r["series"] * r["recall_within_2"]) for r in big)
    return {"false_per_1000": t["false_per_1000_series_commits"], "false_alarms": t["false_alarms"],
            "series_commits": report["series"] * report["commits"], "big_caught": caught,
            "big_steps": sum(r["series"] for r in big)}


def _sum(many: list[dict]) -> dict:
    total = {k: sum(f[k] for f in many) for k in ("false_alarms", "series_commits", "big_caught", "big_steps")}
    return {**total, "false_per_1000": total["false_alarms"] / total["series_commits"] * 1000}


def _load(load: dict | None) -> str:
    return "-" if not load else f"{load['min']:.1f}-{load['max']:.1f}"


if __name__ == "__main__":
    main()
