"""Does the `layout` level (NhwcTransformer + runtime/kernels/conv_nhwc.py) pay on our executor?

Prints ms per run (median and best of --runs, after one warm-up run) of ResNet-50 (224x224,
batch 1, bench/cache/resnet50.onnx) and the tiny ResNet fixture through our
runtime.InferenceSession at level `extended` (NCHW Conv/FusedConv) and `layout` (NHWC), the
two runs interleaved so a noisy machine hurts both alike. One BLAS thread by default.

    .venv/bin/python bench/layout.py [--runs 10] [--threads 1]

Measured on the 2-core shared dev VM (one thread; channels-last convolutions on oneDNN, NCHW
ones on im2col + OpenBLAS; 30 interleaved runs), ms per run:
                 extended median / best     layout median / best     layout / extended (median)
    resnet50       106.56 /  95.04            71.17 / 61.69            0.67  (best-of: 0.65)
    resnet_tiny      0.24 /   0.20             0.24 /  0.22            0.99  (break-even on 9 tiny convs)
Before oneDNN (im2col on both sides) resnet50 measured 0.84.
Per layer before oneDNN (bench numbers from the same machine, NCHW Conv kernel -> NHWC im2col, ms): 3x3
64->64 @56x56 2.57 -> 2.34; 1x1 64->256 @56x56 1.02 -> 1.02; 1x1 stride 2 256->512 2.16 -> 1.58;
depthwise 3x3 x64 @56x56 0.89 -> 0.82; grouped (8 groups) 1.29 -> 2.30 (why grouped convs stay
NCHW). One edge transpose of a 64x56x56 map costs ~0.07 ms, of a 256x56x56 one ~1 ms: a lone
Conv does not win that back, hence MIN_CONVOLUTIONS = 2 in optimizer/fusions/nhwc_conv_layout.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "resnet50": (ROOT / "bench" / "cache" / "resnet50.onnx", (1, 3, 224, 224)),
    "resnet_tiny": (ROOT / "tests" / "models" / "resnet_tiny_opset17.onnx", (1, 3, 32, 32)),
}
LEVELS = ("extended", "layout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)  # before numpy loads its BLAS

    sys.path.insert(0, str(ROOT))
    import numpy as np

    from runtime import InferenceSession, SessionOptions

    for name in args.models:
        path, shape = MODELS[name]
        if not path.is_file():
            print(f"{name}: {path} is missing (python -m bench exports it)")
            continue
        feed_name = None
        sessions = {}
        for level in LEVELS:
            sessions[level] = InferenceSession(str(path), SessionOptions(graph_optimization_level=level))
            feed_name = sessions[level].get_inputs()[0].name
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        outputs = {level: session.run(None, {feed_name: x}) for level, session in sessions.items()}  # warm-up
        for a, b in zip(outputs["extended"], outputs["layout"], strict=True):
            # Random-weight ResNet-50 activations reach ~3e4; fp32 summation order alone moves
            # them by ~1e-6 of that, at either level against onnxruntime, so atol scales with them.
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5 * float(np.abs(a).max()))
        samples: dict[str, list[float]] = {level: [] for level in LEVELS}
        for _ in range(args.runs):
            for level, session in sessions.items():
                start = time.perf_counter()
                session.run(None, {feed_name: x})
                samples[level].append((time.perf_counter() - start) * 1e3)
        line = [f"{name:12}"]
        for level in LEVELS:
            line.append(
                f"{level} median {statistics.median(samples[level]):8.2f} ms  best {min(samples[level]):8.2f} ms"
            )
        ratio = statistics.median(samples["layout"]) / statistics.median(samples["extended"])
        line.append(f"layout/extended {ratio:.3f}")
        print("   ".join(line))
        ops = sessions["layout"].optimize_result.report.ops_after
        print(f"{'':12} layout ops: {ops}")


if __name__ == "__main__":
    main()
