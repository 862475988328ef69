"""PadFusion: Pad(x, constant zeros on the spatial axes) -> Conv  =>  Conv with those pads added to its own.

Exporters write "same" padding of TensorFlow-style models (MobileNet, EfficientNet) as an explicit
Pad before each Conv; the Conv pads with zeros itself, so the Pad's copy of the input goes away.
Only what Conv's own padding computes is taken: constant mode with value 0, nothing padded on the
batch or channel axes, no negative pads (cropping), a Conv whose auto_pad is NOTSET, and a Pad that
feeds nothing else. ONNX Runtime's name for the rule, and its conditions.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    attr,
    const_array,
    consumers,
    describe,
    input_at,
    is_op,
    opset,
    sole_consumer,
    value_name,
)
from optimizer.rule import Match, Rule, fail


class PadFusion(Rule):
    name = "PadFusion"
    anchors = ("Pad",)
    emits = ()  # the Conv it leaves is the one that was there

    def match(self, graph: ir.Graph, pad: ir.Node):
        output = pad.outputs[0]
        conv = sole_consumer(output)
        if not is_op(conv, "Conv"):
            readers = consumers(output)
            reader = (describe(conv) if conv is not None else "a graph output" if output.is_graph_output()
                      else f"{len(readers)} nodes")
            return fail("consumer", f"the Pad's output feeds {reader}, not one Conv alone")
        if conv.inputs[0] is not pad.outputs[0]:
            return fail("consumer", f"the Pad's output is not the data input of {describe(conv)}")
        mode = attr(pad, "mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            return fail("mode", f"Pad mode is '{mode}'; a Conv pads with zeros only")
        pads = _pads(pad, opset(graph))
        if pads is None:
            return fail("pads", f"pads '{value_name(input_at(pad, 1))}' are not constant")
        value = input_at(pad, 2) if opset(graph) >= 11 else None
        fill = np.zeros(1) if value is None else const_array(value)
        if fill is None or fill.size > 1 or np.any(fill != 0):
            return fail("value", f"the Pad's value '{value_name(value)}' is not a constant 0")
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            return fail("axes", "the Pad names its axes; only pads over every axis are read")
        rank = len(pads) // 2
        if any(p < 0 for p in pads):
            return fail("pads", f"pads {pads} crop (negative); a Conv's pads cannot")
        if pads[0] or pads[1] or pads[rank] or pads[rank + 1]:
            return fail("pads", f"pads {pads} pad the batch or channel axis; a Conv pads spatial axes only")
        auto_pad = attr(conv, "auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if auto_pad != "NOTSET":
            return fail("auto_pad", f"{describe(conv)} has auto_pad {auto_pad}; its pads are computed")
        spatial = rank - 2
        own = list(attr(conv, "pads", [0] * (2 * spatial)))
        merged = [own[i] + pads[2 + i] for i in range(spatial)] + [
            own[spatial + i] + pads[rank + 2 + i] for i in range(spatial)]
        return Match(nodes=[pad, conv], outputs=[conv.outputs[0]], captures={"conv": conv, "pads": merged})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        conv, pad = match.conv, match.nodes[0]
        attributes = {name: a for name, a in conv.attributes.items() if name != "pads"}
        inputs = [pad.inputs[0], *conv.inputs[1:]]
        return op.op("Conv", inputs, attributes={**attributes, "pads": match.pads}, name=conv.name)


def _pads(pad: ir.Node, graph_opset: int) -> list[int] | None:
    if graph_opset < 11:
        pads = attr(pad, "pads")
        return None if pads is None else [int(p) for p in pads]
    pads = const_array(input_at(pad, 1))
    return None if pads is None else [int(p) for p in pads.reshape(-1)]
