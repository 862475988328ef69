"""Print size, opset, inputs/outputs and op histogram of every .onnx file in a folder.

    .venv/bin/python tools/inventory.py tests/models > tests/models/INVENTORY.txt

The optimizer/runtime engineers use this to see which op patterns each fixture contains
without opening the files.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import onnx


def _shape(value_info: onnx.ValueInfoProto) -> str:
    t = value_info.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) for d in t.shape.dim]
    return f"{value_info.name}: {onnx.TensorProto.DataType.Name(t.elem_type).lower()}[{', '.join(dims)}]"


def op_histogram(model: onnx.ModelProto) -> collections.Counter:
    """op_type counts over the main graph (subgraphs included; domain-prefixed if not ai.onnx)."""
    counts: collections.Counter = collections.Counter()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            counts[key] += 1
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return counts


def describe(path: Path) -> str:
    m = onnx.load(str(path))
    opsets = ", ".join(f"{o.domain or 'ai.onnx'}={o.version}" for o in m.opset_import)
    n_params = sum(int(_prod(t.dims)) for t in m.graph.initializer)
    hist = op_histogram(m)
    lines = [
        f"== {path.name}",
        f"size: {path.stat().st_size} bytes ({path.stat().st_size / 1024:.0f} KiB)",
        f"opset: {opsets}   ir_version: {m.ir_version}   producer: {m.producer_name} {m.producer_version}",
        f"initializers: {len(m.graph.initializer)} ({n_params} elements)   nodes: {sum(hist.values())}",
        "inputs:  " + "; ".join(_shape(v) for v in m.graph.input),
        "outputs: " + "; ".join(_shape(v) for v in m.graph.output),
        "ops:",
    ]
    lines += [f"  {op:<22} {n}" for op, n in sorted(hist.items())]
    return "\n".join(lines)


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent / "tests" / "models")
    a = ap.parse_args(argv)
    print("\n\n".join(describe(p) for p in sorted(a.folder.glob("*.onnx"))))


if __name__ == "__main__":
    main()
