"""MatMulAddFusion: MatMul(A, B) -> Add(C)  =>  Gemm(A, B, C).

    A [M, K] @ B [K, N] + C        => Gemm(A, B, C)                  C: [N], [1, N], [M, 1], [M, N]
    A [..., K] @ B [K, N] + C [N]  => Reshape(Gemm(Reshape(A, [M, K]), B, C), [..., N])

The 2-D form is the classic one. For higher-rank A we do what ONNX Runtime does, and
only where it is safe with constant Reshapes around the Gemm: every dimension of A must
be known (M is their product), K and N must be known, and C must be [N] — a bias that
varies along the leading dimensions has no Gemm form. Symbolic batch or sequence
dimensions would need Shape/Concat arithmetic to restore the output shape, which costs
more than the fusion saves, so those are near misses.

Like ONNX Runtime, B need not be constant (Gemm takes any 2-D B), and only float,
float16 and bfloat16 are fused, the types ONNX Runtime's Gemm kernels take. Unlike it, we
do not skip the Q/K/V projections of an attention block: at the extended level
MatMulAddFusion runs after AttentionFusion (see levels.py), which has taken those
already.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from optimizer.match import describe, input_at, is_op, producer, unique_name, value_name
from optimizer.rule import Match, Rule, fail

GEMM_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


class MatMulAddFusion(Rule):
    name = "MatMulAddFusion"
    anchors = ("Add",)
    emits = ("Gemm",)

    def match(self, graph: ir.Graph, add: ir.Node):
        matmul, bias = None, None
        for index in (0, 1):
            if is_op(producer(input_at(add, index)), "MatMul"):
                matmul, bias = producer(input_at(add, index)), input_at(add, 1 - index)
                break
        if matmul is None:
            return fail("matmul", f"neither input of {describe(add)} comes from a MatMul")
        a, b = matmul.inputs
        dtype = a.dtype
        if dtype not in GEMM_TYPES:
            return fail("types", f"{describe(matmul)} computes {dtype.name if dtype else 'an unknown type'}; Gemm is fused for float types only")
        if bias.dtype is not None and bias.dtype != dtype:
            return fail("types", f"addend '{value_name(bias)}' is {bias.dtype.name}, MatMul is {dtype.name}")
        if a.shape is None or b.shape is None or bias.shape is None:
            return fail("shapes", "the shapes of the MatMul's inputs or of the addend are unknown")
        if len(b.shape) != 2:
            return fail("shapes", f"B '{value_name(b)}' has rank {len(b.shape)}; Gemm needs a 2-D B")
        n = b.shape[1]
        bias_dims = list(bias.shape)
        if len(a.shape) == 2:
            m = a.shape[0]
            if not _gemm_bias(bias_dims, m, n):
                return fail("addend", f"addend shape {_show(bias_dims)} does not broadcast to Gemm's [{m}, {n}] output")
            return Match(nodes=[matmul, add], outputs=[add.outputs[0]], captures={"a": a, "b": b, "c": bias, "reshape": None})
        if len(a.shape) < 2:
            return fail("shape", f"A of {describe(matmul)} is a vector; Gemm multiplies matrices")
        if not all(isinstance(d, int) for d in a.shape) or not all(isinstance(d, int) for d in b.shape):
            return fail(
                "shapes",
                f"A '{value_name(a)}' has shape {_show(list(a.shape))}; a rank-{len(a.shape)} MatMul becomes a Gemm only when every dimension is known",
            )
        if bias_dims != [n]:
            return fail("addend", f"addend shape {_show(bias_dims)} is not [{n}], which a reshaped Gemm needs")
        m, k = math.prod(a.shape[:-1]), a.shape[-1]
        base = matmul.name or "MatMul"
        return Match(
            nodes=[matmul, add],
            outputs=[add.outputs[0]],
            captures={
                "a": a, "b": b, "c": bias,
                "reshape": (np.array([m, k], dtype=np.int64), np.array(list(a.shape[:-1]) + [n], dtype=np.int64)),
                "names": (unique_name(graph, f"{base}_gemm_input_shape"), unique_name(graph, f"{base}_gemm_output_shape")),
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        if match.reshape is None:
            return op.op("Gemm", [match.a, match.b, match.c])
        input_shape, output_shape = match.reshape
        flat = op.op("Reshape", [match.a, op.initializer(ir.Tensor(input_shape, name=match.names[0]))])
        gemm = op.op("Gemm", [flat, match.b, match.c])
        return op.op("Reshape", [gemm, op.initializer(ir.Tensor(output_shape, name=match.names[1]))])


def _gemm_bias(dims: list, m, n) -> bool:
    """Whether C of these dims broadcasts unidirectionally to [M, N], as Gemm requires."""
    if len(dims) == 1:
        return dims[0] == n
    if len(dims) == 2:
        rows_ok = dims[0] == 1 or dims[0] == m
        return rows_ok and (dims[1] == n or (dims[0] == m and dims[1] == 1))
    return False


def _show(dims: list) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
