"""Measure the timing noise `make bench-detect` resamples: real jobs of the project's engines on this machine.

Each "job" is what a worker does for one model × engine × level (`service.adapters.measure.measure` without
the numeric check, which is not timed): a fresh session through `service.adapters.engines.run_engine` with the
protocol's defaults (`service.domain.protocol.Protocol`: warm-up 3, then 100 timed runs, 1 thread) except
sequence length 16 (the BERT fixture's position table stops at 64), followed by the canary
(`service.adapters.canary.time_canary`). Jobs go round-robin over the series, so a slow moment of the machine
lands on every series at once, as it does on a shared CI box; nothing else is controlled.

    .venv/bin/python -m bench.detect_measure --seconds 600

writes bench/data/detect_noise.npz: `execute_ms` float32 [series, jobs, runs] in measured order,
`canary_ms` float32 [series, jobs], `started_s` float32 [series, jobs] (when each job started, seconds
from the first), `load_1min` float32 [jobs] (the 1-minute load average at each round's start), and
`meta` (a JSON string: series names, CPU, date, protocol).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from service.adapters.canary import time_canary
from service.adapters.engines import run_engine
from service.adapters.machine import describe_machine
from service.domain.protocol import Protocol

MODELS = Path(__file__).resolve().parents[1] / "tests" / "models"
OUT = Path(__file__).resolve().parent / "data" / "detect_noise.npz"
SERIES = [
    ("bert_dynamo_opset20.onnx", "onnxruntime", "extended"),
    ("bert_dynamo_opset20.onnx", "fusionwatch", "extended"),
    ("gpt2_dynamo_opset20.onnx", "onnxruntime", "extended"),
    ("gpt2_dynamo_opset20.onnx", "fusionwatch", "extended"),
    ("resnet_tiny_opset17.onnx", "onnxruntime", "all"),
    ("resnet_tiny_opset17.onnx", "fusionwatch", "all"),
]
SEQUENCE_LENGTH = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="stop starting rounds after this long")
    parser.add_argument("--max-jobs", type=int, default=400, help="jobs per series at most")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    protocol = Protocol()
    timed = dict(runs=protocol.runs, warmup=protocol.warmup, threads=protocol.threads, sequence_length=SEQUENCE_LENGTH)
    for model, engine, level in SERIES:  # compile and warm every engine once, untimed
        run_engine(engine, MODELS / model, level, runs=1, warmup=1, threads=protocol.threads,
                   sequence_length=SEQUENCE_LENGTH)
    samples: list[list[list[float]]] = [[] for _ in SERIES]
    canaries: list[list[float]] = [[] for _ in SERIES]
    starts: list[list[float]] = [[] for _ in SERIES]
    loads: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < args.seconds and len(samples[0]) < args.max_jobs:
        loads.append(os.getloadavg()[0])
        for i, (model, engine, level) in enumerate(SERIES):
            starts[i].append(time.monotonic() - started)
            result = run_engine(engine, MODELS / model, level, **timed)
            samples[i].append(list(result.execute_samples_ms))
            canaries[i].append(time_canary())  # right after the model's runs, as service.adapters.measure times it
        print(f"round {len(samples[0])}: {time.monotonic() - started:.0f} s, load {loads[-1]:.1f}", flush=True)
    machine = describe_machine()
    meta = {
        "series": [{"model": m, "engine": e, "level": lv} for m, e, lv in SERIES],
        "cpu": machine.get("cpu") or platform.processor(), "cores": machine.get("cores"),
        "engine_versions": machine.get("engine_versions"),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started),
        "protocol": timed,
        "load_1min": {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)},
        "note": "2-core VM shared with other engineers' builds and tests while measured; nothing was isolated",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, execute_ms=np.asarray(samples, dtype=np.float32),
                        canary_ms=np.asarray(canaries, dtype=np.float32),
                        started_s=np.asarray(starts, dtype=np.float32), load_1min=np.asarray(loads, dtype=np.float32),
                        meta=np.asarray(json.dumps(meta)))
    print(f"{args.out}: {len(SERIES)} series × {len(samples[0])} jobs × {protocol.runs} runs in {meta['seconds']} s; "
          f"{meta['cpu']}, load average {meta['load_1min']}")


if __name__ == "__main__":
    main()
