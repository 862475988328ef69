"""Time one benchmark model at level `all` with its GEMM library and OpenMP wait fixed, to check the
kernel race's choice (runtime/kernel_choice.py) against what the whole model does on each.

    .venv/bin/python -m bench.fixed_library --model gpt2_small mkl-packed/spin onednn/sleep onednn/spin

Sessions take turns (3 runs each, 0.2 s apart, 6 rounds); prints each one's median and fastest run
and the load average.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import runtime
from bench.__main__ import feeds_for
from bench.models import MODELS, model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entrants", nargs="+", help="LIBRARY/WAIT, e.g. onednn/sleep")
    parser.add_argument("--model", default="gpt2_small", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    path = str(model_path(args.model))
    sessions = {}
    for entrant in args.entrants:
        library, _, wait = entrant.partition("/")
        options = runtime.SessionOptions(
            graph_optimization_level="all", intra_op_num_threads=args.threads,
            kernel_libraries={"gemm": library, "wait": wait or "sleep"},
        )
        sessions[entrant] = runtime.InferenceSession(path, options)
    feeds = feeds_for(next(iter(sessions.values())))  # make bench's inputs
    for session in sessions.values():
        session.run(None, feeds)
        session.run(None, feeds)
    before = os.getloadavg()[0]
    times: dict[str, list[float]] = {entrant: [] for entrant in sessions}
    for _ in range(args.rounds):
        for entrant, session in sessions.items():
            time.sleep(0.2)
            for _ in range(3):
                start = time.perf_counter()
                session.run(None, feeds)
                times[entrant].append((time.perf_counter() - start) * 1e3)
    print(f"{args.model} at all, {args.threads} threads, load average {before:.1f} → {os.getloadavg()[0]:.1f}")
    for entrant, samples in times.items():
        print(f"  {entrant:18s} median {np.median(samples):7.1f} ms   fastest {min(samples):7.1f} ms")


if __name__ == "__main__":
    main()
