"""MatmulTransposeFusion: Transpose of the last two axes feeding MatMul  =>  com.microsoft.FusedMatMul.

    MatMul(Transpose(a, perm=[…, n-1, n-2]), b)     => FusedMatMul(a, b, transA=1)
    MatMul(a, Transpose(b, perm=[…, n-1, n-2]))     => FusedMatMul(a, b, transB=1)
    FusedMatMul(Transpose(a), b, transA=t, alpha)   => FusedMatMul(a, b, transA=1-t, alpha)

A Transpose with other readers is kept for them. Transposes that move batch axes, and
FusedMatMuls that already transpose batch axes (transBatchA/transBatchB), are left as
they are: FusedMatMul's transA/transB only swap the last two axes.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import MS, attr, describe, rank, sole_consumer
from optimizer.rule import Match, Rule, fail


class MatmulTransposeFusion(Rule):
    name = "MatmulTransposeFusion"
    anchors = ("MatMul", "com.microsoft.FusedMatMul")
    emits = ("com.microsoft.FusedMatMul",)

    def match(self, graph: ir.Graph, matmul: ir.Node):
        transposes = [_transpose_feeding(value) for value in matmul.inputs[:2]]
        if not any(isinstance(t, ir.Node) for t in transposes):
            reason = next((t for t in transposes if isinstance(t, str)), None)
            return fail("transpose", reason or f"no input of {describe(matmul)} comes from a Transpose")
        for flag in ("transBatchA", "transBatchB"):
            if attr(matmul, flag, 0):
                return fail("batch", f"{describe(matmul)} already has {flag}=1; transA/transB would not compose")

        inputs = list(matmul.inputs[:2])
        attributes = {name: a.value for name, a in matmul.attributes.items()}
        nodes = [matmul]
        for index, (flag, transpose) in enumerate(zip(("transA", "transB"), transposes, strict=True)):
            if not isinstance(transpose, ir.Node):
                continue
            inputs[index] = transpose.inputs[0]
            attributes[flag] = 1 - int(attr(matmul, flag, 0))
            if sole_consumer(transpose.outputs[0]) is matmul and transpose not in nodes:
                nodes.append(transpose)
        for name, default in (("alpha", 1.0), ("transA", 0), ("transB", 0)):
            attributes.setdefault(name, default)
        return Match(nodes=nodes, outputs=[matmul.outputs[0]], captures={"inputs": inputs, "attributes": attributes})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FusedMatMul", match.inputs, match.attributes, domain=MS)


def _transpose_feeding(value: ir.Value | None) -> ir.Node | str | None:
    """The Transpose producing `value` when it swaps exactly the last two axes; a reason when
    it swaps them and moves other axes too; None otherwise."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    perm = attr(node, "perm")
    if perm is None:  # no perm reverses the axes, which is a swap of the last two only at rank 2
        input_rank = rank(node.inputs[0])
        if input_rank is None:
            return f"{describe(node)} has no perm and an input of unknown rank"
        perm = list(reversed(range(input_rank)))
    perm = list(perm)
    n = len(perm)
    if n >= 2 and perm == [*range(n - 2), n - 1, n - 2]:
        return node
    if n >= 2 and perm[-1] < perm[-2]:  # swaps the matrix axes but moves batch axes too
        return f"{describe(node)} has perm {perm}; only a swap of the last two axes folds into FusedMatMul"
    # a head split or other layout change, not a matrix transpose
    return f"{describe(node)} has perm {perm}, which keeps the matrix axes in place: not a transpose of them"
