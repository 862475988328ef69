"""GemmActivationFusion: Gemm -> activation  =>  com.microsoft.FusedGemm.

FusedGemm keeps Gemm's alpha, beta, transA and transB, names the activation in
`activation`, and carries each activation attribute as `activation_<name>`
(activation_alpha, activation_beta, activation_gamma), as ONNX Runtime writes it.
ONNX Runtime's kernel reads those attributes without defaults, so the ONNX defaults
are written out for an activation node that left them implicit.
"""

from __future__ import annotations

import onnx_ir as ir

from optimizer.match import MS, attr, consumers, describe, is_op
from optimizer.rule import Match, Rule, fail

# The activations FusedGemm runs, with each one's attributes and their ONNX defaults.
ACTIVATION_DEFAULTS: dict[str, dict[str, float]] = {
    "Relu": {},
    "Sigmoid": {},
    "Tanh": {},
    "Softplus": {},
    "Softsign": {},
    "LeakyRelu": {"alpha": 0.01},
    "Elu": {"alpha": 1.0},
    "ThresholdedRelu": {"alpha": 1.0},
    "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
}
GEMM_ATTRIBUTES = ("alpha", "beta", "transA", "transB")


class GemmActivationFusion(Rule):
    name = "GemmActivationFusion"
    anchors = ("Gemm",)
    emits = ("com.microsoft.FusedGemm",)

    def match(self, graph: ir.Graph, gemm: ir.Node):
        activation = next(
            (n for n in consumers(gemm.outputs[0]) if any(is_op(n, op) for op in ACTIVATION_DEFAULTS)), None
        )
        if activation is None:
            readers = ", ".join(describe(n) for n in consumers(gemm.outputs[0])) or "nothing"
            return fail("activation", f"output of {describe(gemm)} feeds {readers}, no activation FusedGemm takes")
        attributes = {name: attr(gemm, name) for name in GEMM_ATTRIBUTES if name in gemm.attributes}
        attributes["activation"] = activation.op_type
        for name, default in ACTIVATION_DEFAULTS[activation.op_type].items():
            attributes[f"activation_{name}"] = float(attr(activation, name, default))
        inputs = list(gemm.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        return Match(
            nodes=[gemm, activation],
            outputs=[activation.outputs[0]],
            captures={"inputs": inputs, "attributes": attributes},
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        return op.op("FusedGemm", match.inputs, match.attributes, domain=MS)
