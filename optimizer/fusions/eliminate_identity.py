"""EliminateIdentity: Identity(x) -> y  =>  consumers of y read x.

Exporters emit Identity for aliased weights and renamed outputs; it costs a copy at run
time and hides patterns from every rule that follows.

When y is a graph output, x takes over the name y (the driver renames a replacement to
the name of what it replaces), which is only safe when x is an ordinary node output or
an initializer. An Identity that reads a graph input or another graph output is kept:
renaming that value would change the model's interface — in particular a pass-through
from a graph input to a graph output must keep both names.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import describe, stand_in_blocker
from optimizer.rule import Match, Rule, fail


class EliminateIdentity(Rule):
    name = "EliminateIdentity"
    anchors = ("Identity",)

    def match(self, graph: ir.Graph, identity: ir.Node):
        source = identity.inputs[0] if identity.inputs else None
        if source is None:
            return fail("input", f"{describe(identity)} has no input")
        blocker = stand_in_blocker(source)
        if blocker is not None:  # keeping the Identity is correct here, and said so
            return fail("interface", f"kept: {blocker}, which the Identity's output cannot replace")
        return Match(nodes=[identity], outputs=[identity.outputs[0]], captures={"source": source})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return match.source
