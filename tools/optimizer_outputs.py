"""What the optimizer produces, dumped for comparing two versions of its code byte for byte.

    python -m tools.optimizer_outputs OUT.json [--levels basic extended all]

For every model in tests/models and the small benchmark models (bench/models.py SMALL_MODELS), at
each level: the serialized optimized model's digest, every value's inferred type and shape, the
graph hash, the fused ops, each rule's count and the near misses. A speed-up to the optimizer must
leave all of it as it was; run this on both versions (each from its own checkout) and `diff` the
two files. Timings are left out, as they differ run to run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import onnx_ir as ir

from bench.models import SMALL_MODELS, model_path
from optimizer import optimize

TEST_MODELS = Path(__file__).resolve().parent.parent / "tests" / "models"


def models() -> list[tuple[str, Path]]:
    found = [(str(path.relative_to(TEST_MODELS)), path) for path in sorted(TEST_MODELS.rglob("*.onnx"))]
    return found + [(name, model_path(name)) for name in SMALL_MODELS]


def outputs(path: Path, level: str) -> dict:
    model = ir.load(path)
    report = optimize(model, level=level).report
    values = [*model.graph.inputs, *model.graph.initializers.values(),
              *(v for node in model.graph for v in node.outputs), *model.graph.outputs]
    return {
        "model": hashlib.sha256(ir.serde.serialize_model(model).SerializeToString()).hexdigest(),
        "shapes": [[v.name, str(v.type), str(v.shape)] for v in values],
        "graph_hash": report.graph_hash,
        "fusions": report.fusions,
        "ops_after": report.ops_after,
        "rules": {name: stats.fired for name, stats in report.rules.items()},
        "near_misses": [m.__dict__ for m in report.near_misses],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", nargs="+", default=["basic", "extended", "all"])
    args = parser.parse_args()
    dumped = {f"{name} {level}": outputs(path, level) for name, path in models() for level in args.levels}
    args.out.write_text(json.dumps(dumped, indent=1, sort_keys=True))
    print(f"{len(dumped)} runs -> {args.out}")


if __name__ == "__main__":
    main()
