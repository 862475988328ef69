"""How close correct float16 models come to their numeric check's bound, and how far planted errors go past it.

For each model, as a job measures it (`service.adapters.measure.measure`, one timed run): at each level and
engine, the largest |got - ref| / bound of every graph output over the feed sets the check used (at
`disabled`: onnxruntime against our engine on the timed feeds; at every other level: each engine's fused
graph against its unfused one on the synthesized, left- and right-padded sets), with the output's type
and reduction depth (service/domain/tolerances.py), the worst surviving intermediate tensor, and the
seconds the call took; then the engines' outputs against each other at `all`. 1.0 is where the check
fails. `--plant` scales named initializers (a bias 3% off: 0.97; dropped: 0) and prints the same ratio of
onnxruntime's outputs on the planted model against the unplanted one at ORT_DISABLE_ALL, per feed set:
what a fusion that got that bias wrong would show.

    .venv/bin/python -m bench.narrow_margin /tmp/fp16big/bert12_conv.onnx --sequence-length 32
    .venv/bin/python -m bench.narrow_margin /tmp/fp16big/bert12_conv.onnx --engines onnxruntime --levels disabled \\
        --plant model.encoder.layer.11.output.dense.bias model.encoder.layer.5.intermediate.dense.bias

The models of docs/numerics.md ("16-bit floats") are random-weight transformers exports converted to
float16; the ratios come from wrapping `compare.tensor_error`, which every comparison calls per tensor.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import numpy_helper

import service.adapters.engines.compare as compare
import service.adapters.measure as measure_module
from service.adapters.engines.feeds import synthesized_feed_sets
from service.adapters.engines.precision import TensorTolerances
from service.domain.protocol import Protocol

# tensor -> (worst ratio, graph output?, dtype, depth, producing op), for the comparison running now
_ratios: dict[str, tuple[float, bool, str, int, str]] = {}
_outputs: dict[tuple[str, str], dict[str, np.ndarray]] = {}
_tensor_error = compare.tensor_error
_run_engine = measure_module.run_engine


def _recording_tensor_error(surviving: compare.Surviving, want: Any, got: Any, tolerances: TensorTolerances):
    row = _tensor_error(surviving, want, got, tolerances)
    want, got = np.asarray(want), np.asarray(got)
    ratio = margin(want, got, tolerances.of(surviving.tensor, compare._narrower(want.dtype, got.dtype).name))
    if ratio is not None and ratio >= _ratios.get(surviving.tensor, (-1.0,))[0]:
        depth = tolerances.depths.get(surviving.tensor, 1)
        _ratios[surviving.tensor] = (ratio, surviving.graph_output, want.dtype.name, depth, surviving.reference.op)
    return row


def _recording_run_engine(engine: str, path: Any, level: str, **options: Any):
    result = _run_engine(engine, path, level, **options)
    _outputs[(engine, level)] = result.outputs
    return result


def margin(want: np.ndarray, got: np.ndarray, tolerance: Any) -> float | None:
    """max |got - ref| / (rtol |ref| + atol-term) over the elements both have finite; None for exact types."""
    if tolerance is None or want.shape != got.shape:
        return None
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(want64) & np.isfinite(got64)
    if not finite.any():
        return 0.0
    scale = compare._scale(want64, want.dtype) if tolerance.scaled else 0.0
    bound = tolerance.rtol * np.abs(want64[finite]) + tolerance.bound(scale)
    return float((np.abs(got64[finite] - want64[finite]) / bound).max())


def _print(label: str, seconds: float | None, ok: bool | None) -> None:
    outputs = {name: row for name, row in _ratios.items() if row[1]}
    inner = {name: row for name, row in _ratios.items() if not row[1]}
    text = " ".join(f"{name}={row[0]:.2f} ({row[2]}, depth {row[3]})" for name, row in outputs.items())
    line = f"{label:44} {'' if ok is None else 'ok' if ok else 'FAILS':5} {'' if seconds is None else f'{seconds:6.0f} s'}  {text}"
    if inner:
        name, row = max(inner.items(), key=lambda item: item[1][0])
        line += f" | worst of {len(inner)} intermediates {row[0]:.2f}: {name} ({row[4]}, depth {row[3]})"
    print(line, flush=True)
    _ratios.clear()


def _judged(model: onnx.ModelProto, protocol: Protocol) -> TensorTolerances:
    return TensorTolerances.of_graph(protocol.tolerances(), ir.serde.deserialize_graph(model.graph))


def measure_margins(path: Path, protocol: Protocol, engines: list[str], levels: list[str]) -> None:
    for level in levels:
        for engine in engines:
            started = time.perf_counter()
            measured = measure_module.measure(path, engine, level, protocol)
            _print(f"{path.stem} {level} {engine}", time.perf_counter() - started, measured.numeric_ok)
    judged = _judged(onnx.load(str(path), load_external_data=False), protocol)
    pairs = [(("onnxruntime", "all"), ("fusionwatch", "all")), (("onnxruntime", "all"), ("fusionwatch", "disabled"))]
    for got, want in pairs:
        if got in _outputs and want in _outputs:
            found = measure_module.compare_outputs(_outputs[got], _outputs[want], judged.tolerances, judged.narrowest, judged.depths)
            _print(f"{path.stem} {got[0]} {got[1]} vs {want[0]} {want[1]}", None, found.ok)


def plant_margins(path: Path, protocol: Protocol, initializers: list[str], scales: list[float]) -> None:
    model = onnx.load(str(path))
    judged = _judged(model, protocol)
    names = [output.name for output in model.graph.output]
    feed_sets = synthesized_feed_sets(model, protocol.sequence_length)
    reference = _run_unoptimized(model, names, feed_sets)
    by_name = {initializer.name: initializer for initializer in model.graph.initializer}
    for name in initializers:
        original = numpy_helper.to_array(by_name[name]).copy()
        for scale in scales:
            by_name[name].CopyFrom(numpy_helper.from_array((original * scale).astype(original.dtype), name))
            planted = _run_unoptimized(model, names, feed_sets)
            rows = []
            for feed_set in feed_sets:
                ratios = {
                    output: margin(reference[feed_set][output], planted[feed_set][output], judged.of(output, reference[feed_set][output].dtype.name))
                    for output in names
                }  # fmt: skip
                rows.append(f"{feed_set}: " + " ".join(f"{o}={r:.2f}" for o, r in ratios.items() if r is not None))
            print(f"{path.stem} {name} ×{scale}: " + "; ".join(rows), flush=True)
        by_name[name].CopyFrom(numpy_helper.from_array(original, name))


def _run_unoptimized(
    model: onnx.ModelProto, names: list[str], feed_sets: Mapping[str, Mapping[str, np.ndarray]]
) -> dict[str, dict[str, np.ndarray]]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return {feed_set: dict(zip(names, session.run(names, dict(feeds)), strict=True)) for feed_set, feeds in feed_sets.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--engines", nargs="+", default=["onnxruntime", "fusionwatch"])
    parser.add_argument("--levels", nargs="+", default=["disabled", "all"])
    parser.add_argument("--plant", nargs="*", default=[], help="initializers to scale; only this is done when given")
    parser.add_argument("--plant-scales", nargs="+", type=float, default=[0.97, 0.9, 0.0])
    args = parser.parse_args(argv)
    protocol = Protocol(runs=1, warmup=0, threads=1, sequence_length=args.sequence_length)
    compare.tensor_error = _recording_tensor_error
    measure_module.run_engine = _recording_run_engine
    for path in args.models:
        if args.plant:
            plant_margins(path, protocol, args.plant, args.plant_scales)
        else:
            measure_margins(path, protocol, args.engines, args.levels)


if __name__ == "__main__":
    main()
