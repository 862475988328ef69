"""What profiling adds to a run, ours and onnxruntime's. Not a test.

The service times every job from the engines' profile traces (service/adapters/engines/result.py), so a
profiler's own cost per node is in every stored timing, and more of it at level `disabled`,
which has the most nodes. This prints, per level, the median run with profiling off and on,
for both engines, on the same feeds as a service job:

    .venv/bin/python -m bench.profiling_cost [--model tests/models/bert_dynamo_opset20.onnx]
        [--sequence-length 16] [--runs 200] [--levels disabled all]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import onnx
import onnxruntime as ort

import runtime
from bench.__main__ import ORT_LEVELS, median_ms
from service.adapters.engines.feeds import make_feeds


def ours(path: str, level: str, threads: int, profiled: bool, folder: str) -> runtime.InferenceSession:
    options = runtime.SessionOptions(
        graph_optimization_level=level, intra_op_num_threads=threads, enable_profiling=profiled,
        profile_file_prefix=os.path.join(folder, "ours"),
    )  # fmt: skip
    return runtime.InferenceSession(path, options)


def theirs(path: str, level: str, threads: int, profiled: bool, folder: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ORT_LEVELS[level]
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.enable_profiling = profiled
    options.profile_file_prefix = os.path.join(folder, "ort")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tests/models/bert_dynamo_opset20.onnx")
    parser.add_argument("--sequence-length", type=int, default=16)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="the service's protocol default is 1")
    parser.add_argument("--levels", nargs="+", default=["disabled", "all"], choices=list(ORT_LEVELS))
    args = parser.parse_args()
    feeds = make_feeds(onnx.load(args.model, load_external_data=False), args.sequence_length)
    print(f"{args.model}, sequence {args.sequence_length}, {args.threads} thread(s), load average "
          f"{os.getloadavg()[0]:.1f}; median ms of {args.runs} runs")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for level in args.levels:
            for engine, make in (("ours", ours), ("onnxruntime", theirs)):
                plain, profiled = (make(args.model, level, args.threads, flag, folder) for flag in (False, True))
                off = median_ms(lambda s=plain: s.run(None, feeds), args.runs, warmup=10)
                on = median_ms(lambda s=profiled: s.run(None, feeds), args.runs, warmup=10)
                nodes = len(list(plain.model.graph)) if engine == "ours" else None
                per_node = f", {1000 * (on - off) / nodes:.1f} us a node ({nodes} nodes)" if nodes else ""
                print(f"  {level:9s} {engine:12s} off {off:7.3f}  profiled {on:7.3f}  (+{on - off:.3f}{per_node})")
                profiled.end_profiling()


if __name__ == "__main__":
    main()
