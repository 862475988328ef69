"""What a fused-op count counts: the ops of an optimized graph that are products of fusion.

A count describes the graph an engine runs, not which rule wrote it: a LayerNormalization that an
opset-17 exporter wrote runs exactly as one LayerNormFusion made out of an opset-14 export, so
both count, and a model re-exported at another opset keeps its counts. Which rules fired is a
separate record (the report's `rules`) that explains a count and never alarms.

Products of fusion are every op a rule of ours emits outside ONNX's own domain (com.microsoft's
BiasGelu, SkipLayerNormalization, Attention, FusedConv, ...), the ONNX ops that exist to run
several ops' work as one (ONNX_FUSED_OPS), and onnxruntime's quantization fusions, which no rule of
ours makes (ONNXRUNTIME_QUANTIZED_FUSIONS). ONNX ops a rule merely rewrites (ConvBNFusion's Conv,
ReshapeFusion's Reshape, FuseReluClip's Clip) are ordinary ops and do not count.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from optimizer.levels import LEVELS

# ONNX-domain ops that are one kernel for a multi-op pattern, whoever put them in the graph.
ONNX_FUSED_OPS: tuple[str, ...] = (
    "Gemm",  # MatMul + Add (+ scaling)
    "Gelu",  # opset 20; the Erf or Tanh chain
    "LayerNormalization",  # opset 17
    "RMSNormalization",  # opset 23
    "SimplifiedLayerNormalization",  # onnxruntime's RMS norm, registered in ONNX's domain
    "Attention",  # opset 23
    "RotaryEmbedding",  # opset 23
)


# What onnxruntime fuses a quantized model into, by the rule that does it. A model quantized for the CPU
# (quantize_dynamic: DynamicQuantizeLinear → MatMulInteger → Cast → Mul per product; QDQ exports) runs
# on these at `extended`, and a release that stops making them slows every int8 model: without them
# counted, fusionwatch saw none of it (bench's tiny BERT through quantize_dynamic: DynamicQuantizeMatMul 7
# and MatMulIntegerToFloat 6 in onnxruntime's graph, no count; `python -m bench.quantized_models`). Our optimizer makes none of these;
# MatMulIntegerToFloat, which our MatMulIntegerToFloatFusion makes, counts as every rule's product does.
ONNXRUNTIME_QUANTIZED_FUSIONS: dict[str, str] = {
    "com.microsoft.DynamicQuantizeMatMul": "DynamicQuantizeMatMulFusion",
    **dict.fromkeys(("QLinearConv", "QLinearMatMul", "com.microsoft.QLinearAdd", "com.microsoft.QLinearMul",
                     "com.microsoft.QLinearGlobalAveragePool", "com.microsoft.QLinearAveragePool",
                     "com.microsoft.QLinearConcat", "com.microsoft.QLinearSigmoid", "com.microsoft.QLinearLeakyRelu",
                     "com.microsoft.QLinearSoftmax", "com.microsoft.QLinearWhere", "com.microsoft.QGemm"),
                    "QDQSelectorActionTransformer"),
}


@cache
def fused_op_keys() -> frozenset[str]:
    """Op keys ("LayerNormalization", "com.microsoft.BiasGelu") that count as fused ops."""
    emitted = {key for rules in LEVELS.values() for rule in rules for key in rule.emits if "." in key}
    return frozenset(emitted | set(ONNX_FUSED_OPS) | set(ONNXRUNTIME_QUANTIZED_FUSIONS))


def fused_op_counts(ops_after: Mapping[str, int]) -> dict[str, int]:
    """The fused-op counts of an optimized graph whose op histogram is `ops_after`."""
    keys = fused_op_keys()
    return {op: count for op, count in sorted(ops_after.items()) if op in keys and count > 0}
