"""Micro-benchmark: each fused (contrib) kernel next to the unfused numpy chain it replaces.

Shapes are BERT-base (batch 1, seq 128, hidden 768, 12 heads, intermediate 3072), plus one
ResNet-50 stage for FusedConv. The unfused chain is written op by op as our executor runs the
unfused graph: every node allocates its output, Reshape/Transpose are views, and Erf and Sigmoid
are the ONNX-domain kernels' own functions. A fused kernel must be faster than its chain; the
last column says by how much.

Kernels with a compiled loop (runtime/kernels/compiled.py: the Gelus, SkipLayerNorm, the
attention softmax) are timed twice: as they run (compiled), and on their numpy path (what any
other dtype, layout or backend gets), so the table shows what the compiled loop buys on its own.

    python -m bench.fused_kernels [--runs 50]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from unittest import mock

import numpy as np
import onnx_ir as ir
from onnx import helper

from runtime.kernels import compiled
from runtime.kernels.activation import sigmoid
from runtime.kernels.conv import Conv
from runtime.kernels.elementwise import erf
from runtime.kernels.registry import find_kernel

MS = "com.microsoft"
BATCH, SEQ, HIDDEN, HEADS, INTERMEDIATE, VOCAB = 1, 128, 768, 12, 3072, 30522
HEAD = HIDDEN // HEADS


def kernel(op_type, n_inputs, n_outputs=1, domain=MS, **attrs):
    """Our kernel for a one-node graph, built as the executor builds it."""
    node_proto = helper.make_node(
        op_type,
        [f"i{k}" for k in range(n_inputs)],
        [f"o{k}" for k in range(n_outputs)],
        domain=domain,
        **attrs,
    )
    graph_inputs = [helper.make_tensor_value_info(f"i{k}", 0, None) for k in range(n_inputs)]
    graph = helper.make_graph([node_proto], "g", graph_inputs, [])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    node = ir.from_proto(helper.make_model(graph, opset_imports=opsets)).graph[0]
    opset = 1 if domain == MS else 17
    return find_kernel(domain, op_type, opset)(node, opset)


def median_ms(fn, runs):
    fn()  # warm-up: page in buffers, BLAS threads
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@contextlib.contextmanager
def numpy_path():
    """Every fused kernel on its array-API path, as on a dtype the compiled loops don't take."""
    with mock.patch.object(compiled, "accepts", lambda xp, *arrays: False):
        yield


def uses_compiled_loop(fused):
    """Whether the kernel call goes through runtime/kernels/compiled.py at all."""
    calls = []
    real = compiled.accepts

    def spy(xp, *arrays):
        calls.append(1)
        return real(xp, *arrays)

    with mock.patch.object(compiled, "accepts", spy):
        fused()
    return bool(calls)


def rand(*shape, scale=1.0):
    return (np.random.default_rng(sum(shape)).standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- the unfused chains


def chain_bias_gelu(a, b):
    x = a + b
    return x * ((erf(np, x / np.float32(math.sqrt(2))) + 1) * np.float32(0.5))  # Div, Erf, Add, Mul, Mul


def chain_fast_gelu(a, b):
    x = a + b
    cube = x * x * x  # two Muls; a Pow(x, 3.0) node costs ~25x more in numpy
    inner = (x + cube * np.float32(0.044715)) * np.float32(math.sqrt(2 / math.pi))
    return x * np.float32(0.5) * (np.tanh(inner) + 1)


def chain_quick_gelu(x):
    return x * sigmoid(np, x * np.float32(1.702))


def chain_layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)  # ReduceMean
    centered = x - mean  # Sub
    var = np.power(centered, 2).mean(-1, keepdims=True)  # Pow, ReduceMean
    return centered / np.sqrt(var + np.float32(eps)) * gamma + beta  # Add, Sqrt, Div, Mul, Add


def chain_skip_layer_norm(x, skip, gamma, beta, bias):
    return chain_layer_norm(x + bias + skip, gamma, beta)


def chain_embed_layer_norm(ids, segments, word, position, segment, gamma, beta):
    total = np.take(word, ids, axis=0) + np.take(position, np.arange(ids.shape[1])[None], axis=0)
    return chain_layer_norm(total + np.take(segment, segments, axis=0), gamma, beta)


def chain_attention(x, wq, wk, wv, bq, bk, bv, mask):
    def heads(t):
        return t.reshape(BATCH, SEQ, HEADS, HEAD).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
    additive = (np.float32(1) - mask[:, None, None, :].astype(np.float32)) * np.float32(-10000)
    scores = np.matmul(q, k.transpose(0, 1, 3, 2)) / np.float32(math.sqrt(HEAD)) + additive
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)  # Softmax, into a fresh tensor
    return np.matmul(probs, v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN)


def chain_gemm_relu(a, b, c):
    return np.maximum(a @ b + c, 0)


def chain_matmul_scale(q, k):
    return np.matmul(q, k.transpose(0, 1, 3, 2)) * np.float32(0.125)


# ---------------------------------------------------------------- cases


def cases():
    x = rand(BATCH, SEQ, HIDDEN)
    inter = rand(BATCH, SEQ, INTERMEDIATE)
    b_inter = rand(INTERMEDIATE)
    gamma, beta, bias = rand(HIDDEN), rand(HIDDEN), rand(HIDDEN)
    skip = rand(BATCH, SEQ, HIDDEN)
    w_qkv = rand(HIDDEN, 3 * HIDDEN, scale=0.05)
    b_qkv = rand(3 * HIDDEN)
    mask = np.ones((BATCH, SEQ), np.int32)
    mask[:, 100:] = 0
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    segments = rng.integers(0, 2, (BATCH, SEQ)).astype(np.int32)
    word, position, segment = rand(VOCAB, HIDDEN), rand(512, HIDDEN), rand(2, HIDDEN)
    w_inter = rand(HIDDEN, INTERMEDIATE, scale=0.05)
    q4, k4 = rand(BATCH, HEADS, SEQ, HEAD), rand(BATCH, HEADS, SEQ, HEAD)
    image, filters, conv_bias = rand(1, 64, 56, 56), rand(64, 64, 3, 3, scale=0.05), rand(64)
    residual = rand(1, 64, 56, 56)
    conv = Conv(kernel("Conv", 3, domain="", pads=[1, 1, 1, 1]).node, 17)

    bias_gelu = kernel("BiasGelu", 2)
    fast_gelu = kernel("FastGelu", 2)
    quick_gelu = kernel("QuickGelu", 1)
    skip_ln = kernel("SkipLayerNormalization", 5)
    embed_ln = kernel("EmbedLayerNormalization", 8, 2)
    attention = kernel("Attention", 4, num_heads=HEADS)
    fused_gemm = kernel("FusedGemm", 3, activation="Relu")
    fused_matmul = kernel("FusedMatMul", 2, transB=1, alpha=0.125)
    fused_conv = kernel("FusedConv", 4, activation="Relu", pads=[1, 1, 1, 1])
    wq, wk, wv = (np.ascontiguousarray(w_qkv[:, i * HIDDEN : (i + 1) * HIDDEN]) for i in range(3))
    bq, bk, bv = (b_qkv[i * HIDDEN : (i + 1) * HIDDEN] for i in range(3))

    return [
        (
            "BiasGelu (1x128x3072)",
            lambda: bias_gelu.run(inter, b_inter),
            lambda: chain_bias_gelu(inter, b_inter),
        ),
        (
            "FastGelu +bias (1x128x3072)",
            lambda: fast_gelu.run(inter, b_inter),
            lambda: chain_fast_gelu(inter, b_inter),
        ),
        ("QuickGelu (1x128x3072)", lambda: quick_gelu.run(inter), lambda: chain_quick_gelu(inter)),
        (
            "SkipLayerNorm +bias (1x128x768)",
            lambda: skip_ln.run(x, skip, gamma, beta, bias),
            lambda: chain_skip_layer_norm(x, skip, gamma, beta, bias),
        ),
        (
            "EmbedLayerNorm (1x128, vocab 30522)",
            lambda: embed_ln.run(ids, segments, word, position, segment, gamma, beta, mask),
            lambda: chain_embed_layer_norm(ids, segments, word, position, segment, gamma, beta),
        ),
        (
            "Attention 2-D mask (1x128x768, 12 heads)",
            lambda: attention.run(x, w_qkv, b_qkv, mask),
            lambda: chain_attention(x, wq, wk, wv, bq, bk, bv, mask),
        ),
        (
            "FusedGemm Relu (128x768 @ 768x3072)",
            lambda: fused_gemm.run(x[0], w_inter, b_inter),
            lambda: chain_gemm_relu(x[0], w_inter, b_inter),
        ),
        (
            "FusedMatMul transB alpha (QK^T)",
            lambda: fused_matmul.run(q4, k4),
            lambda: chain_matmul_scale(q4, k4),
        ),
        (
            "FusedConv +Z Relu (1x64x56x56, 3x3)",
            lambda: fused_conv.run(image, filters, conv_bias, residual),
            lambda: np.maximum(conv.run(image, filters, conv_bias)[0] + residual, 0),
        ),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args(argv)
    print(f"{'kernel':42s} {'compiled':>9s} {'numpy':>9s} {'chain ms':>9s} {'speedup':>8s}")
    for name, fused, chain in cases():
        np.testing.assert_allclose(np.asarray(fused()[0]), chain(), rtol=1e-3, atol=1e-3, err_msg=name)
        chain_ms = median_ms(chain, args.runs)
        fused_ms = median_ms(fused, args.runs)
        if uses_compiled_loop(fused):
            with numpy_path():
                np.testing.assert_allclose(
                    np.asarray(fused()[0]), chain(), rtol=1e-3, atol=1e-3, err_msg=name
                )
                numpy_ms = f"{median_ms(fused, args.runs):9.3f}"
            compiled_ms = f"{fused_ms:9.3f}"
        else:
            compiled_ms, numpy_ms = f"{'-':>9s}", f"{fused_ms:9.3f}"
        print(f"{name:42s} {compiled_ms} {numpy_ms} {chain_ms:9.3f} {chain_ms / fused_ms:7.2f}x")


if __name__ == "__main__":
    main()
