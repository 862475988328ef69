"""Every ONNX model in a folder through our optimizer and executor, next to onnxruntime: which crash,
which we refuse that onnxruntime runs, and which compute something else.

    .venv/bin/python tools/model_scan.py FOLDER [--levels disabled all] [--timeout 30] [--json scan.json]

Each model is optimized at basic, extended and all, then run by our InferenceSession at each of
--levels and by onnxruntime (every optimization off) on the same seeded inputs
(service/adapters/engines/feeds.py). A model lands in one row of the summary:

  crash            ours raised something other than a clean error (a bug: fix it first)
  ours refuses     ours refused it cleanly (load, unsupported op, plan, feed, node error) and onnxruntime ran it
  mismatch         both ran, and an output differs beyond fp32's tolerance (rtol 1e-3, atol 1e-4; a few
                   ulps for float16; exact for integers); the first differing node is named, from both
                   engines' intermediate values
  fused alike      ours at an optimized level differs from onnxruntime's unoptimized graph as onnxruntime's
                   own fusion at that level does (both agree with each other)
  match            both ran and agree
  both refuse      onnxruntime refused it too (or no inputs could be made for it)
  timeout          over --timeout seconds

A mismatch is often not a bug: float16 arithmetic, random ops, a quantized value one step apart, or
fp32 rounding amplified by a softmax over logits in the thousands. Compare against float64 before
blaming a kernel.

A corpus worth scanning: ONNX Runtime's own test models (680 of them, all small), from a snapshot
of its repository (the library's fetch tool: github:tianleiwu/onnxruntime):
    git -C REPO ls-tree -r HEAD onnxruntime/test/testdata | grep '\\.onnx$' | while read _ _ obj path; do
        git -C REPO cat-file blob $obj > var/ort_testdata/$(echo $path | tr / _); done
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import warnings
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import runtime  # noqa: E402
from optimizer import ModelLoadError, optimize  # noqa: E402
from runtime.errors import GraphPlanError, InvalidFeedError, NodeExecutionError, UnsupportedModelError  # noqa: E402
from service.adapters.engines.feeds import FeedError, make_feeds  # noqa: E402
from service.adapters.engines.onnxruntime import graph_optimization_level  # noqa: E402

CLEAN_ERRORS = (ModelLoadError, UnsupportedModelError, GraphPlanError, InvalidFeedError, NodeExecutionError, FeedError)
ROWS = ("crash", "ours refuses", "mismatch", "fused alike", "match", "both refuse", "timeout")


class _Timeout(Exception):
    pass


def _alarm(*_) -> None:
    raise _Timeout


def _onnxruntime(data: bytes, feeds: dict, outputs: list[str] | None = None, level: str = "disabled") -> list:
    options = ort.SessionOptions()
    options.graph_optimization_level = graph_optimization_level(level)[1]
    options.log_severity_level = 4
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(outputs, feeds)


def _differs(ours, theirs) -> str | None:
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.shape != b.shape:
        return f"shape {list(a.shape)} against {list(b.shape)}"
    rtol, atol = (4e-3, 1e-3) if a.dtype == np.float16 else (1e-3, 1e-4)  # float16: a few ulps
    if a.dtype.kind in "fc" and not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
        return f"{a.dtype} max difference {np.nanmax(np.abs(a.astype(np.float64) - b)):.3g}"
    if a.dtype.kind in "iub" and not np.array_equal(a, b):
        return f"{a.dtype} {int((a != b).sum())} of {a.size} values differ"
    return None


def _first_differing_node(model: onnx.ModelProto, feeds: dict, level: str) -> str:
    """Both engines with every node's outputs exposed, compared in node order."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    shown = {o.name for o in exposed.graph.output}
    names = [name for node in exposed.graph.node for name in node.output if name]
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in shown)
    data = exposed.SerializeToString()
    every = [o.name for o in exposed.graph.output]
    try:
        theirs = dict(zip(every, _onnxruntime(data, feeds), strict=True))
        session = runtime.InferenceSession(data, runtime.SessionOptions(graph_optimization_level=level))
        ours = dict(zip(every, session.run(None, feeds), strict=True))
    except Exception as error:  # noqa: BLE001 - a diagnosis that cannot be made says why
        return f"(intermediate values unavailable: {type(error).__name__})"
    producers = {name: node for node in model.graph.node for name in node.output}
    for name in names:
        why = _differs(ours[name], theirs[name])
        if why is not None:
            node = producers[name]
            return f"first at {node.op_type} '{node.name}' output '{name}': {why}"
    return "(no intermediate value differs)"


def scan_one(path: Path, levels: list[str]) -> tuple[str, str]:
    data = path.read_bytes()
    try:
        for level in ("basic", "extended", "all"):
            optimize(data, level=level)
    except CLEAN_ERRORS:
        pass  # the run below says the same, and whether onnxruntime minds
    except Exception as error:  # noqa: BLE001 - a crash is what this tool looks for
        return "crash", f"optimize: {type(error).__name__}: {str(error)[:200]}"
    try:
        model = onnx.load_from_string(data)
        feeds = make_feeds(model, sequence_length=8)
        expected = _onnxruntime(data, feeds)
    except Exception as error:  # noqa: BLE001 - onnxruntime's refusals are many kinds
        return "both refuse", f"{type(error).__name__}: {str(error)[:120]}"
    for level in levels:
        try:
            session = runtime.InferenceSession(data, runtime.SessionOptions(graph_optimization_level=level))
            actual = session.run(None, feeds)
        except CLEAN_ERRORS as error:
            return "ours refuses", f"[{level}] {type(error).__name__}: {str(error)[:200]}"
        except _Timeout:
            raise
        except Exception as error:  # noqa: BLE001
            return "crash", f"[{level}] {type(error).__name__}: {str(error)[:200]}"
        whys = [why for a, b in zip(actual, expected, strict=True) if (why := _differs(a, b))]
        if whys and level != "disabled":
            fused = _onnxruntime(data, feeds, level=level)
            if not any(_differs(a, b) for a, b in zip(actual, fused, strict=True)):
                return "fused alike", f"[{level}] {whys[0]} from onnxruntime unoptimized, as onnxruntime's own at {level}"
        if whys:
            return "mismatch", f"[{level}] {whys[0]}; {_first_differing_node(model, feeds, level)}"
    return "match", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--levels", nargs="+", default=["disabled", "all"])
    parser.add_argument("--timeout", type=int, default=30, help="seconds per model")
    parser.add_argument("--json", type=Path, help="write every model's row and reason here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # numpy's overflow warnings on random weights; the rows say what matters
    logging.disable(logging.WARNING)
    signal.signal(signal.SIGALRM, _alarm)
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in sorted(args.folder.glob("*.onnx")):
        signal.alarm(args.timeout)
        try:
            row, why = scan_one(path, args.levels)
        except _Timeout:
            row, why = "timeout", f"over {args.timeout} s"
        finally:
            signal.alarm(0)
        found[row].append((path.name, why))
    print("  ".join(f"{row}: {len(found[row])}" for row in ROWS))
    for row in ("crash", "ours refuses", "mismatch", "fused alike", "timeout"):
        if found[row]:
            print(f"\n{row}:")
            for name, why in found[row]:
                print(f"  {name}: {why}")
    if args.json:
        args.json.write_text(json.dumps({row: dict(found[row]) for row in ROWS}, indent=1))


if __name__ == "__main__":
    main()
