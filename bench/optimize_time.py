"""Our optimizer's time on the small models next to onnxruntime's whole session creation (issue 31).

    python -m bench.optimize_time [--models bert_tiny gpt2_tiny] [--levels disabled all] [--repeats 7]
                                  [--rules 6]

Per model (bench/models.py's SMALL_MODELS by default) and level, each the fastest of `repeats`,
taken in turns so that a shared machine's load weighs on both alike:
  - ours: `optimizer.optimize` on a freshly loaded `ir.Model` (loading excluded: a session
    loads once, whatever it then optimizes);
  - onnxruntime: `InferenceSession(path)` at the same level, one thread: reading the file,
    optimizing, and preparing its kernels, everything before the first run;
and ours / onnxruntime (target <= 1.0, the issue's "within onnxruntime's session time").
With --rules N, where our fastest run went: its N costliest rules (each rule's time summed over
the rounds, from optimize()'s report; a rule's time includes the shape probes it asks for) and
what the report's pass time holds outside the rules (the first shape inference, the final sort
and unused-node sweep).
Also printed by `python -m bench --small`, after the executor's rows.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import onnx_ir as ir

from bench.models import SMALL_MODELS, model_path
from optimizer import LEVEL_NAMES, optimize


def optimize_ms(path: Path, level: str) -> tuple[float, dict]:
    """ms of one optimize() on a freshly loaded model, and its report's rule times."""
    model = ir.load(path)
    started = time.perf_counter()
    report = optimize(model, level=level).report
    elapsed = (time.perf_counter() - started) * 1000
    rules = {name: stats.ms for name, stats in report.rules.items()}
    return elapsed, {"pass_ms": report.total_ms, "rules_ms": rules}


def ort_session_ms(path: Path, level: str) -> float:
    from bench.__main__ import ort_session

    started = time.perf_counter()
    ort_session(path, level, 1)
    return (time.perf_counter() - started) * 1000


def measure(models, levels, repeats: int, rules: int = 0) -> list[dict]:
    rows = []
    for name in models:
        path = model_path(name)
        for level in levels:
            ours, theirs = [], []
            for _ in range(repeats):
                ours.append(optimize_ms(path, level))
                theirs.append(ort_session_ms(path, level))
            fastest, report = min(ours, key=lambda run: run[0])
            rows.append({
                "model": name, "level": level, "optimize_ms": fastest, "ort_session_ms": min(theirs),
                "ratio": fastest / min(theirs), "load_average": os.getloadavg()[0], **report,
            })  # fmt: skip
            print_row(rows[-1])
            if rules:
                print_rules(rows[-1], rules)
    return rows


def print_header(repeats: int) -> None:
    from service.adapters.machine import describe_machine

    print(
        f"\noptimizer time on the small models, fastest of {repeats} (ms; CPU {describe_machine()['cpu']}):"
        " our optimize() on a loaded model, onnxruntime's InferenceSession(path) at the same level, one thread"
    )
    print(f"  {'model':<10} {'level':<9} {'optimize':>9} {'ort session':>12} {'ratio':>6} {'target':>7} {'load':>5}")


def print_row(row: dict) -> None:
    verdict = ("<= " if row["ratio"] <= 1.0 else "MISS ") + "1.0"
    print(
        f"  {row['model']:<10} {row['level']:<9} {row['optimize_ms']:9.1f} {row['ort_session_ms']:12.1f}"
        f" {row['ratio']:6.2f} {verdict:>7} {row['load_average']:5.1f}",
        flush=True,
    )


def print_rules(row: dict, count: int) -> None:
    costliest = sorted(row["rules_ms"].items(), key=lambda item: -item[1])[:count]
    outside = row["pass_ms"] - sum(row["rules_ms"].values())
    rules = ", ".join(f"{name} {ms:.1f}" for name, ms in costliest if ms >= 0.05)
    print(f"      pass {row['pass_ms']:.1f} ms: outside the rules {outside:.1f}" + (f"; {rules}" if rules else ""))


def run(levels=LEVEL_NAMES, repeats: int = 7, models=tuple(SMALL_MODELS), rules: int = 0) -> list[dict]:
    print_header(repeats)
    return measure(models, levels, repeats, rules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(SMALL_MODELS), choices=list(SMALL_MODELS))
    parser.add_argument("--levels", nargs="+", default=list(LEVEL_NAMES), choices=list(LEVEL_NAMES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rules", type=int, default=0, metavar="N", help="also the N costliest rules per row")
    args = parser.parse_args()
    run(args.levels, args.repeats, args.models, args.rules)


if __name__ == "__main__":
    main()
