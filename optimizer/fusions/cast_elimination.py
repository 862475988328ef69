"""CastElimination: Cast(x, to=T) where x already is T  =>  x (ONNX Runtime's rule of that name).

TorchScript writes `.to(dtype)`, `.long()` and `.float()` whether or not the value already has that
type: Falcon's and ModernBERT's shape arithmetic Casts int64 sizes to int64 and the rotary tables'
float to float, a dozen per model that onnxruntime's session removes and ours kept. A Cast to the
type its input has copies the data unchanged (the `saturate` attribute only matters for float8
targets, and there only on a conversion), so its readers can read the input instead.

The input's type must be known: an input of unknown type could be anything, and the Cast is then
the only thing fixing the type its readers see. A graph input or graph output input is kept, as
EliminateIdentity keeps it, so the model's interface keeps its names.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import attr, describe, stand_in_blocker, value_name
from optimizer.rule import Match, Rule, fail


class CastElimination(Rule):
    name = "CastElimination"
    anchors = ("Cast",)

    def match(self, graph: ir.Graph, cast: ir.Node):
        source = cast.inputs[0] if cast.inputs else None
        if source is None:
            return fail("input", f"{describe(cast)} has no input")
        to = attr(cast, "to", None)
        if source.dtype is None:
            return fail("type", f"the type of its input '{value_name(source)}' is not known")
        if not isinstance(to, int):
            return fail("type", f"{describe(cast)} has no integer 'to' attribute")
        if to != source.dtype.value:
            return fail("type", f"it converts {source.dtype.name} to {_type_name(to)}")
        blocker = stand_in_blocker(source)
        if blocker is not None:
            return fail("interface", f"kept: {blocker}, which the Cast's output cannot replace")
        return Match(nodes=[cast], outputs=[cast.outputs[0]], captures={"source": source})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return match.source


def _type_name(to: int) -> str:
    try:
        return ir.DataType(to).name
    except ValueError:
        return f"type {to}"


__all__ = ["CastElimination"]
