"""Exports with a key/value past through our optimizer and executor, next to onnxruntime, on the
inputs where padding and the cache decide the answer (docs/conformance.md, "Optimum exports, held out").

    .venv/bin/python tools/optimum_check.py /tmp/heldout/*/*.onnx [--json results.json]

tools/model_scan.py makes one feed set per model (a past of 4, sequence 8). Here the service's feeds
(service/adapters/engines/feeds.py, which evaluates the dimension names Optimum writes as
expressions of the batch, sequence, past and encoder lengths) are made for each case, with an
encoder length (6) other than the sequence's: padded on the right, on the left, a row all padding, batch 1, one
position, and, with a past of 5, one and three new positions left-padded, one with batch 1 and
four right-padded. position_ids are as generate() makes them (cumsum of the mask - 1, 1 on
padding); use_cache_branch (a merged decoder's If) is true exactly when there is a past.

Each model is optimized at basic, extended and all (the fused counts are printed), then run by our
InferenceSession at disabled, basic, extended and all and by onnxruntime with every optimization
off. fp32 rtol 1e-3, atol 1e-4 (float16 4e-3, 1e-3, as model_scan); NaN or inf where onnxruntime
has a finite number is a mismatch. No output position is excluded.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import runtime  # noqa: E402
from optimizer import optimize  # noqa: E402
from service.adapters.engines.feeds import Padding, make_feeds  # noqa: E402

LEVELS = ("disabled", "basic", "extended", "all")


def feeds_for(model: onnx.ModelProto, batch: int, seq: int, past: int = 0, encoder: int = 6,
              pad: tuple[str, int, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """The service's feeds (service/adapters/engines/feeds.py: dimension names sized as expressions of
    the batch, sequence, past and encoder lengths, position_ids as generate() makes them,
    use_cache_branch true exactly when there is a past) for one case. pad: ("left" | "right", row,
    how many) zeros in the attention mask. Token types are half ones here, so a model's second
    token-type row is read too."""
    padding = Padding(*pad) if pad is not None else None
    feeds = make_feeds(model, seq, seed, batch, past_length=past, encoder_length=encoder, padding=padding)
    for name, types in feeds.items():
        if "type" in name:
            types[..., types.shape[-1] // 2:] = 1
    return feeds


def cases_for(model: onnx.ModelProto) -> dict[str, dict[str, np.ndarray]]:
    names = {v.name for v in model.graph.input}
    cases = {}
    if any("mask" in name for name in names):
        cases["right_padded"] = feeds_for(model, 2, 8, pad=("right", 1, 3))
        cases["left_padded"] = feeds_for(model, 2, 8, pad=("left", 0, 3))
        cases["masked_row"] = feeds_for(model, 2, 8, pad=("left", 1, 8))
    else:
        cases["batch2"] = feeds_for(model, 2, 8)
    cases["batch1"] = feeds_for(model, 1, 8)
    cases["seq1"] = feeds_for(model, 2, 1)
    if any("past_key_values" in name for name in names):
        cases["past5_seq1_left_padded"] = feeds_for(model, 2, 1, past=5, pad=("left", 0, 2))
        cases["past5_seq3_left_padded"] = feeds_for(model, 2, 3, past=5, pad=("left", 0, 2))
        cases["past5_seq1_batch1"] = feeds_for(model, 1, 1, past=5)
        cases["past5_seq4_right_padded"] = feeds_for(model, 2, 4, past=5, pad=("right", 1, 2))
    return cases


def differs(got: np.ndarray, want: np.ndarray) -> str | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)} against {list(want.shape)}"
    if want.dtype.kind in "iub":
        return None if np.array_equal(got, want) else f"{int((got != want).sum())} values differ"
    invented = ~np.isfinite(got) & np.isfinite(want)
    if invented.any():
        return f"{int(invented.sum())} NaN/inf where onnxruntime is finite"
    rtol, atol = (4e-3, 1e-3) if want.dtype == np.float16 else (1e-3, 1e-4)
    if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        return f"max difference {np.nanmax(np.abs(got.astype(np.float64) - want)):.3g}"
    return None


def check(path: Path) -> dict:
    model = onnx.load(path)
    found: dict = {"model": str(path), "fused": {}, "cases": {}}
    for level in ("basic", "extended", "all"):
        try:
            found["fused"][level] = optimize(model, level).report.fusions
        except Exception as error:  # noqa: BLE001 - a crash is what this tool looks for
            found["fused"][level] = f"crash: {type(error).__name__}: {error}"
    sessions: dict = {}
    for level in LEVELS:
        try:
            sessions[level] = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
        except Exception as error:  # noqa: BLE001
            sessions[level] = f"session: {type(error).__name__}: {error}"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    reference = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for case, feeds in cases_for(model).items():
        want = reference.run(None, feeds)
        results = {}
        for level, session in sessions.items():
            if isinstance(session, str):
                results[level] = session
                continue
            try:
                got = session.run(None, feeds)
            except Exception as error:  # noqa: BLE001
                results[level] = f"run: {type(error).__name__}: {error}"
                continue
            whys = [f"{o.name}: {why}" for o, g, w in zip(reference.get_outputs(), got, want, strict=True)
                    if (why := differs(g, w))]
            results[level] = "; ".join(whys) or "match"
        found["cases"][case] = results
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="write every model's counts and results here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    everything = []
    for path in args.models:
        found = check(path)
        everything.append(found)
        print(f"{path}\n  extended: {found['fused']['extended']}\n  all: {found['fused']['all']}")
        for case, results in found["cases"].items():
            wrong = {level: why for level, why in results.items() if why != "match"}
            print(f"  {case}: {'match at every level' if not wrong else wrong}")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
