"""Models quantized as users quantize for the CPU, for bench/narrow_margin.py (docs/numerics.md, "Quantized
models"), and the fused ops each engine makes of them at `extended`.

    .venv/bin/python -m bench.quantized_models --out /tmp/quantized            # the small ones
    .venv/bin/python -m bench.quantized_models --out /tmp/quantized --large    # and BERT-base, GPT-2 small
    .venv/bin/python -m bench.narrow_margin /tmp/quantized/bert_tiny_dynamic.onnx --sequence-length 16

`onnxruntime.quantization.quantize_dynamic` (weights QInt8; the dynamo BERT's QUInt8) of bench's tiny BERT
and tiny GPT-2, tests/models' TorchScript Llama and dynamo BERT, and with `--large` of BERT-base (float32,
made by `bench.fp16_models bert --out DIR`, read from `--fp16-dir`) and GPT-2 small; `quantize_static`
in QDQ format of tests/models' ResNet, calibrated on 8 random images. Written to `--out`, not git.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

import numpy as np
import onnx

from bench.models import model_path
from optimizer import optimize

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "models"


def make(out: Path, large: bool, fp16_dir: Path) -> list[Path]:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    out.mkdir(parents=True, exist_ok=True)
    dynamic = {
        "bert_tiny_dynamic": (model_path("bert_tiny"), QuantType.QInt8),
        "gpt2_tiny_dynamic": (model_path("gpt2_tiny"), QuantType.QInt8),
        "llama_torchscript_dynamic": (FIXTURES / "llama_torchscript_opset14.onnx", QuantType.QInt8),
        "bert_dynamo_dynamic_uint8": (FIXTURES / "bert_dynamo_opset20.onnx", QuantType.QUInt8),
    }
    if large:
        dynamic["bert_base_dynamic"] = (fp16_dir / "bert12_fp32.onnx", QuantType.QInt8)
        dynamic["gpt2_small_dynamic"] = (model_path("gpt2_small"), QuantType.QInt8)
    made = []
    for name, (source, weight_type) in dynamic.items():
        quantize_dynamic(source, out / f"{name}.onnx", weight_type=weight_type)
        made.append(out / f"{name}.onnx")
    resnet = FIXTURES / "resnet_tiny_opset17.onnx"
    image = onnx.load(resnet).graph.input[0]
    shape = [d.dim_value or 1 for d in image.type.tensor_type.shape.dim]
    images = iter({image.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)} for _ in range(8))

    class Calibration:  # onnxruntime's CalibrationDataReader protocol
        def get_next(self):
            return next(images, None)

    quantize_static(resnet, out / "resnet_qdq.onnx", Calibration(), quant_format=QuantFormat.QDQ)
    return [*made, out / "resnet_qdq.onnx"]


def fused_at_extended(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(ours, onnxruntime's) com.microsoft op counts of the model optimized at `extended`."""
    import onnxruntime as ort

    ours = collections.Counter(k for k, n in optimize(path, level="extended").report.ops_after.items()
                               for _ in range(n) if k.startswith("com.microsoft."))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory() as scratch:
        options.optimized_model_filepath = str(Path(scratch) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        theirs = collections.Counter(f"{n.domain}.{n.op_type}" for n in onnx.load(options.optimized_model_filepath).graph.node
                                     if n.domain == "com.microsoft")
    return dict(sorted(ours.items())), dict(sorted(theirs.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--large", action="store_true")
    parser.add_argument("--fp16-dir", type=Path, default=Path("/tmp/fp16big"))
    args = parser.parse_args()
    for path in make(args.out, args.large, args.fp16_dir):
        ours, theirs = fused_at_extended(path)
        print(f"{path.name}\n  ours at extended:        {ours}\n  onnxruntime at extended: {theirs}")


if __name__ == "__main__":
    main()
