"""What `SessionOptions.enable_cpu_mem_arena` buys (runtime/memory.py): page faults and median
ms per run of a bench model at level all, with the option on and off, each in a fresh process
(the setting is process-wide and one-way).

    python -m bench.memory [--model resnet50] [--threads 2] [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = """
import json, resource, statistics, sys, time
import numpy as np
import runtime
from bench.models import model_path
name, threads, runs, arena = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "on"
options = runtime.SessionOptions(
    graph_optimization_level="all", intra_op_num_threads=threads, enable_cpu_mem_arena=arena
)
session = runtime.InferenceSession(str(model_path(name)), options)
from bench.__main__ import feeds_for  # onnxruntime is imported, not run: its frees would move glibc's thresholds
feeds = feeds_for(session)  # our NodeArgs carry name, shape and type as onnxruntime's do
for _ in range(3):
    session.run(None, feeds)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
times = []
for _ in range(runs):
    started = time.perf_counter()
    session.run(None, feeds)
    times.append((time.perf_counter() - started) * 1000)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / runs
print(json.dumps({"ms": statistics.median(times), "faults": faults}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    for arena in ("off", "on", "off", "on"):  # alternated: a busy machine drifts
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, args.model, str(args.threads), str(args.runs), arena],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(f"{args.model} arena {arena:<3}: {result['ms']:7.2f} ms per run, {result['faults']:7.1f} page faults per run")


if __name__ == "__main__":
    main()
