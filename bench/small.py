"""Small models next to onnxruntime: where a run is mostly per-node work, not products (issue 31).

    python -m bench --small [--levels disabled all] [--blocks 20] [--runs 10]

For each small model (bench/models.py's SMALL_MODELS: the tiny BERT and GPT-2, hidden 128, 2
layers), each level and each sequence length (1, 16, 128), one thread each: ours and
onnxruntime (ORT_SEQUENTIAL, same level) timed in alternating blocks (ours `runs` times,
onnxruntime `runs` times, `blocks` times over), and each engine's fastest run kept. On a machine
shared with other work the load moves both engines alike that way, and the fastest run is the
nearest to a quiet machine's. Printed per row: both times, ours / onnxruntime (targets: <= 1.5
at sequence 16, <= 2.0 at sequence 1), the nodes each engine ran (ours: the plan's steps;
onnxruntime: node events in its profile of one run), and each engine's time per node run (µs).
First, our executor's own cost per node (`executor_us_per_node`); `python -m bench.node_floors`
shows a model's kernels node by node. Last, the optimizer's time on the same models next to
onnxruntime's session creation (bench/optimize_time.py).
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.models import SMALL_MODELS, model_path

SEQUENCES = (1, 16, 128)
RATIO_TARGETS = {1: 2.0, 16: 1.5}


def fastest_interleaved(calls, blocks: int, runs: int) -> list[float]:
    """Each call's fastest run in ms, timed in blocks of `runs` runs, the calls taking turns."""
    best = [float("inf")] * len(calls)
    for call in calls:  # warm-up: our first run per feed shape is the measured one
        call()
    for _ in range(blocks):
        for index, call in enumerate(calls):
            for _ in range(runs):
                started = time.perf_counter()
                call()
                best[index] = min(best[index], time.perf_counter() - started)
    return [seconds * 1000 for seconds in best]


def fastest_alternating(first, second, blocks: int, runs: int) -> tuple[float, float]:
    """Each call's fastest run in ms, timed in alternating blocks of `runs` runs."""
    ours, theirs = fastest_interleaved([first, second], blocks, runs)
    return ours, theirs


def ort_nodes_per_run(path: Path, level: str, feeds: dict[str, np.ndarray]) -> int:
    """How many nodes onnxruntime runs at `level`: the node events of one profiled run."""
    from bench.__main__ import ort_session

    session = ort_session(path, level, 1, profile=True)
    session.run(None, feeds)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    return sum(1 for event in events if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"))


def bench_small(levels, blocks: int, runs: int, sequences=SEQUENCES) -> list[dict]:
    import runtime
    from bench.__main__ import feeds_for, ort_session

    rows = []
    for name in SMALL_MODELS:
        path = model_path(name)
        for level in levels:
            reference = ort_session(path, level, 1)
            ours = runtime.InferenceSession(
                str(path), runtime.SessionOptions(graph_optimization_level=level, intra_op_num_threads=1)
            )
            for seq in sequences:
                feeds = feeds_for(reference, seq)
                our_ms, ort_ms = fastest_alternating(
                    partial(ours.run, None, feeds), partial(reference.run, None, feeds), blocks, runs
                )
                our_nodes, ort_nodes = len(ours.plan.steps), ort_nodes_per_run(path, level, feeds)
                rows.append({
                    "model": name, "level": level, "seq": seq, "ours_ms": our_ms, "ort_ms": ort_ms,
                    "ratio": our_ms / ort_ms, "ours_nodes": our_nodes, "ort_nodes": ort_nodes,
                    "ours_us_per_node": our_ms * 1000 / our_nodes, "ort_us_per_node": ort_ms * 1000 / ort_nodes,
                    "load_average": os.getloadavg()[0],
                })  # fmt: skip
                print_row(rows[-1])
    return rows


def print_header(blocks: int, runs: int) -> None:
    print(
        f"\nsmall models, 1 thread, fastest of {blocks} alternating blocks of {runs} runs per engine"
        " (ms; µs per node run = run / nodes run)"
    )
    print(
        f"  {'model':<10} {'level':<9} {'seq':>4} {'ours':>8} {'ort':>8} {'ratio':>6} {'target':>7}"
        f" {'nodes ours/ort':>15} {'µs/node ours':>13} {'µs/node ort':>12} {'load':>5}"
    )


def print_row(row: dict) -> None:
    target = RATIO_TARGETS.get(row["seq"])
    verdict = "" if target is None else ("<= " if row["ratio"] <= target else "MISS ") + f"{target}"
    print(
        f"  {row['model']:<10} {row['level']:<9} {row['seq']:>4} {row['ours_ms']:8.3f} {row['ort_ms']:8.3f}"
        f" {row['ratio']:6.2f} {verdict:>7} {row['ours_nodes']:>7}/{row['ort_nodes']:<7}"
        f" {row['ours_us_per_node']:13.2f} {row['ort_us_per_node']:12.2f} {row['load_average']:5.1f}",
        flush=True,
    )


def executor_us_per_node(nodes: int = 400, runs: int = 2000) -> float:
    """`session.run`'s own cost per node: a chain of Identity nodes, whose kernel returns its
    input, fastest of `runs` runs divided by the node count."""
    from onnx import TensorProto, helper

    import runtime

    chain = [helper.make_node("Identity", [f"v{i}"], [f"v{i + 1}"]) for i in range(nodes)]
    graph = helper.make_graph(
        chain, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"v{nodes}", TensorProto.FLOAT, [4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level="disabled"))
    feeds = {"v0": np.zeros(4, np.float32)}
    session.run(None, feeds)
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, feeds)
        best = min(best, time.perf_counter() - started)
    return best * 1e6 / nodes


def run(levels, blocks: int, runs: int, results: Path) -> None:
    overhead = executor_us_per_node()
    print(f"\nour executor's own cost: {overhead:.3f} µs a node (session.run on 400 Identity nodes, fastest of 2000)")
    print_header(blocks, runs)
    rows = bench_small(levels, blocks, runs)
    from bench import optimize_time

    optimizer_rows = optimize_time.run()  # every level: a session optimizes at whichever it is given
    results.mkdir(parents=True, exist_ok=True)
    summary = {"onnxruntime": ort.__version__, "executor_us_per_node": overhead, "rows": rows, "optimizer": optimizer_rows}
    (results / "small_models.json").write_text(json.dumps(summary, indent=2))
