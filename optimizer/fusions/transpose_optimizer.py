"""TransposeOptimizer: transposes that undo each other go, directly or across an elementwise op.

    Transpose(Transpose(x, Q), P)                      =>  x, or one Transpose(x, Q then P)
    Transpose(Add(Transpose(a, Q), Transpose(b, Q)), P) with P undoing Q  =>  Add(a, b)
                                                            (Sub, Mul, Div alike)

Vision exports move between channels-first convolutions and channels-last norms and linears
(ConvNeXt: Conv, permute, LayerNorm, MLP, permute back, residual Add, permute again), leaving pairs
that cancel. An elementwise op of two inputs permuted alike computes the same numbers permuted, so
the permutation after it cancels the ones before it. An inner Transpose read elsewhere stays for
its other readers. ONNX Runtime's transpose optimizer does this and more (pushing transposes through
any layout-agnostic op); its name is kept so a `disabled_optimizers` list carries over.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import attr, describe, is_op, producer, sole_consumer, stand_in_blocker
from optimizer.rule import Match, Rule, fail

ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


class TransposeOptimizer(Rule):
    name = "TransposeOptimizer"
    anchors = ("Transpose",)
    # Attention and rotary rules read exporters' transposes of Q, K and V as they were written.
    runs_after_others = True

    def match(self, graph: ir.Graph, outer: ir.Node):
        perm = _perm(outer)
        if perm is None:
            return fail("perm", f"{describe(outer)} has no perm (it reverses the axes of an input of unknown rank)")
        source = producer(outer.inputs[0])
        if is_op(source, "Transpose"):
            inner = _perm(source)
            if inner is None or len(inner) != len(perm):
                return fail("inner", f"{describe(source)} before it has no perm of the same rank")
            composed = [inner[axis] for axis in perm]
            blocker = stand_in_blocker(source.inputs[0])
            if composed == list(range(len(perm))) and blocker is not None:
                return fail("interface", f"kept: {blocker}, which the Transposes' output cannot replace")
            nodes = [source, outer] if sole_consumer(source.outputs[0]) is outer else [outer]
            return Match(nodes=nodes, outputs=[outer.outputs[0]],
                         captures={"x": source.inputs[0], "composed": composed, "form": "pair"})
        if not any(is_op(source, op) for op in ELEMENTWISE):
            return fail("source", f"{describe(outer)} transposes {describe(source)}, neither a Transpose nor an "
                                  f"elementwise {'/'.join(ELEMENTWISE)} of transposed inputs")
        if sole_consumer(source.outputs[0]) is not outer:
            return fail("source", f"the result of {describe(source)} is also read elsewhere, in its own layout")
        transposes = [producer(value) for value in source.inputs]
        for value, node in zip(source.inputs, transposes, strict=True):
            inner = _perm(node) if is_op(node, "Transpose") else None
            if inner is None or len(inner) != len(perm) or [inner[axis] for axis in perm] != list(range(len(perm))):
                return fail("inputs", f"input '{value.name}' of {describe(source)} is not transposed by the "
                                      f"inverse of {describe(outer)}'s perm {perm}", node)
        removable = [node for node in dict.fromkeys(transposes) if sole_consumer(node.outputs[0]) is source]
        return Match(nodes=[*removable, source, outer], outputs=[outer.outputs[0]],
                     captures={"elementwise": source, "inputs": [node.inputs[0] for node in transposes],
                               "form": "elementwise"})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        if match.form == "pair":
            if match.composed == list(range(len(match.composed))):
                return match.x
            return op.op("Transpose", [match.x], {"perm": match.composed})
        node = match.elementwise
        return op.op(node.op_type, match.inputs, name=node.name)


def _perm(node: ir.Node) -> list[int] | None:
    perm = attr(node, "perm")
    return None if perm is None else [int(axis) for axis in perm]
