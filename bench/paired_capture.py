"""Capture the noise the paired path sees: null pairs (baseline and candidate the same file) timed as
`service.adapters.paired_measure.measure_paired` times them, on this machine, now.

Each job opens two sessions of ONE model file with the engine's `open_timer` (same engine, level,
feeds and threads, as a worker pairs a baseline with its candidate), settles both as the worker does
(`paired_measure.settle`: warm-up runs, then runs filling two blocks' time), sizes its blocks
with `paired.runs_per_block`, and times a fixed number of pairs of blocks in `paired.pair_order`
(A B, B A, A B, …), each block's level its fastest run. Nothing changed between A and B, so every
ratio away from 1 is noise: two sessions' memory placement, a slow moment landing on one block, a
clock ramping. Unlike measure_paired, a job does not stop when decided: it records all `--pairs`
pairs, so `bench.detect_paired` can replay the decision pair by pair and plant steps into the
candidate side. After each job: the canary (`service.adapters.canary.time_canary`), as a worker's
job times it. Jobs go round-robin over the series (as bench.detect_measure does), so a slow moment
of the machine lands on every series.

    .venv/bin/python -m bench.paired_capture --seconds 240 --label epyc1

writes bench/data/paired_noise_<label>.npz: `levels_ms` float32 [series, jobs, pairs, 2] (each
block's fastest run; [..., 0] the baseline A, [..., 1] the candidate B, whichever was timed first),
`block_s` float32 [series, jobs, pairs, 2] (each block's wall time, all its runs), `block_runs` int
[series, jobs], `open_s` float32 [series, jobs] (two sessions opened and warmed, not paired time),
`canary_ms` float32 [series, jobs], `started_s` float32 [series, jobs], `load_1min` float32 [rounds],
and `meta` (JSON: series, CPU, cores, date, load, protocol, how it was taken).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np

from optimizer import check_model_file
from service.adapters.canary import time_canary
from service.adapters.engines import engine_named
from service.adapters.engines.feeds import make_feeds
from service.adapters.machine import describe_machine
from service.adapters.paired_measure import policy_for, settle
from service.domain import paired
from service.domain.protocol import Protocol

MODELS = Path(__file__).resolve().parents[1] / "tests" / "models"
DATA = Path(__file__).resolve().parent / "data"
SERIES = [
    ("bert_torchscript_opset14.onnx", "fusionwatch", "extended"),
    ("bert_torchscript_opset14.onnx", "onnxruntime", "extended"),
    ("gpt2_torchscript_opset14.onnx", "fusionwatch", "extended"),
    ("gpt2_torchscript_opset14.onnx", "onnxruntime", "extended"),
]
SEQUENCE_LENGTH = 16  # as bench.detect_measure: the tiny fixtures' position tables are short
# Per job: as many as measure_paired measures at most, so a replayed job stops where the service's
# would (epyc1 was taken with 32: its replayed jobs stop there, still inconclusive, 9% of them).
PAIRS = paired.DEFAULT_PAIRED_POLICY.max_pairs


def capture_job(path: Path, engine: str, level: str, protocol: Protocol, pairs: int) -> dict:
    """One null job: two sessions of `path`, `pairs` pairs of blocks in pair order."""
    policy = policy_for(protocol)
    runner = engine_named(engine)
    opened = time.perf_counter()
    feeds = make_feeds(check_model_file(path), protocol.sequence_length)
    sides = {side: runner.open_timer(path, level, feeds, threads=protocol.threads) for side in ("A", "B")}
    blocks = {side: (lambda k, timer=timer: min(timer() for _ in range(k))) for side, timer in sides.items()}
    settled = {side: settle(block, max(1, protocol.warmup), policy) for side, block in blocks.items()}
    runs = paired.runs_per_block(max(settled.values()) / 1000, policy)  # as measure_paired sizes them
    open_s = time.perf_counter() - opened
    levels = np.zeros((pairs, 2))
    seconds = np.zeros((pairs, 2))
    for pair in range(pairs):
        for side in paired.pair_order(pair):
            started = time.perf_counter()
            levels[pair, "AB".index(side)] = min(sides[side]() for _ in range(runs))
            seconds[pair, "AB".index(side)] = time.perf_counter() - started
    return {"levels": levels, "seconds": seconds, "runs": runs, "open_s": open_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240, help="stop starting rounds after this long")
    parser.add_argument("--label", required=True, help="names the file: bench/data/paired_noise_<label>.npz")
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument("--note", default="2-core VM shared with other engineers' builds and tests while "
                        "measured; nothing was isolated", help="how it was taken, beyond what is recorded")
    args = parser.parse_args()
    protocol = Protocol(sequence_length=SEQUENCE_LENGTH)  # warm-up 3, 1 thread, paired_max_seconds 60
    jobs: dict[str, list] = {k: [[] for _ in SERIES] for k in ("levels", "seconds", "runs", "open_s", "canary", "start")}
    loads: list[float] = []
    started = time.monotonic()
    wall = datetime.datetime.now(datetime.UTC)
    while time.monotonic() - started < args.seconds:
        loads.append(os.getloadavg()[0])
        for i, (model, engine, level) in enumerate(SERIES):
            jobs["start"][i].append(time.monotonic() - started)
            job = capture_job(MODELS / model, engine, level, protocol, args.pairs)
            for key in ("levels", "seconds", "runs", "open_s"):
                jobs[key][i].append(job[key])
            jobs["canary"][i].append(time_canary())  # after the job's runs, as service.adapters.measure times it
        ratios = [np.median(np.log(np.asarray(s[-1])[:, 1] / np.asarray(s[-1])[:, 0])) for s in jobs["levels"]]
        print(f"round {len(loads)}: {time.monotonic() - started:.0f} s, load {loads[-1]:.1f}, median B/A "
              + " ".join(f"{np.exp(r):.3f}" for r in ratios), flush=True)
    machine = describe_machine()
    meta = {
        "label": args.label, "path": "paired",
        "series": [{"model": m, "engine": e, "level": lv} for m, e, lv in SERIES],
        "cpu": machine["cpu"], "cores": machine["cores"], "engine_versions": machine["engine_versions"],
        "measured_at": wall.isoformat(timespec="seconds"), "seconds": round(time.monotonic() - started),
        "protocol": {"warmup": protocol.warmup, "threads": protocol.threads, "sequence_length": SEQUENCE_LENGTH,
                     "pairs": args.pairs, "block_seconds": policy_for(protocol).block_seconds},
        "load_1min": {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)},
        "how": f"python -m bench.paired_capture --seconds {args.seconds:g} --label {args.label} --pairs {args.pairs}",
        "note": args.note,
    }
    out = DATA / f"paired_noise_{args.label}.npz"
    np.savez_compressed(
        out, levels_ms=np.asarray(jobs["levels"], dtype=np.float32), block_s=np.asarray(jobs["seconds"], dtype=np.float32),
        block_runs=np.asarray(jobs["runs"], dtype=np.int32), open_s=np.asarray(jobs["open_s"], dtype=np.float32),
        canary_ms=np.asarray(jobs["canary"], dtype=np.float32), started_s=np.asarray(jobs["start"], dtype=np.float32),
        load_1min=np.asarray(loads, dtype=np.float32), meta=np.asarray(json.dumps(meta)),
    )
    print(f"{out}: {len(SERIES)} series × {len(loads)} jobs × {args.pairs} pairs in {meta['seconds']} s; "
          f"{meta['cpu']}, load average {meta['load_1min']}")


if __name__ == "__main__":
    main()
