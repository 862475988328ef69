"""EliminateDropout: Dropout in inference mode  =>  its input.

At inference Dropout is the identity, unless it runs in training mode (opset 12+
`training_mode` input true) or a consumer reads its mask. Both stop the elimination and
are reported as near misses, since a user usually expects an exported model's Dropout to
vanish.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import const_array, consumers, describe, input_at, stand_in_blocker, value_name
from optimizer.rule import Match, Rule, fail


class EliminateDropout(Rule):
    name = "EliminateDropout"
    anchors = ("Dropout",)

    def match(self, graph: ir.Graph, dropout: ir.Node):
        training_mode = input_at(dropout, 2)
        if training_mode is not None:
            flag = const_array(training_mode)
            if flag is None:
                return fail("training_mode", f"training_mode '{value_name(training_mode)}' is not a constant")
            if bool(flag.reshape(-1)[0]):
                return fail("training_mode", "Dropout runs in training mode (training_mode is true)")
        if len(dropout.outputs) > 1:
            mask = dropout.outputs[1]
            if mask.is_graph_output():
                return fail("mask", f"mask output '{value_name(mask)}' is a graph output")
            users = consumers(mask)
            if users:
                return fail("mask", f"mask output '{value_name(mask)}' is read by {describe(users[0])}", users[0])
        source = dropout.inputs[0]
        blocker = stand_in_blocker(source)
        if blocker is not None:  # keeping it costs one copy; removing it would rename the interface
            return fail("interface", f"kept: {blocker}, which the Dropout's output cannot replace")
        return Match(nodes=[dropout], outputs=[dropout.outputs[0]], captures={"source": source})

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return match.source
