"""Our executor on CUDA (CuPy) next to our CPU executor: median ms per `session.run`.

    python -m bench.gpu [--models bert_base resnet50 bert_tiny resnet_tiny] [--levels all] [--runs 20]
    python -m bench.gpu --write-skeletons     # where bench/cache holds the exported models
    python -m bench.gpu --profile 8           # also the 8 costliest ops per run on CUDA

A run is what a caller sees: feeds copied to the device, the graph, outputs copied back (which
waits for the device), so the GPU number includes both copies. The CPU side is our numpy
executor on the same machine with all its cores (MKL's packed GEMM where `mkl` is installed,
else numpy's BLAS); onnxruntime's CPU provider is printed beside them for scale. Each model also
prints the largest difference between the CUDA and CPU outputs.

Why skeletons: the benchmark models (bench/cache, 90-500 MB, exported with torch) are too big
to travel to a GPU machine, and torch need not be there. A skeleton is the same graph with each
large float initializer cut down to its name, type and shape (`--write-skeletons`, here, into
bench/cache/skeleton/, a few hundred KB each); this script refills those weights from a fixed
seed where only the skeleton exists. The exports carry random weights too, so the timings are
the same graph's; only the output values differ. The tiny fixtures (tests/models) need neither.

Measured on one H100 80GB (16-core Xeon host, numpy's BLAS: no MKL there, CuPy 14.2, onnxruntime
1.30), `python -m bench.gpu --models bert_base resnet50 bert_tiny --runs 20 --levels disabled all
--profile 6`, median ms:
                 cuda   our cpu   ort cpu         cuda    our cpu   ort cpu
    bert_base   41.36     95.28     52.44 (dis.)  12.98     66.68     35.42 (all)
    resnet50     6.42     48.46     21.15 (dis.)   6.14     30.60      8.85 (all)
    bert_tiny   10.43      1.28      0.41 (dis.)   3.95      0.65      0.32 (all)
The fused contrib ops are one CUDA launch each (runtime/kernels/cuda_fused.py; Attention is its
three cuBLAS products, a head split, the masked softmax and a merge copy), so fusion now shows on the GPU: in the same call, with those ops
still on their array-API path (a chain of small CuPy launches each), level all took 29.43 ms on
BERT-base and 6.03 ms on the tiny BERT, and the profile put SkipLayerNormalization at 0.44 ms per
call, Attention 0.82, BiasGelu 0.69; now 0.06, 0.36 and 0.05 (profiled times include a wait after
every node). Level disabled moves 10-20% between runs of this launch-bound work (the same call's
other run gave BERT-base 47.68, ResNet-50 8.10). What is left is launch and Python overhead
(cupy.matmul's, the executor's, the unfused shape ops'), which is why a tiny model still runs
slower on the GPU than on the CPU; CUDA graphs would be the next step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from bench.__main__ import RESULTS, cpu_name, feeds_for, median_ms, ort_session
from bench.models import CACHE

ROOT = Path(__file__).resolve().parents[1]
SKELETONS = CACHE / "skeleton"
FIXTURES = {
    "bert_tiny": ROOT / "tests" / "models" / "bert_torchscript_opset14.onnx",
    "resnet_tiny": ROOT / "tests" / "models" / "resnet_tiny_opset17.onnx",
}
FIXTURE_SEQ = 16  # the tiny BERT holds 64 positions; bench models run at 128, as `make bench`
BENCH_MODELS = ("bert_base", "resnet50")
STRIPPED_KEY = "fusionwatch.bench.stripped_initializers"
STRIP_ELEMENTS = 4096  # float initializers this large are weights; smaller ones (norms, biases) are kept


def write_skeleton(source: Path, target: Path) -> int:
    """The model at `source` with its large float initializers emptied; returns how many.
    An emptied initializer keeps its name, type and dims; the metadata lists which they are."""
    model = onnx.load(source)
    stripped = []
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT and np.prod(tensor.dims) >= STRIP_ELEMENTS:
            tensor.ClearField("raw_data")
            tensor.ClearField("float_data")
            stripped.append(tensor.name)
    entry = model.metadata_props.add()
    entry.key, entry.value = STRIPPED_KEY, json.dumps(stripped)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, target)
    return len(stripped)


def fill_skeleton(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Random weights for a skeleton's emptied initializers: He-scaled for conv kernels (so 50
    layers of ReLU neither vanish nor blow up), N(0, 0.02) for the rest, as BERT initializes."""
    stripped = next((json.loads(p.value) for p in model.metadata_props if p.key == STRIPPED_KEY), None)
    if stripped is None:
        raise ValueError(f"not a skeleton: the model has no {STRIPPED_KEY} metadata")
    wanted = set(stripped)
    rng = np.random.default_rng(seed)
    for tensor in model.graph.initializer:
        if tensor.name in wanted:
            dims = tuple(tensor.dims)
            scale = np.sqrt(2.0 / np.prod(dims[1:])) if len(dims) == 4 else 0.02
            values = (rng.standard_normal(dims, dtype=np.float32) * np.float32(scale)).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    return model


def load_model(name: str) -> tuple[onnx.ModelProto, str]:
    """The model by name and where it came from: a fixture, the exported bench model, or its skeleton."""
    if name in FIXTURES:
        return onnx.load(FIXTURES[name]), "fixture"
    exported = CACHE / f"{name}.onnx"
    if exported.is_file():
        return onnx.load(exported), "exported"
    skeleton = SKELETONS / f"{name}.onnx"
    if skeleton.is_file():
        return fill_skeleton(onnx.load(skeleton)), "skeleton, seeded weights"
    raise FileNotFoundError(
        f"no {exported} or {skeleton}: export it where torch is (`python -m bench --models {name}`), "
        "then `python -m bench.gpu --write-skeletons` there to make a skeleton that travels"
    )


def gpu_name() -> str:
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def bench_model(model: onnx.ModelProto, level: str, runs: int, threads: int, seq: int) -> dict:
    import runtime

    options = runtime.SessionOptions(graph_optimization_level=level, intra_op_num_threads=threads)
    cuda = runtime.InferenceSession(model, options, providers=["CUDAExecutionProvider"])
    cpu = runtime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = feeds_for(cuda, seq)
    cuda_out, cpu_out = cuda.run(None, feeds), cpu.run(None, feeds)
    difference = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(cuda_out, cpu_out, strict=True))
    with_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fusionwatch_bench_gpu_{os.getpid()}.onnx"
    onnx.save(model, with_path)  # onnxruntime takes a path; the skeleton's weights exist only in memory
    try:
        reference = ort_session(with_path, level, threads)
        ort_ms = median_ms(partial(reference.run, None, feeds), runs)
    finally:
        with_path.unlink()
    return {
        "cuda_ms": median_ms(partial(cuda.run, None, feeds), runs),
        "cpu_ms": median_ms(partial(cpu.run, None, feeds), runs),
        "ort_cpu_ms": ort_ms,
        "gemm_backend_cpu": cpu.gemm_backend,
        "max_abs_difference": difference,
    }


def print_cuda_profile(model: onnx.ModelProto, level: str, runs: int, top: int, seq: int) -> None:
    """The costliest ops of a profiled CUDA session. Profiling waits for the device after every
    node (runtime/executor.py), so these are device times plus launch overhead, and their sum
    exceeds an unprofiled run's, where launches overlap the device's work."""
    import runtime
    from runtime.profile_table import profile_table

    options = runtime.SessionOptions(
        graph_optimization_level=level, enable_profiling=True,
        profile_file_prefix=str(Path(os.environ.get("TMPDIR", "/tmp")) / "fusionwatch_bench_gpu"),
    )
    session = runtime.InferenceSession(model, options, providers=["CUDAExecutionProvider"])
    feeds = feeds_for(session, seq)
    for _ in range(runs + 1):
        session.run(None, feeds)
    trace = Path(session.end_profiling())
    table = profile_table(json.loads(trace.read_text()), skip_runs=1)
    trace.unlink()
    print(f"    profiled on CUDA, {table.runs} runs: model_run {table.median_model_run_ms:.2f} ms, "
          f"SequentialExecutor::Execute {table.median_execute_ms:.2f} ms; costliest ops (us per run, calls):")
    for op in table.ops[:top]:
        print(f"      {op.op:<28} {op.us_per_run:9.1f} {op.calls_per_run:6.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[*BENCH_MODELS, *FIXTURES],
                        choices=[*BENCH_MODELS, *FIXTURES])
    parser.add_argument("--levels", nargs="+", default=["all"],
                        choices=["disabled", "basic", "extended", "layout", "all"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="after each row, the TOP costliest ops of a profiled CUDA session")
    parser.add_argument("--write-skeletons", action="store_true",
                        help=f"write skeletons of {', '.join(BENCH_MODELS)} from bench/cache into {SKELETONS}")
    args = parser.parse_args()
    if args.write_skeletons:
        for name in BENCH_MODELS:
            target = SKELETONS / f"{name}.onnx"
            count = write_skeleton(CACHE / f"{name}.onnx", target)
            print(f"{target}: {count} initializers emptied, {target.stat().st_size / 1e6:.2f} MB")
        return
    machine = {
        "gpu": gpu_name(), "cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
        "python": platform.python_version(), "onnxruntime": ort.__version__,
    }
    print(f"machine: {machine['gpu']}; {machine['cpu']}, {machine['cores']} cores, {args.threads} CPU threads")
    print(f"median ms per session.run ({args.runs} runs after 2 warm-up runs)")
    print(f"  {'model':<12} {'level':<9} {'cuda':>9} {'cpu':>9} {'ort cpu':>9} {'cpu/cuda':>9}  max |cuda-cpu|  source")
    results = {"machine": machine, "runs": args.runs, "models": {}}
    for name in args.models:
        try:
            model, source = load_model(name)
        except FileNotFoundError as error:
            print(f"  {name:<12} skipped: {error}")
            continue
        for level in args.levels:
            seq = FIXTURE_SEQ if name in FIXTURES else 128
            row = bench_model(model, level, args.runs, args.threads, seq)
            results["models"].setdefault(name, {})[level] = {**row, "source": source}
            print(
                f"  {name:<12} {level:<9} {row['cuda_ms']:9.2f} {row['cpu_ms']:9.2f} {row['ort_cpu_ms']:9.2f} "
                f"{row['cpu_ms'] / row['cuda_ms']:9.2f}  {row['max_abs_difference']:.2e}        {source}"
            )
            if args.profile:
                print_cuda_profile(model, level, 5, args.profile, seq)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gpu.json").write_text(json.dumps(results, indent=2))
    print(f"results in {RESULTS / 'gpu.json'}")


if __name__ == "__main__":
    main()
