"""How fast the dashboard's pages are on a long history: one model measured at every one of N commits
(default 10,000) by two engines at two levels — four series of N points — with a fused-op drop, a
timing step and their alerts, written straight into a migrated SQLite (or FUSIONWATCH_DATABASE_URL)
database in bulk. Each page is then fetched in-process (routing, use cases, queries and templates; no
network), `--repeat` times, and the median and worst wall times and the page's size are printed.

    python -m bench.dashboard [--commits 10000] [--repeat 5]

Writes bench/results/dashboard.json with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import insert, select

from bench.__main__ import cpu_name
from bench.tokens import bench_token
from service.adapters import migrate
from service.adapters.db import make_engine, make_session_factory
from service.app import create_app
from service.core.config import Settings
from service.models import Alert, Commit, Model, Project, Result, ResultFusion, Run

SERIES = [("fusionwatch", "disabled"), ("fusionwatch", "extended"), ("onnxruntime", "disabled"), ("onnxruntime", "extended")]
FUSIONS = {"com.microsoft.Attention": 2, "com.microsoft.BiasGelu": 2, "com.microsoft.SkipLayerNormalization": 4}


def populate(url: str, commits: int) -> dict[str, str]:
    """The history, inserted in bulk; returns the shas the pages are fetched at."""
    rng = random.Random(7)
    drop, step = commits * 2 // 3, commits // 3
    start = datetime(2025, 1, 1, tzinfo=UTC)
    sessions = make_session_factory(make_engine(url))
    with sessions() as session, session.begin():
        project = Project(name="long", settings={})
        session.add(project)
        session.flush()
        model = Model(project_id=project.id, name="bert.onnx")
        session.add(model)
        session.flush()
        shas = [hashlib.sha1(str(i).encode()).hexdigest() for i in range(commits)]
        session.execute(insert(Commit), [
            {"project_id": project.id, "sha": sha, "branch": "main", "parents": [shas[i - 1]] if i else [],
             "message": f"commit {i}: change the exporter", "author": "", "seq": i + 1,
             "timestamp": start + timedelta(minutes=30 * i)} for i, sha in enumerate(shas)
        ])
        commit_ids = {sha: cid for sha, cid in session.execute(select(Commit.sha, Commit.id))}
        session.execute(insert(Run), [
            {"project_id": project.id, "commit_id": commit_ids[sha], "trigger": "results", "state": "done"}
            for sha in shas
        ])
        run_ids = {cid: rid for cid, rid in session.execute(select(Run.commit_id, Run.id))}
        rows = []
        for i, sha in enumerate(shas):
            for engine, level in SERIES:
                median = (1.0 if level == "disabled" else 0.6) * (1.3 if engine == "fusionwatch" and i >= step else 1.0)
                fusions = dict(FUSIONS) if level == "extended" else {}
                if engine == "onnxruntime" and level == "extended" and i >= drop:
                    fusions.pop("com.microsoft.BiasGelu")
                samples = [median * (1 + rng.gauss(0, 0.02)) for _ in range(30)]
                ordered = sorted(samples)
                rows.append({
                    "run_id": run_ids[commit_ids[sha]], "project_id": project.id, "commit_id": commit_ids[sha],
                    "model_id": model.id, "engine": engine, "engine_version": "1.0", "level": level,
                    "machine_class": "cpu", "threads": 1, "inputs": {}, "fingerprint": f"{engine}-{level}",
                    "ops_after": {"MatMul": 6, **fusions}, "fusions": fusions, "rules": {}, "near_misses": [],
                    "execute_ms": samples, "model_run_ms": [], "median_ms": statistics.median(samples),
                    "p10_ms": ordered[3], "p90_ms": ordered[26], "mad_ms": 0.01,
                    "top_kernels": [{"op": "MatMul", "ms": median / 2}, {"op": "Attention", "ms": median / 5}],
                })
        session.execute(insert(Result), rows)
        results = session.execute(select(Result.id, Result.fusions)).all()
        session.execute(insert(ResultFusion), [
            {"result_id": rid, "op": op, "count": n} for rid, fusions in results for op, n in fusions.items()
        ])
        for i, (kind, engine, level) in ((drop, ("fusion-regression", "onnxruntime", "extended")),
                                         (step, ("timing-regression", "fusionwatch", "extended"))):
            session.add(Alert(project_id=project.id, run_id=run_ids[commit_ids[shas[i]]], kind=kind, model_id=model.id,
                              engine=engine, level=level, commit_id=commit_ids[shas[i]],
                              baseline_commit_id=commit_ids[shas[i - 1]], message=f"{kind} at commit {i}"))
    return {"drop": shas[drop], "head": shas[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{Path(scratch) / 'bench.db'}"
        migrate.upgrade(url)
        began = time.perf_counter()
        shas = populate(url, args.commits)
        print(f"{args.commits} commits × {len(SERIES)} series inserted in {time.perf_counter() - began:.1f} s")
        pages = {
            "overview": "/",
            "project": "/projects/long",
            "model (charts, newest page)": "/projects/long/models/bert.onnx",
            "model (page 100 of the table)": "/projects/long/models/bert.onnx?page=100",
            "commit (fusion drop)": f"/projects/long/commits/{shas['drop']}",
            "commit (head)": f"/projects/long/commits/{shas['head']}",
            "alerts": "/alerts",
        }
        timings = {}
        with TestClient(create_app(url, Settings(data_dir=Path(scratch) / "data"))) as client:
            client.headers["Authorization"] = f"Bearer {bench_token(url, 'bench-reader', 'read')}"  # as a signed-in reader sees them
            for name, path in pages.items():
                seconds, size = [], 0
                for _ in range(args.repeat):
                    began = time.perf_counter()
                    reply = client.get(path)
                    seconds.append(time.perf_counter() - began)
                    reply.raise_for_status()
                    size = len(reply.content)
                timings[name] = {"path": path, "median_ms": statistics.median(seconds) * 1000,
                                 "max_ms": max(seconds) * 1000, "bytes": size}
                print(f"{name:32} median {timings[name]['median_ms']:7.1f} ms  max {timings[name]['max_ms']:7.1f} ms"
                      f"  {size / 1024:7.0f} KiB")
    out = Path(__file__).parent / "results" / "dashboard.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"commits": args.commits, "series": len(SERIES), "cpu": cpu_name(),
                               "python": platform.python_version(), "pages": timings}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
