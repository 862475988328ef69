"""`make bench`: our optimizer and executor next to onnxruntime on BERT-base, GPT-2 small, ResNet-50,
then on the small models (bench/small.py: tiny BERT and GPT-2, sequence 1, 16, 128, one thread).

Prints, per model:
  - optimizer: load, pass time per level (loading and saving excluded) and save time, next to
    onnxruntime's `session_initialization` at ORT_ENABLE_ALL read from its profile (which also
    excludes model loading); target ours / onnxruntime <= 0.5 at level all.
  - the CPU model, its vector extensions, and per level the kernel libraries our session chose
    (runtime/kernel_choice.py), with the timings behind the choice at level all.
  - executor: median ms per level for ours and onnxruntime (ORT_SEQUENTIAL, same thread count,
    same level; timed in alternating blocks of two runs), the ratio against its target, our peak
    bytes of live intermediates (session.peak_bytes), the machine's 1-minute load average before
    and after, and our fusion speedup (disabled / all, our two sessions timed in alternating
    blocks too) next to onnxruntime's own. Every level runs on the kernel libraries the level-all
    session measured, so that levels differ by their graphs only.
  - with --profile N: where the time goes at level all, the N costliest op types per run for
    ours and onnxruntime, read from each engine's profile trace the same way
    (runtime/profile_table.py), and each node's fastest call summed per op type, the
    comparison of the kernels themselves that a loaded machine distorts least.
Writes bench/results/<model>.json with the machine's CPU and thread count.

    python -m bench [--models bert_base gpt2_small resnet50] [--runs 10] [--threads 2] [--skip-runtime]
                    [--profile 8] [--levels disabled all] [--small | --no-small] [--blocks 20]

`--small` runs the small models alone (the large ones take long on a shared 2-core machine);
`--no-small` the large ones alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from bench.gemm_micro import call_times_ms
from bench.models import MODELS, model_path
from optimizer import LEVEL_NAMES, optimize, save_model

RESULTS = Path(__file__).parent / "results"
# ours / onnxruntime at level all (issue 14), on any x86-64 CPU.
RATIO_TARGETS = {"bert_base": 1.0, "gpt2_small": 1.0, "resnet50": 1.15}
ORT_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "layout": ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def feeds_for(session: ort.InferenceSession, seq: int = 128) -> dict[str, np.ndarray]:
    """Deterministic inputs: token ids, an all-ones mask, zero segments, or a random image."""
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else (1 if i == 0 else seq) for i, d in enumerate(arg.shape)]
        if arg.type == "tensor(int64)":
            if "mask" in arg.name:
                feeds[arg.name] = np.ones(shape, np.int64)
            elif "type" in arg.name:
                feeds[arg.name] = np.zeros(shape, np.int64)
            else:
                feeds[arg.name] = rng.integers(0, 1000, shape, dtype=np.int64)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def ort_session(path: Path, level: str, threads: int, profile: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ORT_LEVELS[level]
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = profile
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_initialization_ms(path: Path, threads: int) -> float:
    session = ort_session(path, "all", threads, profile=True)
    profile = Path(session.end_profiling())
    trace = json.loads(profile.read_text())
    profile.unlink()
    return next(e["dur"] for e in trace if e.get("name") == "session_initialization") / 1000


def median_ms(run, runs: int, warmup: int = 2) -> float:
    return statistics.median(call_times_ms(run, runs, warmup))


def bench_optimizer(path: Path, threads: int) -> dict:
    rows = {}
    for level in LEVEL_NAMES:
        started = time.perf_counter()
        model = ir.load(path)
        load_ms = (time.perf_counter() - started) * 1000
        report = optimize(model, level=level).report
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            save_model(model, Path(tmp) / "out.onnx")
            save_ms = (time.perf_counter() - started) * 1000
        rows[level] = {
            "load_ms": load_ms, "pass_ms": report.total_ms, "save_ms": save_ms,
            "nodes_after": report.nodes_after, "fusions": report.fusions,
        }
    ort_ms = ort_initialization_ms(path, threads)
    return {"levels": rows, "ort_session_initialization_ms": ort_ms, "ratio_all": rows["all"]["pass_ms"] / ort_ms}


def interleaved_medians(first, second, runs: int, block: int = 2, warmup: int = 2) -> tuple[float, float]:
    """Median ms of each of two calls, timed in alternating blocks of `block` runs, so that a
    machine whose load drifts (a shared 2-core VM) weighs on both alike. Each block starts after
    a pause, so that the other engine's worker threads, which spin for a while after a run
    (onnxruntime's do), have gone to sleep."""
    for _ in range(warmup):
        first()
        second()
    times: tuple[list[float], list[float]] = ([], [])
    while len(times[0]) < runs:
        for call, samples in ((first, times[0]), (second, times[1])):
            time.sleep(0.05)
            call()  # the block's first run pays for waking the threads; untimed
            for _ in range(min(block, runs - len(samples))):
                started = time.perf_counter()
                call()
                samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[0]), statistics.median(times[1])


def bench_executor(path: Path, threads: int, runs: int, levels=LEVEL_NAMES) -> dict:
    import runtime

    rows = {}
    choices = None
    libraries = None  # the ones the level-all session (else the last level's) measured
    kept: dict[str, dict] = {"ours": {}, "onnxruntime": {}}  # runs at disabled and all, for the fusion speedups
    # The session whose choice every level runs on is created first, so that the levels differ
    # by their graphs only: each level's graph has its own product shapes and would race the
    # libraries on its own, and on a loaded machine two races can pick two libraries, which
    # then shows as a fusion speedup (or loss) that is the libraries', not the fusions'.
    first = "all" if "all" in levels else levels[-1]
    for level in sorted(levels, key=lambda name: name != first):
        reference = ort_session(path, level, threads)
        feeds = feeds_for(reference)
        options = runtime.SessionOptions(graph_optimization_level=level, intra_op_num_threads=threads)
        if libraries is not None:
            options.kernel_libraries = libraries
        ours = runtime.InferenceSession(str(path), options)
        load_before = os.getloadavg()[0]
        our_ms, ort_ms = interleaved_medians(partial(ours.run, None, feeds), partial(reference.run, None, feeds), runs)
        rows[level] = {
            "ours_ms": our_ms, "ort_ms": ort_ms, "ratio": our_ms / ort_ms,
            "ours_peak_mb": ours.peak_bytes / 2**20,
            "libraries": ours.kernel_choices.libraries(),
            "load_average": [load_before, os.getloadavg()[0]],  # 1-minute, before and after
        }
        if level == first:
            choices = ours.kernel_choices.as_dict()
            libraries = ours.kernel_choices.libraries()
        if level in ("disabled", "all"):
            kept["ours"][level] = partial(ours.run, None, feeds)
            kept["onnxruntime"][level] = partial(reference.run, None, feeds)
        del ours, reference
    rows = {level: rows[level] for level in levels}
    speedups = {}
    for engine, runs_by_level in kept.items():
        if len(runs_by_level) < 2:
            continue
        # Timed against each other in alternating blocks, as ours and onnxruntime's are: the
        # per-level medians above come minutes apart, and a shared machine's speed drifts more
        # than that between them. onnxruntime's own is printed beside ours: what fusion can
        # win on a model depends on how much of its time is not in GEMMs, whoever runs it.
        load_before = os.getloadavg()[0]
        disabled_ms, all_ms = interleaved_medians(runs_by_level["disabled"], runs_by_level["all"], runs)
        speedups[engine] = {
            "speedup": disabled_ms / all_ms, "disabled_ms": disabled_ms, "all_ms": all_ms,
            "load_average": [load_before, os.getloadavg()[0]],
        }  # fmt: skip
    return {
        "levels": rows,
        "fusion_speedup": speedups.get("ours"),
        "ort_fusion_speedup": speedups.get("onnxruntime"),
        "kernel_choices": choices,
        "libraries": libraries,  # what every level ran on
    }


def describe_choice(choice: dict) -> str:
    """"onednn (onednn 8.5, numpy 10.2, mkl-packed 12.5 ms on ...)" from a KernelChoice's dict."""
    timings = choice["timings_ms"]
    if not timings:
        return f"{choice['library']} ({choice['reason']})"
    ranked = ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(timings.items(), key=lambda item: item[1]))
    return f"{choice['library']} ({ranked} ms)"


def profile_rows(path: Path, threads: int, runs: int, top: int, libraries=None, levels=("all",)) -> dict:
    """The `top` costliest op types per run at level all, ours and onnxruntime's, each from its
    own profile trace (the first run, a warm-up, left out), and at each of `levels` the sum of
    each node's fastest call (`fastest_node_ms`). Our sessions run on `libraries` where given
    (the ones the timed level-all session chose), so that the levels compare graphs."""
    import runtime
    from runtime.profile_table import load_trace, profile_table

    tables: dict[str, dict] = {"ours": {}, "onnxruntime": {}}
    for level in sorted(set(levels) | {"all"}, key=lambda name: name != "all"):
        reference = ort_session(path, level, threads, profile=True)
        feeds = feeds_for(reference)
        options = runtime.SessionOptions(
            graph_optimization_level=level, intra_op_num_threads=threads, enable_profiling=True
        )
        if libraries:
            options.kernel_libraries = libraries
        ours = runtime.InferenceSession(str(path), options)
        for name, session in (("ours", ours), ("onnxruntime", reference)):
            for _ in range(runs + 1):
                session.run(None, feeds)
            trace = Path(session.end_profiling())
            events = load_trace(trace)
            trace.unlink()
            fastest = fastest_node_ms(events)
            table = tables[name]
            table.setdefault("fastest_nodes_ms", {})[level] = sum(fastest.values())
            if level == "all":
                summary = profile_table(events, skip_runs=1)
                table["model_run_ms"] = summary.median_model_run_ms
                table["ops"] = [
                    {"op": t.op, "calls": t.calls_per_run, "ms": t.us_per_run / 1000} for t in summary.ops[:top]
                ]
                table["fastest_ops"] = [{"op": op, "ms": ms} for op, ms in list(fastest.items())[:top]]
                table["products_ms"] = sum(ms for op, ms in fastest.items() if op in PRODUCT_OPS)
        del ours, reference
    return tables


# Nodes whose time is the matrix products (or convolutions) the kernel libraries run: the same
# products at every level, so fusion cannot make them cheaper. Attention counts whole (its
# projection and per-head products are most of it), which makes the bound below generous.
PRODUCT_OPS = frozenset({
    "MatMul", "Gemm", "FusedGemm", "FusedMatMul", "Attention", "MultiHeadAttention", "GroupQueryAttention",
    "Conv", "FusedConv", "NhwcFusedConv",
})


def fastest_node_ms(events: list[dict]) -> dict[str, float]:
    """Per op type, the sum over its nodes of each node's fastest kernel time (ms), the first
    (warm-up) call of each node left out; costliest first.

    Why beside the medians: on a machine shared with other work, a run's median is mostly the
    load's, and the load weighs differently on each engine's threads (onnxruntime's spin,
    ours sleep). A node's fastest call over the runs is the nearest a loaded machine comes to
    its quiet cost, so these sums compare the kernels themselves; being each node's best, not
    one run's, they are a floor below any real run."""
    calls: dict[str, list] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            args = event.get("args", {})
            key = args.get("node_index") or event["name"]
            calls.setdefault(key, [args.get("op_name", "?")]).append(event["dur"])
    totals: dict[str, float] = {}
    for op, *durations in calls.values():
        timed = durations[1:] or durations
        totals[op] = totals.get(op, 0.0) + min(timed) / 1000
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def print_profile(name: str, tables: dict, disabled_ms: float | None = None) -> None:
    print(f"{name} — where the time goes at level all (ms per run, from each engine's profile)")
    for engine, table in tables.items():
        ops = ", ".join(f"{row['op']} {row['ms']:.2f} ({row['calls']:g}x)" for row in table["ops"])
        print(f"  {engine:<11} model_run {table['model_run_ms']:.2f}: {ops}")
    print("  each node's fastest call, summed (a floor the load moves least; see fastest_node_ms)")
    for engine, table in tables.items():
        ops = ", ".join(f"{row['op']} {row['ms']:.2f}" for row in table["fastest_ops"])
        floors = table["fastest_nodes_ms"]
        line = f"  {engine:<11} {floors['all']:.2f}: {ops}"
        if "disabled" in floors:
            line += f"; at disabled {floors['disabled']:.2f}, so disabled / all = {floors['disabled'] / floors['all']:.2f}"
        print(line)
    ours = tables.get("ours", {})
    if disabled_ms is not None and ours.get("products_ms"):
        products = ours["products_ms"]
        print(
            f"  our products' floor at all ({', '.join(sorted(PRODUCT_OPS & {r['op'] for r in ours['fastest_ops']}))}):"
            f" {products:.2f} of {ours['fastest_nodes_ms']['all']:.2f} ms; were all else free at all, the fusion"
            f" speedup could reach at most {disabled_ms:.2f} / {products:.2f} = {disabled_ms / products:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--skip-runtime", action="store_true", help="optimizer timings only")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also the N costliest op types")
    parser.add_argument("--levels", nargs="+", default=list(LEVEL_NAMES), choices=list(LEVEL_NAMES),
                        help="executor levels to time (the fusion speedup needs disabled and all)")
    parser.add_argument("--small", action=argparse.BooleanOptionalAction, default=None,
                        help="the small models only (--small) or not at all (--no-small); default: both")
    parser.add_argument("--blocks", type=int, default=20, help="small models: alternating blocks of --runs runs")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    from runtime.kernel_choice import cpu_info, gemm_candidates

    cpu = cpu_info()
    machine = {
        "cpu": cpu.model, "vendor": cpu.vendor, "vector_extensions": cpu.extensions, "cores": os.cpu_count(),
        "threads": args.threads, "onnxruntime": ort.__version__, "gemm_candidates": gemm_candidates(),
    }
    print(
        f"machine: {cpu.model} ({cpu.vendor}), {machine['cores']} cores, {args.threads} threads, "
        f"onnxruntime {ort.__version__}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n  vector extensions: {' '.join(cpu.extensions)}\n"
        f"  GEMM libraries loadable: {', '.join(machine['gemm_candidates'])}; each session times them "
        "on its model's shapes (runtime/kernel_choice.py)"
    )
    from runtime.kernels import openmp

    if openmp.settable():
        print("  MKL's and oneDNN's OpenMP workers (Intel OpenMP): each library races sleeping and spinning 1 ms"
              " between calls (runtime/kernels/openmp.py)")  # fmt: skip
    elif openmp.available():
        print(f"  MKL's and oneDNN's OpenMP workers: KMP_BLOCKTIME={openmp.user_blocktime()} as set, not raced")
    for name in args.models if not args.small else ():
        path = model_path(name)
        result = {"model": name, "machine": machine, "optimizer": bench_optimizer(path, args.threads)}
        opt = result["optimizer"]
        print(f"\n{name} — optimizer (ms)")
        print(f"  {'level':<9} {'load':>8} {'pass':>8} {'save':>8} {'nodes':>6}")
        for level, row in opt["levels"].items():
            print(f"  {level:<9} {row['load_ms']:8.1f} {row['pass_ms']:8.1f} {row['save_ms']:8.1f} {row['nodes_after']:6d}")
        print(
            f"  onnxruntime session_initialization (ORT_ENABLE_ALL): {opt['ort_session_initialization_ms']:.1f} ms;"
            f" ours/ort at all = {opt['ratio_all']:.2f} (target <= 0.5)"
        )
        if not args.skip_runtime:
            executor = result["executor"] = bench_executor(path, args.threads, args.runs, args.levels)
            print(f"{name} — executor median ms ({args.runs} runs)")
            print(
                f"  {'level':<9} {'ours':>9} {'ort':>9} {'ratio':>6} {'our peak MB':>12} {'load avg':>10}"
                "  libraries (gemm, conv)"
            )
            for level, row in executor["levels"].items():
                load = "{:.1f}-{:.1f}".format(*row["load_average"])
                print(
                    f"  {level:<9} {row['ours_ms']:9.2f} {row['ort_ms']:9.2f} {row['ratio']:6.2f}"
                    f" {row['ours_peak_mb']:12.1f} {load:>10}  {row['libraries'].get('gemm')}, {row['libraries'].get('conv')}"
                )
            target = RATIO_TARGETS.get(name)
            if target is not None and "all" in executor["levels"]:
                ratio = executor["levels"]["all"]["ratio"]
                print(f"  ratio at all {ratio:.2f}: {'meets' if ratio <= target else 'MISSES'} the target <= {target}")
            fusion = executor["fusion_speedup"]
            if fusion is not None:
                print(
                    f"  fusion speedup (ours disabled / ours all, timed alternately, both on the libraries chosen at"
                    f" all): {fusion['disabled_ms']:.2f} / {fusion['all_ms']:.2f} = {fusion['speedup']:.2f}"
                    + (" (target >= 1.3)" if name == "bert_base" else "")
                    + " at load average {:.1f}-{:.1f}".format(*fusion["load_average"])
                )
            fusion = executor["ort_fusion_speedup"]
            if fusion is not None:
                print(
                    f"  onnxruntime's own (disabled / all, timed alternately): {fusion['disabled_ms']:.2f} /"
                    f" {fusion['all_ms']:.2f} = {fusion['speedup']:.2f}"
                    + " at load average {:.1f}-{:.1f}".format(*fusion["load_average"])
                )
            choices = executor["kernel_choices"]
            print(f"  chosen at {'all' if 'all' in executor['levels'] else args.levels[-1]} on {cpu.model}: "
                  f"GEMMs on {describe_choice(choices['gemm'])}; convolutions on {describe_choice(choices['conv'])}")
            wait = choices.get("wait")
            if wait is not None:
                print(f"  MKL's and oneDNN's OpenMP workers between calls: {wait['library']} ({wait['reason']})")
            if args.profile:
                result["profile"] = profile_rows(
                    path, args.threads, args.runs, args.profile,
                    libraries=executor["libraries"],
                    levels=[level for level in ("disabled", "all") if level in args.levels],
                )  # fmt: skip
                fusion = executor["fusion_speedup"]
                print_profile(name, result["profile"], fusion["disabled_ms"] if fusion else None)
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    if args.small is not False:
        from bench import small

        small.run(args.levels, args.blocks, args.runs, RESULTS)
    print(f"\nresults in {RESULTS}/")


if __name__ == "__main__":
    main()
