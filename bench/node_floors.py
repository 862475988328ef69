"""Each node's fastest call, summed per kernel: where a small model's run goes, node by node.

    python -m bench.node_floors bench/cache/bert_tiny.onnx --level disabled --seq 1 [--runs 200]

Runs the session's plan step by step `runs` times on the feeds bench/__main__.py builds, timing
each kernel call alone (one thread), and prints per kernel class its node count, the sum of its
nodes' fastest calls and the fastest call per node. The fastest of many calls is what a loaded
machine moves least, so these floors compare kernels across changes; they leave out the
executor's own work between calls (`python -m bench --small` prints that per node).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path


def node_floors(path: Path, level: str, seq: int, runs: int) -> list[tuple[str, int, float]]:
    """(kernel class, nodes, summed fastest µs), costliest first."""
    import runtime
    from bench.__main__ import feeds_for, ort_session

    feeds = feeds_for(ort_session(path, level, 1), seq)
    session = runtime.InferenceSession(
        str(path), runtime.SessionOptions(graph_optimization_level=level, intra_op_num_threads=1)
    )
    session.run(None, feeds)
    plan = session.plan
    fastest = [float("inf")] * len(plan.steps)
    clock = time.perf_counter_ns
    for _ in range(runs):
        values = plan.template.copy()
        for name, value in feeds.items():
            values[plan.input_slots[name]] = value
        for index, step in enumerate(plan.steps):
            run = plan.loop[index][0]
            args = [values[slot] for slot in step.inputs]
            started = clock()
            results = run(*args)
            fastest[index] = min(fastest[index], clock() - started)
            for slot, value in zip(step.outputs, results, strict=False):
                values[slot] = value
            for slot in step.frees:
                values[slot] = None
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for step, ns in zip(plan.steps, fastest, strict=True):
        entry = totals[type(step.kernel).__name__]
        entry[0] += 1
        entry[1] += ns / 1000
    return sorted(((name, count, us) for name, (count, us) in totals.items()), key=lambda row: -row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--level", default="all")
    parser.add_argument("--seq", type=int, default=1)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    rows = node_floors(args.model, args.level, args.seq, args.runs)
    total = sum(us for _, _, us in rows)
    nodes = sum(count for _, count, _ in rows)
    print(f"{args.model.name} at {args.level}, sequence {args.seq}: {nodes} nodes, floors sum to {total:.1f} µs")
    for name, count, us in rows:
        print(f"  {name:<32} {count:4d} nodes {us:9.1f} µs  {us / count:7.2f} µs a node")


if __name__ == "__main__":
    main()
