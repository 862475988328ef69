"""Micro-benchmark: com.microsoft Attention at BERT-base / GPT-2 small shapes, its QKV projection
alone next to the whole kernel, on each GEMM library a session can choose. Not a test.

What a level-`all` session runs (batch 1, sequence 128, hidden 768, 12 heads): one Attention per
layer with the packed (768, 2304) QKV weight and its bias, `scale` 1/8, and the mask as a
(1, 1, 128, 128) attention_bias that a Where computes, zeros for BERT (its all-ones padding mask)
and 0 / -inf for GPT-2 (its causal mask). The other cases are the ones onnxruntime's fusion
produces instead (BERT's (B, T) mask_index, GPT-2's `unidirectional`).

The projection is 128x768x2304, 0.45 GFLOP; everything after it (QK^T, mask and softmax, PV, the
head split and merge, the biases) some 50 MFLOP, so `kernel - qkv` should be small beside `qkv`.
Both are timed interleaved (one call of each in turn), in a fresh process per library (as
bench/gemm_micro.py does: libraries that ran before in a process can disturb the next), under the
session's library choice (`libraries.using`), so the kernel takes the path a session would.

    .venv/bin/python -m bench.attention_micro                       # every loadable library
    .venv/bin/python -m bench.attention_micro --entrants onednn/spin --calls 200
    .venv/bin/python -m bench.attention_micro --entrants onednn/spin --heads-on mkl   # the MKL heads path
    .venv/bin/python -m bench.attention_micro --products   # QK^T and PV alone, MKL against oneDNN

Prints per library and case: the path the kernel took, median and fastest ms of the projection,
of the whole kernel, and of the kernel's work after the projection ("after qkv", the overhead
issue 14 is about: `Attention.attend_projection` on a copy of the projection), with the 1-minute load
average before and after each library's block.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from unittest import mock

import numpy as np

BATCH, SEQ, HIDDEN, HEADS = 1, 128, 768, 12
CASES = ("bert", "gpt2", "bert_mask_index", "gpt2_unidirectional")


def _inputs(case: str, batch: int, seq: int):
    """(attributes, run() inputs) of one layer's Attention node for `case`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, seq, HIDDEN), dtype=np.float32)
    weights = (0.04 * rng.standard_normal((HIDDEN, 3 * HIDDEN))).astype(np.float32)
    bias = (0.02 * rng.standard_normal(3 * HIDDEN)).astype(np.float32)
    attributes = {"num_heads": HEADS, "scale": 1.0 / np.sqrt(HIDDEN // HEADS)}
    mask_index = attention_bias = None
    if case == "bert":
        attention_bias = np.zeros((1, 1, seq, seq), np.float32)
    elif case == "gpt2":
        causal = np.tril(np.ones((seq, seq), bool))
        attention_bias = np.where(causal, np.float32(0), np.float32(-np.inf)).reshape(1, 1, seq, seq)
    elif case == "bert_mask_index":
        mask_index = np.ones((batch, seq), np.int32)
    elif case == "gpt2_unidirectional":
        attributes["unidirectional"] = 1
    else:
        raise ValueError(f"unknown case {case!r}; the cases are {CASES}")
    return attributes, (x, weights, bias, mask_index, None, attention_bias)


def attention_kernel(attributes: dict, weights: np.ndarray, bias: np.ndarray):
    """Our kernel for the node, built as the executor builds it, with the weight and bias as the
    constant initializers they are in a model, so the weight is prepared for the chosen library."""
    import onnx_ir as ir
    from onnx import helper, numpy_helper

    from runtime.kernels.registry import find_kernel

    names = ["input", "weights", "bias", "mask_index", "past", "attention_bias"]
    node = helper.make_node("Attention", names, ["output"], domain="com.microsoft", **attributes)
    graph = helper.make_graph(
        [node], "attention", [helper.make_tensor_value_info(n, 0, None) for n in names if n not in ("weights", "bias")],
        [], initializer=[numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(bias, "bias")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    built = ir.from_proto(helper.make_model(graph, opset_imports=opsets)).graph[0]
    return find_kernel("com.microsoft", "Attention", 1)(built, 1)


def _path_taken(kernel, x, weights, bias) -> str:
    from runtime.kernels import contrib_attention, gemm

    qkv = gemm.matmul_packed(x, kernel.packed) if gemm.applies(kernel.packed, x, weights) else x @ weights
    library = contrib_attention.head_library(np, qkv)
    return f"heads in place ({library})" if library else "heads copied"


def _after_projection(attention, inputs, qkv):
    """The kernel's work after its QKV projection, on a fresh copy of the projection (the kernel
    adds biases to it in place; the copy costs ~0.03 ms of the time)."""
    x, weights, bias, mask_index, past, attention_bias = inputs
    sizes = attention._hidden_sizes(weights)
    return attention.attend_projection(qkv.copy(), sizes, bias, mask_index, past, attention_bias)


@contextlib.contextmanager
def _heads_read_on(library: str | None):
    """`contrib_attention.head_library` answering `library` wherever it would read heads in place."""
    if library is None:
        yield
        return
    from runtime.kernels import contrib_attention

    real = contrib_attention.head_library
    with mock.patch.object(contrib_attention, "head_library", lambda xp, *xs: real(xp, *xs) and library):
        yield


def measure(
    entrant: str, cases: list[str], calls: int, threads: int, batch: int, seq: int, heads_on: str | None = None
) -> list[dict]:
    from runtime.kernel_choice import split
    from runtime.kernels import gemm, libraries
    from runtime.memory import keep_freed_memory
    from runtime.threads import limit_blas_threads

    limit_blas_threads(threads)
    keep_freed_memory()  # as a session does by default: scores and context come from the heap, not fresh pages
    library, wait = split(entrant)
    choice = {"gemm": library} | ({"wait": wait} if wait else {})
    rows = []
    with libraries.using(choice), _heads_read_on(heads_on):
        for case in cases:
            attributes, inputs = _inputs(case, batch, seq)
            x, weights, bias = inputs[:3]
            attention = attention_kernel(attributes, weights, bias)
            if gemm.applies(attention.packed, x, weights):
                projection = partial(gemm.matmul_packed, x, attention.packed)
            else:
                projection = partial(gemm.product, np, x, weights)
            whole = partial(attention.run, *inputs)
            rest = partial(_after_projection, attention, inputs, projection())
            calls_by_name = {"qkv": projection, "kernel": whole, "rest": rest}
            for _ in range(5):
                for call in calls_by_name.values():
                    call()
            times = {name: [] for name in calls_by_name}
            for _ in range(calls):
                for name, call in calls_by_name.items():
                    started = time.perf_counter()
                    call()
                    times[name].append(1e3 * (time.perf_counter() - started))
            row = {"case": case, "path": _path_taken(attention, x, weights, bias)}
            for name, values in times.items():
                row[name] = {"median": statistics.median(values), "best": min(values)}
            rows.append(row)
    return rows


def measure_products(calls: int, threads: int, batch: int, seq: int) -> list[dict]:
    """The two per-head products alone, heads read in place from a (B, S, 3D) projection, on MKL's
    batch-strided SGEMM (`_mkl_attend`'s) and oneDNN's strided matmul (`_onednn_attend`'s), interleaved."""
    from runtime.kernels import contrib_attention, gemm, libraries, onednn, onednn_heads
    from runtime.threads import limit_blas_threads

    limit_blas_threads(threads)
    head = HIDDEN // HEADS
    qkv = np.random.default_rng(0).standard_normal((batch, seq, 3 * HIDDEN), dtype=np.float32)
    q, k, v = qkv[..., :HIDDEN], qkv[..., HIDDEN : 2 * HIDDEN], qkv[..., 2 * HIDDEN :]
    scores = np.empty((batch, HEADS, seq, seq), np.float32)
    context = np.empty((batch, HEADS, seq, head), np.float32)
    merged = np.empty((batch, seq, HIDDEN), np.float32)
    rows = contrib_attention.rows_of
    products = {}
    if gemm.available():
        products["mkl QK^T"] = lambda: [gemm.batch_strided(HEADS, seq, seq, head, 1.0, rows(q, b, head),
                                        rows(k, b, head), rows(scores, b, seq * seq), trans_b=True) for b in range(batch)]  # fmt: skip
        products["mkl PV"] = lambda: [gemm.batch_strided(HEADS, seq, head, seq, 1.0, rows(scores, b, seq * seq),
                                      rows(v, b, head), rows(context, b, seq * head)) for b in range(batch)]  # fmt: skip
    if onednn.available():
        qk, pv = onednn_heads.head_products(q, k, v, HEADS)
        products["onednn QK^T"] = partial(qk, q.ctypes.data, k.ctypes.data, scores.ctypes.data)
        products["onednn PV (merged)"] = partial(pv, scores.ctypes.data, v.ctypes.data, merged.ctypes.data)
    with libraries.using({"gemm": "onednn", "wait": "spin"}):  # what the race chose on the AMD EPYC
        for _ in range(5):
            for call in products.values():
                call()
        times = {name: [] for name in products}
        for _ in range(calls):
            for name, call in products.items():
                started = time.perf_counter()
                call()
                times[name].append(1e3 * (time.perf_counter() - started))
    return [{"case": name, "median": statistics.median(values), "best": min(values)} for name, values in times.items()]


def _entrants() -> list[str]:
    from runtime import kernel_choice

    return kernel_choice.with_waits(kernel_choice.gemm_candidates())


def _in_fresh_process(entrant: str, args) -> list[dict]:
    command = [sys.executable, "-m", "bench.attention_micro", "--entrants", entrant, "--cases", *args.cases,
               "--calls", str(args.calls), "--threads", str(args.threads), "--batch", str(args.batch),
               "--seq", str(args.seq), "--in-process", *(["--heads-on", args.heads_on] if args.heads_on else [])]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{entrant}: {' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entrants", nargs="+", help="default: every GEMM library loadable here, with each wait")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--seq", type=int, default=SEQ)
    parser.add_argument("--products", action="store_true", help="time the two per-head products alone")
    parser.add_argument("--heads-on", choices=["mkl", "onednn"],
                        help="read the heads on this library wherever they are read in place (default: the session's rule)")  # fmt: skip
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.products:
        print(f"per-head products at batch {args.batch}, seq {args.seq}, {HEADS} heads of {HIDDEN // HEADS}, "
              f"{args.threads} threads, {args.calls} interleaved calls (load average {os.getloadavg()[0]:.2f})")  # fmt: skip
        for row in measure_products(args.calls, args.threads, args.batch, args.seq):
            print(f"  {row['case']:20s} median {row['median']:6.3f} best {row['best']:6.3f} ms")
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    if args.in_process:
        [entrant] = args.entrants
        print(json.dumps(measure(entrant, args.cases, args.calls, args.threads, args.batch, args.seq, args.heads_on)))
        return
    from runtime.kernel_choice import cpu_info

    print(f"cpu: {cpu_info()}, {args.threads} threads, batch {args.batch}, seq {args.seq}, hidden {HIDDEN}, "
          f"{HEADS} heads; {args.calls} interleaved calls each, a fresh process per library")  # fmt: skip
    for entrant in args.entrants or _entrants():
        before = os.getloadavg()[0]
        rows = _in_fresh_process(entrant, args)
        print(f"{entrant} (load average {before:.2f}-{os.getloadavg()[0]:.2f})")
        for row in rows:
            qkv, whole, rest = row["qkv"], row["kernel"], row["rest"]
            print(f"  {row['case']:20s} {row['path']:24s} qkv median {qkv['median']:6.3f} best {qkv['best']:6.3f}"
                  f" | kernel median {whole['median']:6.3f} best {whole['best']:6.3f}"
                  f" | after qkv median {rest['median']:6.3f} best {rest['best']:6.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
