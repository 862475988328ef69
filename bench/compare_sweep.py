"""The numeric check over a folder of exports, both engines: looks for false alarms and crashes. Not a test.

For each model: `check_numerics` (service/adapters/engines/numerics.py) at the level on the synthesized feed
sets, printing per engine the time, per feed set (status, surviving tensors, diverging, ok), and the
worst feed set's first divergence where there is one.

    .venv/bin/python -m bench.compare_sweep ../zoo/var/zoo gpt_neox_dynamo opt_torchscript --level all
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import onnx

from service.adapters.engines import EngineError
from service.adapters.engines.feeds import synthesized_feed_sets
from service.adapters.engines.numerics import check_numerics
from service.domain.protocol import Protocol


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("models", nargs="+", help="file names without .onnx")
    parser.add_argument("--level", default="all")
    parser.add_argument("--sequence-length", type=int, default=16)
    args = parser.parse_args(argv)
    for name in args.models:
        path = args.folder / f"{name}.onnx"
        sets = synthesized_feed_sets(onnx.load(str(path), load_external_data=False), args.sequence_length)
        for engine in ("fusionwatch", "onnxruntime"):
            started = time.perf_counter()
            try:
                check = check_numerics(engine, path, args.level, sets, Protocol().tolerances(), threads=1)
            except EngineError as error:
                print(name, engine, "ERROR", str(error)[:300], flush=True)
                continue
            found = [(c.feed_set, c.status, c.tensors, c.diverging, c.ok) for c in check.comparisons]
            worst = check.worst
            first = f"{worst.first.tensor} {worst.first.rule} {worst.first.max_abs:.2g} {worst.first.nonfinite}" if worst and worst.first else ""
            print(name, engine, f"{time.perf_counter() - started:.0f}s", found, first, flush=True)


if __name__ == "__main__":
    main()
