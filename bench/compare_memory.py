"""Benchmark: how far the mark-all numeric check (service/adapters/engines/numerics.py) raises a job's peak memory.
Not a test.

One process per engine: first the job's own work (the timed run at the level, and our engine's run
at `disabled`, as service/adapters/measure.py does), then the check on the synthesized feed sets. The
process's peak resident set (ru_maxrss) is read after each: the second minus the first is how far the
check went above the job's own peak (0 when it stayed below it).

    .venv/bin/python -m bench.compare_memory var/bert-base/bert_base_torchscript_opset14.onnx
    .venv/bin/python -m bench.compare_memory MODEL --engines fusionwatch --level all --sequence-length 128
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def one(model: Path, engine: str, level: str, sequence_length: int) -> dict:
    import onnx

    from service.adapters.engines import run_engine
    from service.adapters.engines.feeds import synthesized_feed_sets
    from service.adapters.engines.numerics import check_numerics
    from service.domain.protocol import Protocol

    started = time.perf_counter()
    run_engine(engine, model, level, runs=3, warmup=1, threads=1, sequence_length=sequence_length)
    run_engine("fusionwatch", model, "disabled", runs=1, warmup=0, threads=1, sequence_length=sequence_length)
    job_peak = _peak_mib()
    job_s = time.perf_counter() - started
    sets = synthesized_feed_sets(onnx.load(str(model), load_external_data=False), sequence_length)
    started = time.perf_counter()
    check = check_numerics(engine, model, level, sets, Protocol().tolerances(), threads=1)
    return {
        "engine": engine, "level": level, "job_peak_mib": round(job_peak), "with_check_peak_mib": round(_peak_mib()),
        "above_job_mib": round(max(0.0, _peak_mib() - job_peak)), "job_s": round(job_s, 1),
        "check_s": round(time.perf_counter() - started, 1),
        "feed_sets": [(c.feed_set, c.status, c.tensors, c.diverging, c.ok) for c in check.comparisons],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--engines", nargs="+", default=["fusionwatch", "onnxruntime"])
    parser.add_argument("--level", default="extended")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one engine
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.model, args.engines[0], args.level, args.sequence_length)))
        return
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    print(f"CPU: {cpu}; model {args.model} ({args.model.stat().st_size / 2**20:.0f} MiB), level {args.level}, "
          f"sequence {args.sequence_length}")
    for engine in args.engines:
        child = subprocess.run(
            [sys.executable, "-m", "bench.compare_memory", str(args.model), "--engines", engine, "--level", args.level,
             "--sequence-length", str(args.sequence_length), "--one"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        print(child.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
