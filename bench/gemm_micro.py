"""Each GEMM library alone, in a process of its own, timed on a model's products against a
constant weight exactly as the session's race times it, next to onnxruntime's MatMul (MLAS).
Not a test.

Why alone: the race (runtime/kernel_choice.py) times its entrants one after another in one
process. Here nothing else has run in the process, so a race whose libraries disturbed one
another would show numbers the race's do not match (issue 14). Each entrant's call is the race's
own (`kernel_choice.time_gemm`: the product, then the one-thread pass a model runs over its
output); "onednn/spin" and "onednn/sleep" are oneDNN with its OpenMP workers spinning 1 ms or
sleeping at once between calls (runtime/kernels/openmp.py).

    .venv/bin/python -m bench.gemm_micro                    # BERT-base's shapes, 2 threads
    .venv/bin/python -m bench.gemm_micro --threads 1 --shapes 128x768x3072x12
    .venv/bin/python -m bench.gemm_micro --entrants onednn/spin onnxruntime

Prints, per entrant and shape, the median and fastest ms per call, the GFLOP/s of the fastest
(the product's FLOPs over the call, pass included), and the entrant's total over the shapes
weighted by their counts (the race's measure), with the 1-minute load average around each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# BERT-base at sequence 128, 12 layers: the QKV projection, the attention output, the MLP's two.
BERT_SHAPES = "128x768x2304x12,128x768x768x12,128x768x3072x12,128x3072x768x12"


def _entrants() -> list[str]:
    from runtime import kernel_choice

    return [*kernel_choice.with_waits(kernel_choice.gemm_candidates()), "onnxruntime"]


def _onnxruntime_call(shape, threads: int):
    """onnxruntime's MatMul on a constant weight of `shape`, then the race's pass over its output."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from runtime.kernels import compiled

    m, k, n, _ = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "b")],
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
    )
    bias = rng.standard_normal(n, dtype=np.float32)
    after = np.empty((m, n), np.float32)
    return lambda: compiled.bias_gelu_rows(session.run(None, {"a": a})[0], bias, after)


def call_times_ms(call, calls: int, warmup: int = 5) -> list[float]:
    """ms of each of `calls` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - started))
    return times


def measure(entrant: str, shapes: list[tuple[int, int, int, int]], threads: int, calls: int) -> list[dict]:
    """Time `entrant` on each shape in this process: `calls` timed calls after a warm-up."""
    from runtime import kernel_choice
    from runtime.threads import limit_blas_threads

    limit_blas_threads(threads)
    rows = []
    for shape in shapes:
        if entrant == "onnxruntime":
            call = _onnxruntime_call(shape, threads)
        else:
            call = kernel_choice.time_gemm(entrant, shape)
        times = call_times_ms(call, calls)
        m, k, n, count = shape
        rows.append({"shape": list(shape), "median_ms": statistics.median(times),
                     "best_ms": min(times), "gflops_best": 2.0 * m * k * n / min(times) / 1e6})  # fmt: skip
    return rows


def _in_fresh_process(entrant: str, shapes: str, threads: int, calls: int) -> list[dict]:
    command = [sys.executable, "-m", "bench.gemm_micro", "--entrants", entrant, "--shapes", shapes,
               "--threads", str(threads), "--calls", str(calls), "--in-process"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _parse(shapes: str) -> list[tuple[int, int, int, int]]:
    parsed = []
    for shape in shapes.split(","):
        dims = [int(d) for d in shape.split("x")]
        parsed.append((*dims, 1) if len(dims) == 3 else tuple(dims))
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entrants", nargs="+", help="default: every race entrant loadable here, and onnxruntime")
    parser.add_argument("--shapes", default=BERT_SHAPES, help="MxKxN[xCOUNT],... (default: BERT-base's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        [entrant] = args.entrants
        print(json.dumps(measure(entrant, _parse(args.shapes), args.threads, args.calls)))
        return
    from runtime.kernel_choice import cpu_info

    print(f"cpu: {cpu_info()}, {args.threads} threads, {args.calls} calls per shape, each entrant in a fresh process")
    for entrant in args.entrants or _entrants():
        before = os.getloadavg()[0]
        rows = _in_fresh_process(entrant, args.shapes, args.threads, args.calls)
        total = sum(row["median_ms"] * row["shape"][3] for row in rows)
        print(f"{entrant:18s} total {total:8.2f} ms over the shapes' counts (load average {before:.2f}-{os.getloadavg()[0]:.2f})")
        for row in rows:
            m, k, n, count = row["shape"]
            print(f"  {m:5d}x{k:5d}x{n:5d} x{count:<3d} median {row['median_ms']:7.3f}  best {row['best_ms']:7.3f} ms"
                  f"  {row['gflops_best']:6.1f} GFLOP/s at the best")  # fmt: skip


if __name__ == "__main__":
    main()
