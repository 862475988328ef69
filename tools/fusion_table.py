"""Print the README's fusion tables: what our optimizer fuses next to what onnxruntime fuses.

    .venv/bin/python tools/fusion_table.py                 # every fixture in tests/models, level extended
    .venv/bin/python tools/fusion_table.py --level all MODEL.onnx ...
    .venv/bin/python tools/fusion_table.py --ort-cases     # ONNX Runtime's own fusion test cases

The fixture table counts fused ops as `fusionwatch run` does (optimizer/fused_ops.py): ours in the
graph our optimizer returns, onnxruntime's in the optimized graph it writes at the matching GraphOptimizationLevel
(service/adapters/engines/onnxruntime.py `count_ops`). `--ort-cases` needs ONNX Runtime's fusion test
models in FUSIONWATCH_ORT_TESTDATA or var/ort_fusion/; they are onnxruntime's
`onnxruntime/test/testdata/transform/fusion/*.onnx`, e.g. from a checkout:
    cp onnxruntime/onnxruntime/test/testdata/transform/fusion/*.onnx var/ort_fusion/
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from optimizer import optimize  # noqa: E402
from optimizer.fused_ops import fused_op_counts  # noqa: E402
from service.adapters.engines.onnxruntime import count_ops, graph_optimization_level  # noqa: E402

MODELS = REPO / "tests" / "models"


def onnxruntime_fusions(path: Path, level: str) -> dict[str, int]:
    """The fused ops onnxruntime's CPU provider makes at the level matching ours."""
    _, value = graph_optimization_level(level)
    with tempfile.TemporaryDirectory(prefix="fusionwatch-table-") as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = value
        options.log_severity_level = 3
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    return count_ops(optimized)[1]


def _short(fusions: dict[str, int]) -> str:
    if not fusions:
        return "—"
    return ", ".join(f"{op.removeprefix('com.microsoft.')} {n}" for op, n in sorted(fusions.items()))


def fixture_table(paths: list[Path], level: str) -> str:
    rows = [f"| fixture | ours ({level}) | onnxruntime {ort.__version__} |", "|---|---|---|"]
    for path in paths:
        ours = fused_op_counts(optimize(str(path), level).report.ops_after)
        try:
            theirs = _short(onnxruntime_fusions(path, level))
        except Exception as error:  # a model onnxruntime cannot load is a row, not the end of the table
            theirs = f"fails: {type(error).__name__}"
        rows.append(f"| `{path.name}` | {_short(ours)} | {theirs} |")
    return "\n".join(rows)


def ort_case_table() -> str:
    from tests.optimizer.ort_fusion_cases import CASES, ort_testdata_dir, run_case

    folder = ort_testdata_dir()
    if folder is None:
        raise SystemExit("ONNX Runtime's fusion test models not found; see --help")
    rows = ["| ONNX Runtime test | model | expected fused ops | ours | onnxruntime's CPU session |",
            "|---|---|---|---|---|"]
    matched = theirs_matched = 0
    for case in CASES:
        expected = {op: n for op, n in case.expected.items() if op in case.fused_ops}
        theirs = _session_fused_ops(folder / case.model, expected)
        theirs_matched += theirs == "matches"
        try:
            _, mismatches = run_case(case, folder)
            verdict = "matches" if not mismatches else "differs: " + ", ".join(
                f"{op} {got} (expected {want})" for op, (got, want) in mismatches.items())
            if case.ours is not None and not mismatches:
                verdict, mismatches = f"differs on purpose: {case.why}", True
        except Exception as error:
            mismatches, verdict = True, f"raises {type(error).__name__}"
        matched += not mismatches
        rows.append(f"| {case.test} | `{case.model}` | {_short(expected)} | {verdict} | {theirs} |")
    rows.append(f"\n{matched} of {len(CASES)} cases give ONNX Runtime's expected counts; onnxruntime's own CPU "
                f"session at ORT_ENABLE_EXTENDED gives the expected fused-op counts in {theirs_matched}.")
    return "\n".join(rows)


def _session_fused_ops(path: Path, expected: dict[str, int]) -> str:
    """Whether onnxruntime's CPU session at ORT_ENABLE_EXTENDED gives the test's fused-op counts.

    ORT's tests run one transformer on nodes no execution provider has claimed; a session runs
    them all for the CPU provider, which refuses some fusions (float16 LayerNorm, say). Only the
    fused ops compare: the other transformers change the rest of the graph."""
    from collections import Counter

    from optimizer.match import op_key
    try:
        with tempfile.TemporaryDirectory(prefix="fusionwatch-table-") as folder:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            options.log_severity_level = 4
            options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            optimized = onnx.load(options.optimized_model_filepath)
    except Exception as error:  # ORT's test models are fragments; some no session loads
        return f"fails: {type(error).__name__}"
    counts = Counter(op_key(node) for node in optimized.graph.node)
    differs = {op: counts[op] for op, n in expected.items() if counts[op] != n}
    return "matches" if not differs else "differs: " + ", ".join(f"{op} {n}" for op, n in differs.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="default: every tests/models/*.onnx")
    parser.add_argument("--level", default="extended")
    parser.add_argument("--ort-cases", action="store_true", help="ONNX Runtime's fusion test cases instead")
    args = parser.parse_args(argv)
    if args.ort_cases:
        print(ort_case_table())
    else:
        print(fixture_table(args.models or sorted(MODELS.glob("*.onnx")), args.level))


if __name__ == "__main__":
    main()
