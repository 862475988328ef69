"""Micro-benchmark: Attention's work after its QKV projection at small shapes, the one compiled
loop (`compiled.small_attention`) against the head products on a library, to place
`compiled.SMALL_ATTENTION`. Not a test.

    .venv/bin/python -m bench.attention_small [--gemm onednn] [--calls 1500]

For each (sequence, hidden, heads), batch 1, a zero (1, 1, S, S) attention_bias as BERT-style
exports hand the fused node its padding mask: `Attention.attend_projection` on a fresh copy of
the projection as the kernel takes it, with SMALL_ATTENTION above the shape (`loop`) and 0
(`products`: the heads read in place on the `--gemm` library, or copied out where the products
are too small for one), interleaved call by call, one thread, fastest of `--calls` each. The multiply-adds of
the two head products (S T (Dq + Dv)) decide which path runs; the last column says which one
the kernel takes at that size.
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

import numpy as np

from bench.attention_micro import attention_kernel

SHAPES = [(16, 128, 2), (32, 128, 2), (32, 256, 4), (40, 256, 4), (48, 256, 4), (64, 256, 4),
          (64, 128, 2), (96, 128, 2), (32, 768, 12), (128, 256, 4)]  # fmt: skip


def measure(gemm_library: str, calls: int) -> list[dict]:
    from runtime.kernels import compiled, gemm, libraries
    from runtime.threads import limit_blas_threads

    limit_blas_threads(1)
    gemm.set_threads(1)
    rows = []
    with libraries.using({"gemm": gemm_library}):
        for seq, hidden, heads in SHAPES:
            rng = np.random.default_rng(0)
            weights = (0.05 * rng.standard_normal((hidden, 3 * hidden))).astype(np.float32)
            bias = (0.02 * rng.standard_normal(3 * hidden)).astype(np.float32)
            attention = attention_kernel({"num_heads": heads}, weights, bias)
            qkv = rng.standard_normal((1, seq, 3 * hidden), dtype=np.float32)
            mask = np.zeros((1, 1, seq, seq), np.float32)

            def after_projection(qkv=qkv, attention=attention, bias=bias, mask=mask, hidden=hidden):
                return attention.attend_projection(qkv.copy(), [hidden] * 3, bias, None, None, mask)

            limits = {"loop": 2**62, "products": 0}
            results = {}
            for name, limit in limits.items():
                with mock.patch.object(compiled, "SMALL_ATTENTION", limit):
                    results[name] = after_projection()[0]
            np.testing.assert_allclose(results["loop"], results["products"], rtol=1e-4, atol=1e-5)
            best = {"loop": float("inf"), "products": float("inf")}
            for _ in range(calls):
                for name, limit in limits.items():
                    with mock.patch.object(compiled, "SMALL_ATTENTION", limit):
                        started = time.perf_counter_ns()
                        after_projection()
                        best[name] = min(best[name], time.perf_counter_ns() - started)
            macs = seq * seq * 2 * hidden
            rows.append({
                "seq": seq, "hidden": hidden, "heads": heads, "macs": macs,
                "loop_us": best["loop"] / 1000, "products_us": best["products"] / 1000,
                "takes": "loop" if macs <= compiled.SMALL_ATTENTION else "products",
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemm", default="onednn", help="the products' library: mkl-packed, onednn or numpy")
    parser.add_argument("--calls", type=int, default=1500)
    args = parser.parse_args()
    rows = measure(args.gemm, args.calls)
    print(f"Attention after its projection, batch 1, 1 thread, fastest of {args.calls} interleaved calls (µs);"
          f" products on {args.gemm}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"  {'seq':>4} {'hidden':>6} {'heads':>5} {'multiply-adds':>13} {'loop':>8} {'products':>9}  takes")
    for row in rows:
        print(
            f"  {row['seq']:>4} {row['hidden']:>6} {row['heads']:>5} {row['macs']:>13,} {row['loop_us']:8.1f}"
            f" {row['products_us']:9.1f}  {row['takes']}"
        )


if __name__ == "__main__":
    main()
