"""The narrowest floating type each tensor's value passed through, and how many reductions deep it was
computed, which together set its tolerance (service/domain/tolerances.py).

A float32 tensor computed from float16 ones (the float32 variance of a float16 Llama's RMSNorm, logits
cast up at the end of a float16 model) is only as exact as its float16 inputs: the ulp by which two
engines' float16 tensors differ is still in it, so it is compared at float16's tolerance, not float32's.

Walked over the unfused graph in order: a node's outputs get the narrowest of its inputs' entries, the
types its inputs and outputs declare, a Cast's target and, for a node with subgraphs (If, Loop, Scan),
everything its subgraphs read or declare. Integer and boolean outputs get no entry and pass nothing on:
a Shape or an ArgMax is exact whatever the precision it was taken from, and is compared exactly.
Except quantized data: a quantizer's output (QuantizeLinear, DynamicQuantizeLinear, and the fused ops
that quantize their float input inside: QUANTIZING_OPS) carries "<type> quantized" on, through the
integer tensors of types that hold quantized values or their sums (int8 ... int32: MatMulInteger's
accumulator) and the floats dequantized from them (service/domain/tolerances.py says why).

The depth of a tensor is the number of reductions (a MatMul, a normalization, a Softmax, ...; REDUCTIONS)
on the longest path from the graph's inputs and weights to it. Two correct engines differ where they sum
in another order or precision, and those differences add up along the path like a random walk: the
largest difference measured grows about as the square root of the depth, from 2 (a MatMul block) to 110
(BERT-base's pooler) (docs/numerics.md, "16-bit floats"). Elementwise ops are not counted:
between engines they round alike; a fused kernel that keeps them in float32 against an unfused graph
rounding each to float16 (GELU) makes our fused-against-unfused difference grow a little faster, which
the defaults leave room for. A control-flow node is as deep as its subgraphs' outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from service.domain.tolerances import Tolerance, Tolerances, is_float, is_quantized, narrowest, quantized


@dataclass(frozen=True)
class TensorTolerances:
    """A project's tolerances and, per tensor name, the narrowest type its value passed through."""

    tolerances: Tolerances
    narrowest: Mapping[str, str] = field(default_factory=dict)
    depths: Mapping[str, int] = field(default_factory=dict)  # reductions deep; a name not here: 1

    def of(self, name: str, dtype: str) -> Tolerance | None:
        """The tolerance of tensor `name` whose values are of numpy type `dtype`; None: compared exactly."""
        entry = self.narrowest.get(name)
        if not is_float(dtype):  # integers: exact, unless they hold quantized values
            return self.tolerances.for_dtype(entry, self.depths.get(name, 1)) if is_quantized(entry) else None
        return self.tolerances.for_dtype(narrowest(dtype, entry) or dtype, self.depths.get(name, 1))

    @classmethod
    def of_graph(cls, tolerances: Tolerances, graph: ir.Graph) -> TensorTolerances:
        return cls(tolerances, narrowest_floats(graph), reduction_depths(graph))


def narrowest_floats(graph: ir.Graph) -> dict[str, str]:
    """Tensor name -> numpy name of the narrowest floating type in its computation, for every value
    that has one (graph inputs, initializers, node outputs)."""
    found: dict[str, str] = {}
    for value in [*graph.inputs, *graph.initializers.values()]:
        if (dtype := _declared(value)) is not None:
            found[value.name] = dtype
    for node in graph:
        reads = narrowest(*(_entry(found, value) for value in node.inputs), *_subgraph_types(node, found),
                          _quantizes(node))
        for value in node.outputs:
            declared = _declared(value) or _produced_type(node)
            if value.dtype is not None and not is_float(_name(value.dtype)):
                if is_quantized(reads) and _name(value.dtype) in QUANTIZED_DATA:
                    found[value.name] = reads
                continue  # otherwise exact: compared as integers, and it carries no rounding on
            if (dtype := narrowest(reads, declared)) is not None:
                found[value.name] = dtype
    return found


# Ops that round a float input to a quantized integer one, by op type in any domain; the fused ones
# (onnxruntime's DynamicQuantizeMatMul, QAttention) quantize their activation to uint8 inside.
QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM",
                            "QAttention"})
# Integer types of quantized values and of their sums; int64 is an index, a shape or a count: exact.
QUANTIZED_DATA = frozenset({"int4", "uint4", "int8", "uint8", "int16", "uint16", "int32"})
# MatMulNBits quantizes its activation to int8 at accuracy_level 4 (its weights are 4-bit either way,
# identical in both engines, so only that rounding sets a tolerance).
INT8_ACTIVATION_ACCURACY = 4


def _quantizes(node: ir.Node) -> str | None:
    """The precision a node that quantizes its float input gives its outputs, else None."""
    if node.op_type == "MatMulNBits":
        level = node.attributes.get("accuracy_level")
        return quantized("int8") if level is not None and level.value == INT8_ACTIVATION_ACCURACY else None
    if node.op_type not in QUANTIZING_OPS:
        return None
    output = node.outputs[0] if node.outputs else None
    return quantized(_name(output.dtype) if output is not None and output.dtype is not None else "")


# Reductions each op stands for, by op type in any domain: a fused op counts what it fused (Attention:
# the QKV projection, QK^T, Softmax, ·V). Max/Min reductions and pooling by max are exact; elementwise
# ops are one rounding each, not a sum (the module docstring says why they are left out).
REDUCTIONS = {
    **dict.fromkeys((
        "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "CumSum", "DFT", "STFT", "RNN", "GRU", "LSTM",
        "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
        "ReduceProd", "AveragePool", "GlobalAveragePool", "LpPool", "GlobalLpPool", "LRN",
        "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization",
        "LpNormalization", "MeanVarianceNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
        "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization",
        "FusedMatMul", "FusedGemm", "FusedConv", "NhwcConv", "MatMulNBits", "GemmFastGelu", "BiasSoftmax",
        "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "QGemm", "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul", "QLinearSoftmax", "QLinearGlobalAveragePool", "QLinearAveragePool",
    ), 1),
    **dict.fromkeys(("MultiHeadAttention", "GroupQueryAttention", "PackedMultiHeadAttention", "SparseAttention",
                     "DecoderMaskedMultiHeadAttention"), 3),
    **dict.fromkeys(("Attention", "PackedAttention", "QAttention"), 4),  # com.microsoft's, with the QKV projection
}  # fmt: skip


def reduction_depths(graph: ir.Graph, outer: Mapping[str, int] | None = None) -> dict[str, int]:
    """Tensor name -> reductions on the longest path to it (graph inputs and initializers: 0)."""
    depths: dict[str, int] = dict(outer or {})
    for node in graph:
        deepest = max((depths.get(value.name, 0) for value in node.inputs if value is not None), default=0)
        for subgraph in _subgraphs(node):
            inner = reduction_depths(subgraph, depths)
            deepest = max([deepest, *(inner.get(value.name, 0) for value in subgraph.outputs)])
        depth = deepest + REDUCTIONS.get(node.op_type, 0)
        for value in node.outputs:
            depths[value.name] = depth
    return depths


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            yield attribute.value
        elif attribute.type == ir.AttributeType.GRAPHS:
            yield from attribute.value


def _entry(found: dict[str, str], value: ir.Value | None) -> str | None:
    if value is None:
        return None
    return narrowest(found.get(value.name), _declared(value))


def _subgraph_types(node: ir.Node, found: dict[str, str]) -> Iterator[str | None]:
    """What a control-flow node's subgraphs read from outside and compute in, nested ones included."""
    for subgraph in _subgraphs(node):
        inner = narrowest_floats(subgraph)
        yield narrowest(*inner.values())
        for inner_node in ir.traversal.RecursiveGraphIterator(subgraph):
            for value in inner_node.inputs:
                yield _entry(found, value)


def _produced_type(node: ir.Node) -> str | None:
    """The type a Cast or a Constant makes, which the graph rarely records on the value itself."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Cast" and "to" in node.attributes:
        return _name(ir.DataType(node.attributes["to"].value))
    if node.op_type == "Constant" and "value" in node.attributes:
        return _name(node.attributes["value"].value.dtype)
    return None


def _declared(value: ir.Value) -> str | None:
    dtype = _name(value.dtype) if value.dtype is not None else None
    return dtype if dtype is not None and is_float(dtype) else None


def _name(dtype: ir.DataType) -> str:
    try:
        return dtype.numpy().name
    except (TypeError, ValueError, NotImplementedError):  # a type numpy has no name for (string, float4)
        return dtype.name.lower()
