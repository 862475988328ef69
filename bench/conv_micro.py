"""Our convolution paths next to onnxruntime on ResNet-50's layer shapes, one thread each by default.

For each layer: Conv (NCHW, levels basic and extended) on the numpy path (im2col + BLAS GEMM),
NhwcFusedConv (channels-last, what the layout level runs) on the same numpy path (a run-time
weight) and on oneDNN (a constant weight, where installed: runtime/kernels/onednn_conv.py), and
onnxruntime's Conv. Prints median milliseconds per call; not a test. Pin it to one core on a busy machine:

    taskset -c 0 .venv/bin/python -m bench.conv_micro
    FUSIONWATCH_BENCH_THREADS=2 .venv/bin/python -m bench.conv_micro

Thread counts are fixed (one by default) before numpy is imported, so every side gets as many.
"""

from __future__ import annotations

import os

THREADS = int(os.environ.get("FUSIONWATCH_BENCH_THREADS", "1"))
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, str(THREADS))

import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from runtime.kernels import onednn  # noqa: E402
from runtime.kernels.conv import Conv  # noqa: E402
from runtime.kernels.conv_nhwc import NhwcFusedConv  # noqa: E402

LAYERS = {
    # name: (x shape, w shape, attributes)
    "stem 7x7/2 3->64 @224": ((1, 3, 224, 224), (64, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),
    "conv2 3x3 64->64 @56": ((1, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
    "conv2 1x1 64->256 @56": ((1, 64, 56, 56), (256, 64, 1, 1), {}),
    "conv2 1x1 256->64 @56": ((1, 256, 56, 56), (64, 256, 1, 1), {}),
    "conv3 3x3/2 128->128 @56": ((1, 128, 56, 56), (128, 128, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    "conv4 3x3 256->256 @14": ((1, 256, 14, 14), (256, 256, 3, 3), dict(pads=[1, 1, 1, 1])),
    "conv5 1x1 2048->512 @7": ((1, 2048, 7, 7), (512, 2048, 1, 1), {}),
    "depthwise 3x3 x64 @56": ((1, 64, 56, 56), (64, 1, 3, 3), dict(group=64, pads=[1, 1, 1, 1])),
}


def _model(op, domain, x_shape, w, b, attributes):
    """One node; `w` None makes the weight a graph input (a run-time weight, the numpy path)."""
    node = helper.make_node(op, ["x", "w", "b"], ["y"], domain=domain, **attributes)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    initializers = [numpy_helper.from_array(b, "b")]
    if w is None:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, None))
    else:
        initializers.append(numpy_helper.from_array(w, "w"))
    graph = helper.make_graph(
        [node], "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=initializers
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _kernel(kind, op, domain, x_shape, w, b, attributes):
    model = ir.serde.deserialize_model(_model(op, domain, x_shape, w, b, attributes))
    return kind(next(iter(model.graph)), 17)


def _median_ms(call, repeats=30):
    # OpenBLAS's workers spin for ~0.1 s after a GEMM (the numpy paths'); left spinning they
    # would take the second core from whatever is timed next.
    time.sleep(0.3)
    call()  # warm-up: plans, primitives, caches
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"oneDNN: {'available' if onednn.available() else onednn.unavailable_reason()}")
    print(f"{'layer':28s} {'NCHW':>8s} {'NHWC':>8s} {'oneDNN':>8s} {'ORT':>8s}  ms per call")
    for name, (x_shape, w_shape, attributes) in LAYERS.items():
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        b = rng.standard_normal(w_shape[0]).astype(np.float32)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = THREADS
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            _model("Conv", "", x_shape, w, b, attributes).SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
        )
        conv = _kernel(Conv, "Conv", "", x_shape, w, b, attributes)
        x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        nhwc = _kernel(NhwcFusedConv, "NhwcFusedConv", "com.microsoft", x_last.shape, None, b, attributes)
        library = _kernel(NhwcFusedConv, "NhwcFusedConv", "com.microsoft", x_last.shape, w, b, attributes)
        reference = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(conv.run(x, w, b)[0], reference, rtol=1e-3, atol=1e-3)
        for kernel in (nhwc, library):
            np.testing.assert_allclose(kernel.run(x_last, w, b)[0].transpose(0, 3, 1, 2), reference, rtol=1e-3, atol=1e-3)
        times = [
            _median_ms(functools.partial(conv.run, x, w, b)),
            _median_ms(functools.partial(nhwc.run, x_last, w, b)),
            _median_ms(functools.partial(library.run, x_last, w, b)) if library._primitives else float("nan"),
            _median_ms(functools.partial(session.run, None, {"x": x})),
        ]
        print(f"{name:28s} " + " ".join(f"{t:8.2f}" for t in times))

if __name__ == "__main__":
    main()
