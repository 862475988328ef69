"""Speed sanity check for our Conv kernel against onnxruntime, one thread each.

The layer is ResNet-50's most common 3x3 convolution (conv2_x: 64 -> 64 channels on 56x56,
pad 1, with bias), plus the 1x1 and depthwise shapes that take the kernel's other paths.
Not a test: it prints median milliseconds per call so a regression is visible by eye.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/conv_micro.py

BLAS threads are fixed at one before numpy is imported, so both sides get one core.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import functools  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runtime.kernels.conv import Conv  # noqa: E402

LAYERS = {
    # name: (x shape, w shape, attributes)
    "resnet50 conv2_x 3x3 64->64 @56x56": ((1, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
    "resnet50 conv2_x 1x1 64->256 @56x56": ((1, 64, 56, 56), (256, 64, 1, 1), {}),
    "depthwise 3x3 x64 @56x56": ((1, 64, 56, 56), (64, 1, 3, 3), dict(group=64, pads=[1, 1, 1, 1])),
}


def _model(x_shape, w, b, attributes):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attributes)
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _median_ms(call, repeats=30):
    call()  # warm-up: plans, caches, allocator
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    rng = np.random.default_rng(0)
    for name, (x_shape, w_shape, attributes) in LAYERS.items():
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        b = rng.standard_normal(w_shape[0]).astype(np.float32)
        model = _model(x_shape, w, b, attributes)

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

        ir_model = ir.serde.deserialize_model(model)
        kernel = Conv(next(iter(ir_model.graph)), 17)

        ours = kernel.run(x, w, b)[0]
        reference = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(ours, reference, rtol=1e-3, atol=1e-3)

        ours_ms = _median_ms(functools.partial(kernel.run, x, w, b))
        ort_ms = _median_ms(functools.partial(session.run, None, {"x": x}))
        print(
            f"{name:40s} fusionwatch {ours_ms:7.2f} ms   onnxruntime {ort_ms:7.2f} ms   ratio {ours_ms / ort_ms:5.2f}x"
        )


if __name__ == "__main__":
    main()
