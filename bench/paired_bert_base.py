"""`python -m bench.paired_bert_base`: machine seconds to a paired verdict on a real BERT-base commit pair.

The tiny fixtures run in a fraction of a millisecond, so their paired blocks are a few milliseconds
and their seconds to a decision say little about a real model. This exports BERT-base (BertConfig()'s
sizes: 12 layers, hidden 768, 12 heads, vocabulary 30,522; random weights, nothing downloaded) twice
with the TorchScript exporter, dynamic batch and sequence: the baseline at opset 17, the candidate at
opset 14 (a commit that changed the export), into a temporary directory, and times them once with
`service.adapters.paired_measure.measure_paired` as a worker would: engine fusionwatch, level
extended, sequence length 128, 1 thread, the protocol's warm-up and paired_max_seconds. It prints
the machine seconds of the timed blocks, the pairs, the verdict and why measuring stopped, and the
wall time including opening both sessions. `--candidate slower` makes the candidate the opset-17 export
plus a chain of `--products` 768×768 products on a [sequence, 768] activation (fed from input_ids, so no
optimizer folds it): a regression of known cause, to time a regressed verdict, whose check of the next
as many pairs and side-by-side kernel profile cost more than a "within noise".

Needs torch and transformers (`make install-export`); about 2 GB of memory and one core for a few
minutes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from service.adapters.paired_measure import measure_paired
from service.domain.protocol import Protocol

BERT_BASE = {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "vocab": 30522}  # BertConfig()'s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="fusionwatch")
    parser.add_argument("--level", default="extended")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--candidate", choices=("opset14", "slower"), default="opset14")
    parser.add_argument("--products", type=int, default=8)
    args = parser.parse_args()
    from tools.make_fixtures import export_hf  # torch and transformers: only this script needs them

    with tempfile.TemporaryDirectory(prefix="paired-bert-base-") as tmp:
        files = {}
        sides = (("baseline", 17),) if args.candidate == "slower" else (("baseline", 17), ("candidate", 14))
        for side, opset in sides:
            started = time.perf_counter()
            files[side] = export_hf("bert", "torchscript", Path(tmp) / f"bert_base_opset{opset}.onnx",
                                    seq=args.sequence_length, opset=opset, verify=False, **BERT_BASE)
            print(f"exported {files[side].name} ({files[side].stat().st_size / 1e6:.0f} MB) "
                  f"in {time.perf_counter() - started:.0f} s", flush=True)
        if args.candidate == "slower":
            files["candidate"] = with_products(files["baseline"], Path(tmp) / "bert_base_slower.onnx",
                                               args.products, args.sequence_length)
        protocol = Protocol(sequence_length=args.sequence_length, threads=1)
        started = time.perf_counter()
        timing = measure_paired(files["baseline"], files["candidate"], args.engine, args.level, protocol)
        wall = time.perf_counter() - started
    v = timing.verdict
    change = "opset 17 -> 14" if args.candidate == "opset14" else f"opset 17 -> the same + {args.products} products"
    kernels = "" if not timing.kernels else "; kernels profiled side by side, MatMul " + " -> ".join(
        f"{next((k['ms'] for k in timing.kernels[side] if k['op'] == 'MatMul'), float('nan')):.1f} ms"
        for side in ("baseline", "candidate"))
    print(f"BERT-base {change}, {args.engine} {args.level}, sequence length {args.sequence_length}, "
          f"1 thread: machine_s {timing.machine_s:.1f}, pairs {v.pairs}, block runs {timing.block_runs}, "
          f"verdict {v.word} (ratio {v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}]), stopped: {timing.stopped}; "
          f"wall {wall:.1f} s with opening and warming both sessions{kernels}")


def with_products(source: Path, out: Path, products: int, sequence: int) -> Path:
    """`source` plus an extra output: a chain of 768×768 products on a [sequence, 768] activation made
    from input_ids, the same graph with more work that no optimizer removes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(source)
    graph = model.graph
    rng = np.random.default_rng(0)
    graph.initializer.append(numpy_helper.from_array((rng.standard_normal((768, 768)) / 28).astype(np.float32), "extra_w"))
    graph.initializer.append(numpy_helper.from_array(np.ones((sequence, 768), np.float32), "extra_ones"))
    graph.node.extend([
        helper.make_node("Cast", ["input_ids"], ["extra_ids"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["extra_ids"], ["extra_scale"], keepdims=0),
        helper.make_node("Mul", ["extra_ones", "extra_scale"], ["extra_0"]),
    ])
    for i in range(products):
        graph.node.append(helper.make_node("MatMul", [f"extra_{i}", "extra_w"], [f"extra_{i + 1}"]))
    graph.output.append(helper.make_tensor_value_info(f"extra_{products}", TensorProto.FLOAT, [sequence, 768]))
    onnx.save(model, out)
    return out


if __name__ == "__main__":
    main()
