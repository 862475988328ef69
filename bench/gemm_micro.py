"""Each GEMM library alone, in a process of its own, on a model's products against a constant
weight, next to onnxruntime's MatMul (MLAS) on the same shapes. Not a test.

Why alone: the session's race (runtime/kernel_choice.py) times the candidates in one process,
one after another. This is what each library does when nothing else has run in the process, so
the race's numbers can be checked against it (issue 14: a race whose libraries disturb one
another measures the interference, not the library).

    .venv/bin/python -m bench.gemm_micro                       # BERT-base's shapes, 2 threads
    .venv/bin/python -m bench.gemm_micro --threads 1 --shapes 128x768x3072
    .venv/bin/python -m bench.gemm_micro --library onednn      # one library, in this process

Prints, per library and shape, the median and fastest ms per call and the GFLOP/s of the
median, with the 1-minute load average before and after each library's block.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LIBRARIES = ("onednn", "mkl-packed", "numpy", "onnxruntime")
BERT_SHAPES = "128x768x2304,128x768x768,128x768x3072,128x3072x768"


def _load() -> float:
    return os.getloadavg()[0]


def _product(library: str, a, b):
    """A call computing a @ b on `library`, its weight prepared beforehand."""
    from functools import partial

    import numpy as np

    if library == "mkl-packed":
        from runtime.kernels import gemm

        return partial(gemm.matmul_packed, a, gemm.PackedWeight(b))
    if library == "onednn":
        from runtime.kernels import onednn_matmul

        return partial(onednn_matmul.MatMulWeight(b).matmul, a)
    if library == "numpy":
        return partial(np.matmul, a, b)
    return _onnxruntime_matmul(a, b)


def _onnxruntime_matmul(a, b):
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(os.environ["OMP_NUM_THREADS"])
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return lambda: session.run(None, {"a": a})


def measure(library: str, shapes: list[tuple[int, int, int]], threads: int, calls: int) -> list[dict]:
    """Time `library` on each shape in this process: `calls` timed calls after a warm-up."""
    import numpy as np

    from runtime.threads import limit_blas_threads

    limit_blas_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        call = _product(library, a, b)
        for _ in range(5):
            call()
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        rows.append({"shape": [m, k, n], "median_ms": 1e3 * median, "best_ms": 1e3 * min(times),
                     "gflops": 2.0 * m * k * n / median / 1e9})  # fmt: skip
    return rows


def _in_fresh_process(library: str, shapes: str, threads: int, calls: int) -> list[dict]:
    environment = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                       MKL_NUM_THREADS=str(threads))  # fmt: skip
    command = [sys.executable, "-m", "bench.gemm_micro", "--library", library, "--shapes", shapes,
               "--threads", str(threads), "--calls", str(calls), "--json"]  # fmt: skip
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _parse(shapes: str) -> list[tuple[int, int, int]]:
    return [tuple(int(d) for d in shape.split("x")) for shape in shapes.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", choices=LIBRARIES, help="time this one in this process")
    parser.add_argument("--shapes", default=BERT_SHAPES, help="MxKxN,... (default: BERT-base's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.library and args.json:
        print(json.dumps(measure(args.library, _parse(args.shapes), args.threads, args.calls)))
        return
    from runtime.kernel_choice import cpu_info

    print(f"cpu: {cpu_info()}, {args.threads} threads, {args.calls} calls per shape")
    for library in [args.library] if args.library else LIBRARIES:
        before = _load()
        rows = _in_fresh_process(library, args.shapes, args.threads, args.calls)
        total = sum(row["median_ms"] for row in rows)
        print(f"{library:12s} total {total:7.3f} ms (load average {before:.2f}-{_load():.2f})")
        for row in rows:
            m, k, n = row["shape"]
            print(f"  {m:5d}x{k:5d}x{n:5d}  median {row['median_ms']:7.3f}  best {row['best_ms']:7.3f} ms"
                  f"  {row['gflops']:6.1f} GFLOP/s")  # fmt: skip


if __name__ == "__main__":
    main()
