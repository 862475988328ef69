"""Micro-benchmark: each fused (contrib) kernel next to the unfused numpy chain it replaces.

Shapes are BERT-base (batch 1, seq 128, hidden 768, 12 heads, intermediate 3072), plus one
ResNet-50 stage for FusedConv. The unfused chain is written op by op as our executor runs the
unfused graph: every node allocates its output, Reshape/Transpose are views, and Erf and Sigmoid
are the ONNX-domain kernels' own functions, and its products go through gemm.product (MKL where
installed) as the executor's MatMul does: an OpenBLAS call here would also leave its threads
spinning beside the fused kernel's MKL ones. A fused kernel must be faster than its chain; the
last column says by how much.

Kernels with a compiled loop (runtime/kernels/compiled.py: the Gelus, SkipLayerNorm, the
attention softmax) are also timed on their numpy path (what any other dtype, layout or backend
gets), so the table shows what the compiled loop buys on its own, and with their loops
compiled at LLVM's default vector width (`256-bit`), to show what `_wide_vectors` buys on this
CPU. Attention is also timed with its heads copied out before the products (`copied`), the
path it takes where `head_library` names no library.

Every column of a row is timed interleaved (one call of each in turn, medians), so a second
process on the machine slows them alike.

`--model bert_base` also times a whole model: our executor at levels disabled and all,
interleaved run by run, then level all's ms per call of each op from a profiled session.

    python -m bench.fused_kernels [--runs 50] [--threads 2] [--model bert_base [--model-runs 20]]
    taskset -c 1 python -m bench.fused_kernels --threads 1     # single-thread, pinned
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
import types
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
import onnx_ir as ir
from numba import njit
from onnx import helper

from runtime.kernels import compiled, contrib_attention
from runtime.kernels.activation import sigmoid
from runtime.kernels.conv import Conv
from runtime.kernels.erf_fit import erf
from runtime.kernels.gemm import product
from runtime.kernels.registry import find_kernel
from runtime.threads import limit_blas_threads

MS = "com.microsoft"
BATCH, SEQ, HIDDEN, HEADS, INTERMEDIATE, VOCAB = 1, 128, 768, 12, 3072, 30522
HEAD = HIDDEN // HEADS


def kernel(op_type, n_inputs, n_outputs=1, domain=MS, opset=17, **attrs):
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
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    node = ir.from_proto(helper.make_model(graph, opset_imports=opsets)).graph[0]
    version = 1 if domain == MS else opset
    return find_kernel(domain, op_type, version)(node, version)


def interleaved_ms(variants, runs):
    """Median ms of each (name -> (context, fn)) variant, calling one of each in turn per round."""
    for context, fn in variants.values():
        with context():
            fn()  # warm-up: page in buffers, BLAS threads, compile
    times = {name: [] for name in variants}
    for _ in range(runs):
        for name, (context, fn) in variants.items():
            with context():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


@contextlib.contextmanager
def numpy_path():
    """Every fused kernel on its array-API path, as on a dtype the compiled loops don't take."""
    with mock.patch.object(compiled, "accepts", lambda xp, *arrays: False):
        yield


@njit
def _default_width():
    return None


def _at_default_width(loop):
    """`loop` recompiled with its `_wide_vectors()` call a no-op: LLVM's default vector width."""
    source = loop.py_func
    body = types.FunctionType(source.__code__, {**source.__globals__, "_wide_vectors": _default_width})
    return njit(**compiled.JIT_OPTIONS)(body)


_WIDE_LOOPS = [
    name
    for name, loop in vars(compiled).items()
    if hasattr(loop, "py_func") and "_wide_vectors" in loop.py_func.__code__.co_names
]
_DEFAULT_WIDTH_LOOPS = {}


@contextlib.contextmanager
def default_width():
    """The compiled loops at LLVM's default vector width instead of 512 bits."""
    if not _DEFAULT_WIDTH_LOOPS:
        for name in _WIDE_LOOPS:
            _DEFAULT_WIDTH_LOOPS[name] = _at_default_width(getattr(compiled, name))
    with contextlib.ExitStack() as stack:
        for name, loop in _DEFAULT_WIDTH_LOOPS.items():
            stack.enter_context(mock.patch.object(compiled, name, loop))
        yield


@contextlib.contextmanager
def heads_copied():
    """Attention with its heads copied out (`_heads_contiguous`) instead of read in place."""
    with mock.patch.object(contrib_attention, "head_library", lambda xp, *arrays: None):
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


def chain_gelu(x):
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


def chain_attention(x, wq, wk, wv, bq, bk, bv, mask=None, bias_mask=None):
    """A padding mask (B, T) as the TorchScript exports apply it, or an additive (B, 1, S, T) one
    as the dynamo / SDPA exports do (Where, then Add to the scores)."""

    def heads(t):
        return t.reshape(BATCH, SEQ, HEADS, HEAD).transpose(0, 2, 1, 3)

    q, k, v = (heads(product(np, x, w) + b) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    if bias_mask is None:
        additive = (np.float32(1) - mask[:, None, None, :].astype(np.float32)) * np.float32(-10000)
    else:
        additive = bias_mask
    scores = product(np, q, k.transpose(0, 1, 3, 2)) / np.float32(math.sqrt(HEAD)) + additive
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)  # Softmax, into a fresh tensor
    return product(np, probs, v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN)


def chain_gemm_relu(a, b, c):
    return np.maximum(product(np, a, b) + c, 0)


def chain_matmul_scale(q, k):
    return product(np, q, k.transpose(0, 1, 3, 2)) * np.float32(0.125)


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
    onnx_gelu = kernel("Gelu", 1, domain="", opset=20)  # what exporters write from opset 20 on
    skip_ln = kernel("SkipLayerNormalization", 5)
    embed_ln = kernel("EmbedLayerNormalization", 8, 2)
    attention = kernel("Attention", 4, num_heads=HEADS)
    attention_with_bias = kernel("Attention", 6, num_heads=HEADS)
    bias_mask = np.where(mask[:, None, None, :] > 0, np.float32(0), np.finfo(np.float32).min)
    bias_mask = np.ascontiguousarray(np.broadcast_to(bias_mask, (BATCH, 1, SEQ, SEQ)))
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
        ("Gelu, ONNX's, opset 20 (1x128x3072)", lambda: onnx_gelu.run(inter), lambda: chain_gelu(inter)),
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
            "Attention (1,1,S,T) attention_bias mask",
            lambda: attention_with_bias.run(x, w_qkv, b_qkv, None, None, bias_mask),
            lambda: chain_attention(x, wq, wk, wv, bq, bk, bv, bias_mask=bias_mask),
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


def kernel_table(runs):
    columns = ["ours", "256-bit", "copied", "numpy", "chain"]
    print(f"{'kernel':42s}" + "".join(f"{c:>9s}" for c in columns) + f"{'speedup':>9s}")
    for name, fused, chain in cases():
        variants = {"ours": (contextlib.nullcontext, fused), "chain": (contextlib.nullcontext, chain)}
        if uses_compiled_loop(fused):
            variants["256-bit"] = (default_width, fused)
            variants["numpy"] = (numpy_path, fused)
        if name.startswith("Attention"):
            variants["copied"] = (heads_copied, fused)
        for variant, (context, fn) in variants.items():
            if variant == "chain":
                continue
            with context():
                np.testing.assert_allclose(
                    np.asarray(fn()[0]), chain(), rtol=1e-3, atol=1e-3, err_msg=f"{name}, {variant}"
                )
        ms = interleaved_ms(variants, runs)
        cells = "".join(f"{ms[c]:9.3f}" if c in ms else f"{'-':>9s}" for c in columns)
        print(f"{name:42s}{cells}{ms['chain'] / ms['ours']:8.2f}x")


def model_table(name, runs, threads):
    """Whole-model ms at levels disabled and all, interleaved, and level all's ops per call."""
    import runtime
    from bench.__main__ import feeds_for
    from bench.models import model_path
    from runtime.profile_table import load_trace, profile_table

    path = str(model_path(name))

    def session(level, profiling=False):
        options = runtime.SessionOptions(
            graph_optimization_level=level, intra_op_num_threads=threads, enable_profiling=profiling
        )
        return runtime.InferenceSession(path, options)

    sessions = {level: session(level) for level in ("disabled", "all")}
    feeds = feeds_for(sessions["all"])
    variants = {level: (contextlib.nullcontext, partial(s.run, None, feeds)) for level, s in sessions.items()}
    ms = interleaved_ms(variants, runs)
    print(f"\n{name}, {threads} threads: our executor, median ms of {runs} interleaved runs")
    print(f"  disabled {ms['disabled']:9.2f}\n  all      {ms['all']:9.2f}")
    print(f"  fusion speedup (disabled / all): {ms['disabled'] / ms['all']:.3f}")
    del sessions, variants

    profiled = session("all", profiling=True)
    for _ in range(runs + 2):
        profiled.run(None, feeds)
    trace = Path(profiled.end_profiling())
    table = profile_table(load_trace(trace), skip_runs=2)
    trace.unlink()
    print(f"\n{name} at level all, profiled ({runs} runs): model_run {table.median_model_run_ms:.2f} ms")
    print(f"  {'op':<28s} {'calls':>6s} {'ms/call':>9s} {'ms/run':>9s}")
    for op in table.ops[:8]:
        per_run = op.us_per_run / 1e3
        print(f"  {op.op:<28s} {op.calls_per_run:6.0f} {per_run / op.calls_per_run:9.3f} {per_run:9.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--model", help="also time a bench model (bench/models.py) end to end")
    parser.add_argument("--model-runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2, help="BLAS / MKL threads, and the model's intra_op")
    parser.add_argument("--skip-kernels", action="store_true", help="only the --model tables")
    args = parser.parse_args(argv)
    limit_blas_threads(args.threads)
    if not args.skip_kernels:
        kernel_table(args.runs)
    if args.model:
        model_table(args.model, args.model_runs, args.threads)


if __name__ == "__main__":
    main()
