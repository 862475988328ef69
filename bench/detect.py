"""`make bench-detect`: precision, recall and detection delay of fusionwatch's alerts on planted regressions.

Series are simulated from timings really measured on this machine (`bench/data/detect_noise.npz`,
written by `bench/detect_measure.py`): each simulated commit takes one measured job (drawn at random:
the measured jobs were 2 s apart, a project's commits are minutes or hours apart; then a bootstrap of
that job's 30 samples) with its canary. Planted into each series, at known commits: one timing step
(every sample × (1 + step), from that commit on; steps of 2–30%) and, elsewhere, one fusion drop
(BiasGelu 2 → 0 with a new graph hash, timings untouched).

Half the projects are "engine" projects (a new engine version at every commit: code always changed),
half "model" projects (one engine version; the graph hash changes at a fifth of the commits, and at
every planted step and drop). Every commit's results go in one document through POST /api/v1/results
of the real app, in process, on SQLite in a temporary directory: the service's own code path.

A timing alert counts when confirmed (only those are delivered). It is a true positive when raised at
the step's commit or one of the ten after it; "within 2" means confirmed by the second commit after
the step. Everything else confirmed is a false alarm, counted per 1,000 series-commits.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import migrate
from service.app import create_app
from service.core.config import Settings
from service.db import make_engine, make_session_factory
from service.models import Alert, Commit, Model, Result
from service.protocol import Protocol

DATA = Path(__file__).resolve().parent / "data" / "detect_noise.npz"
STEPS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.30)
FUSIONS = {"com.microsoft.BiasGelu": 2, "com.microsoft.SkipLayerNormalization": 4}
DROPPED = {"com.microsoft.SkipLayerNormalization": 4}
MATCH_AFTER = 10  # a confirmed alert this many commits after a step still belongs to it


def simulate(rng: np.random.Generator, measured: np.ndarray, canary: np.ndarray, commits: int, block: int = 1):
    """(samples [commits, runs], canary [commits]) for one series, from one measured series."""
    jobs = measured.shape[0]
    picks: list[int] = []
    while len(picks) < commits:
        start = int(rng.integers(jobs))
        picks.extend((start + k) % jobs for k in range(block))
    picks = picks[:commits]
    runs = measured.shape[1]
    inner = rng.integers(runs, size=(commits, runs))
    return measured[picks][np.arange(commits)[:, None], inner].astype(np.float64), canary[picks].astype(np.float64)


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
    started = time.perf_counter()
    with TestClient(create_app(url, Settings(data_dir=tmp / "data"))) as client:
        for p in range(args.projects):
            project = f"p{p}"
            kind = "engine" if p % 2 == 0 else "model"
            settings = {"timing_threshold_pct": args.threshold_pct}
            client.post("/api/v1/projects", json={"name": project, "settings": settings}).raise_for_status()
            plans = plan(rng, p * args.series, args.series, args.commits, measured.shape[0])
            # Every (measured series, step) pair equally often: series g takes source g mod 6, step (g // 6) mod 8.
            first = p * args.series
            source = [(first + s) % measured.shape[0] for s in range(args.series)]
            sims = [simulate(rng, measured[i], canaries[i], args.commits) for i in source]
            graph_changes = rng.random((args.series, args.commits)) < 0.2
            for s, planned in enumerate(plans):
                truth[(project, f"m{s:02d}")] = {**planned, "kind": kind, "source": source[s]}
            for c in range(args.commits):
                results = []
                for s, planned in enumerate(plans):
                    samples, canary = sims[s]
                    factor = 1 + planned["step"] if c >= planned["step_at"] else 1.0
                    dropped = c >= planned["drop_at"]
                    if kind == "engine":
                        version, graph = f"1.{c}", "g-dropped" if dropped else "g"
                    else:
                        marks = graph_changes[s, : c + 1].copy()
                        marks[[m for m in (planned["step_at"], planned["drop_at"]) if m <= c]] = True
                        version, graph = "1.0", f"g{int(marks.sum())}"
                    results.append({
                        "model": f"m{s:02d}", "engine": "fusionwatch", "engine_version": version, "level": "all",
                        "fusions": DROPPED if dropped else FUSIONS, "graph_hash": graph, "threads": 1,
                        "execute_ms": [round(v * factor, 4) for v in samples[c]],
                        "canary_ms": round(float(canary[c]), 4),
                    })
                parents = [f"c{c - 1}"] if c else []
                reply = client.post("/api/v1/results", json={
                    "project": project, "commit": {"sha": f"c{c}", "parents": parents},
                    "machine": {"machine_class": "cpu", "cpu": meta["cpu"], "cores": meta["cores"]},
                    "results": results,
                })
                reply.raise_for_status()
            print(f"project {project} ({kind}): {args.series} series × {args.commits} commits, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            return score(session, truth, args, meta)
    finally:
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)  # in /dev/shm: memory, not disk


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
    total_alerts = true_alerts + false_alarms
    report = {
        "cpu": meta["cpu"], "cores": meta["cores"], "series": len(truth), "commits": args.commits,
        "threshold_pct": args.threshold_pct,
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
        },
    }
    return report


def print_report(report: dict) -> None:  # noqa: C901 (one table after another)
    print(f"\nfusionwatch detection benchmark: {report['series']} series × {report['commits']} commits, "
          f"noise measured on {report['cpu']} ({report['cores']} cores, shared), threshold {report['threshold_pct']:g}%")
    f = report["fusion"]
    print(f"fusion drops: {f['drops']}, recall at the exact commit {f['recall_exact']:.1%}, false alarms {f['false_alarms']}")
    t = report["timing"]
    print(f"timing: {t['confirmed_alerts']} confirmed alerts, precision {t['precision']:.3f}, "
          f"false alarms {t['false_alarms']} = {t['false_per_1000_series_commits']:.2f} per 1,000 series-commits "
          f"(by project kind {t['false_by_project_kind']}); {t['suspected_never_confirmed']} suspected never confirmed "
          "(not delivered)")
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


def main() -> None:
    parser = argparse.ArgumentParser(description="precision, recall and delay of alerts on planted regressions")
    parser.add_argument("--projects", type=int, default=8)
    parser.add_argument("--series", type=int, default=30, help="models per project")
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--threshold-pct", type=float, default=Protocol().timing_threshold_pct)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    report = run(args)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
