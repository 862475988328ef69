"""What the fusions save, in each engine: a model at `disabled`, `extended` and `all`, ours and
onnxruntime, in one process.

    python -m bench.level_savings [--seq 32] [--blocks 20] [--runs 10] [MODEL.onnx ...]

A fusion-regression detector is credible only where its engine's fused graph is cheaper than the
unfused one by about what onnxruntime's is (a lost fusion must cost something to be seen). For each
model (default: the DistilBERT of that report, bench/models.py's `distilbert_small`, and the tiny
BERT and GPT-2 fixtures of tests/models), six sessions, one thread each: ours and onnxruntime
(ORT_SEQUENTIAL) at each level, timed in interleaved blocks (each session `runs` times in turn,
`blocks` times over), each session's fastest run kept, so that the load of a shared machine falls
on all six alike. Printed per model: the six times (ms), each engine's `extended` / `disabled` and
`all` / `disabled`, and the largest output difference of ours from onnxruntime at each level.
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import numpy as np

from bench.small import fastest_interleaved

LEVELS = ("disabled", "extended", "all")
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "models"
DEFAULT_MODELS = ("distilbert_small", FIXTURES / "bert_torchscript_opset17.onnx", FIXTURES / "gpt2_torchscript_opset14.onnx")


def measure(path: Path, seq: int, blocks: int, runs: int) -> dict:
    import runtime
    from bench.__main__ import feeds_for, ort_session

    calls, errors, feeds = [], {}, None
    for level in LEVELS:
        reference = ort_session(path, level, 1)
        feeds = feeds or feeds_for(reference, seq)
        ours = runtime.InferenceSession(
            str(path), runtime.SessionOptions(graph_optimization_level=level, intra_op_num_threads=1)
        )
        pairs = zip(ours.run(None, feeds), reference.run(None, feeds), strict=True)
        errors[level] = max(float(np.max(np.abs(mine - theirs))) for mine, theirs in pairs)
        calls += [partial(ours.run, None, feeds), partial(reference.run, None, feeds)]
    load = os.getloadavg()[0]
    times = fastest_interleaved(calls, blocks, runs)
    row = {"model": path.stem, "seq": seq, "load_average": load}
    for index, level in enumerate(LEVELS):
        row[f"ours_{level}_ms"], row[f"ort_{level}_ms"] = times[2 * index], times[2 * index + 1]
        row[f"max_abs_error_{level}"] = errors[level]
    for engine in ("ours", "ort"):
        for level in LEVELS[1:]:
            row[f"{engine}_{level}_over_disabled"] = row[f"{engine}_{level}_ms"] / row[f"{engine}_disabled_ms"]
    return row


def print_row(row: dict) -> None:
    times = "  ".join(f"{row[f'ours_{lv}_ms']:6.3f} / {row[f'ort_{lv}_ms']:6.3f}" for lv in LEVELS)
    ratios = "  ".join(
        f"{row[f'ours_{lv}_over_disabled']:5.3f} / {row[f'ort_{lv}_over_disabled']:5.3f}" for lv in LEVELS[1:]
    )
    worst = max(row[f"max_abs_error_{lv}"] for lv in LEVELS)
    print(f"  {row['model']:<28} {row['seq']:>4}  {times}  {ratios}  {worst:8.1e} {row['load_average']:5.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="ONNX files (default: see above)")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    from bench.models import model_path

    paths = args.models or [model_path(m) if isinstance(m, str) else m for m in DEFAULT_MODELS]
    print(
        f"ours / onnxruntime, ms, 1 thread, fastest of {args.blocks} interleaved blocks of {args.runs} runs;"
        " then extended / disabled and all / disabled, ours / onnxruntime; max |ours - onnxruntime|; load"
    )
    print(f"  {'model':<28} {'seq':>4}  {'disabled':^15}  {'extended':^15}  {'all':^15}  {'ext/dis':^13}  {'all/dis':^13}")
    for path in paths:
        print_row(measure(path, args.seq, args.blocks, args.runs))


if __name__ == "__main__":
    main()
