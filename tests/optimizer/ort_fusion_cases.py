"""ONNX Runtime's own fusion test cases: its test models and the op counts its tests expect.

The models are `onnxruntime/test/testdata/transform/fusion/*.onnx` in ONNX Runtime's repository;
the counts are transcribed from `onnxruntime/test/optimizer/graph_transform_test.cc` and
`graph_transform_test_layernorm.cc` (the test named in each case). They are not shipped here: point
`FUSIONWATCH_ORT_TESTDATA` at a folder holding them (`tools/fusion_table.py --help` says how to
get them). Each case runs only the rules its ONNX Runtime test registers, so the counts of the
ops those rules leave alone compare too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ENV = "FUSIONWATCH_ORT_TESTDATA"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "var" / "ort_fusion"

GELU = ("GeluFusion",)
BIAS_GELU = ("GeluFusion", "BiasGeluFusion")
FAST_GELU = ("FastGeluFusion",)
# CSE is part of the FastGelu-with-casts test: two identical Casts become one before the fusion.
CSE_FAST_GELU = ("CommonSubexpressionElimination", "FastGeluFusion")
FAST_BIAS_GELU = ("FastGeluFusion", "BiasGeluFusion")
LAYER_NORM = ("LayerNormFusion",)
SIMPLIFIED = ("SimplifiedLayerNormFusion",)
SKIP = ("LayerNormFusion", "SkipLayerNormFusion")
# ORT's EmbedLayerNorm and Attention fusions walk the shape arithmetic (Shape, Gather, Unsqueeze,
# Concat) themselves; ours meet it folded, so those cases also run our cleanups and ConstantFolding
# first, as every level does.
CLEANUPS = ("EliminateIdentity", "EliminateDropout", "EliminateSlice", "UnsqueezeElimination",
            "ConstantFolding", "CommonSubexpressionElimination", "ReshapeFusion")
EMBED = (*CLEANUPS, "EmbedLayerNormFusion")
ATTENTION = (*CLEANUPS, "AttentionFusion")


@dataclass(frozen=True)
class OrtCase:
    test: str  # ONNX Runtime's TEST_F name
    model: str  # file name under testdata/transform/fusion
    rules: tuple[str, ...]
    expected: dict[str, int] = field(default_factory=dict)  # op key -> count after the fusion
    at_least: dict[str, int] = field(default_factory=dict)  # op key -> lower bound (ORT's `> 0`)
    # Where we differ on purpose: the counts we give instead, and why (shown in the README table).
    ours: dict[str, int] | None = None
    why: str = ""

    @property
    def fused_ops(self) -> list[str]:
        return [op for op in self.expected if "." in op or op in FUSED_STANDARD_OPS]


FUSED_STANDARD_OPS = {"Gelu", "LayerNormalization", "SimplifiedLayerNormalization"}


def _skip(test, model, add, ln, skip_ln, cast, ours=None, why=""):
    expected = {"Div": 0, "Add": add, "Sub": 0, "ReduceMean": 0, "Pow": 0, "Sqrt": 0,
                "LayerNormalization": ln, "com.microsoft.SkipLayerNormalization": skip_ln, "Cast": cast}
    return OrtCase(test, model, SKIP, expected, ours=ours, why=why)


# onnxruntime's SkipLayerNormFusion (skip_layer_norm_fusion.cc, CheckFirstAdd) wants the residual
# Add read by the LayerNorm alone and not a graph output, because it never wires
# SkipLayerNormalization's optional 4th output, input_skip_bias_sum. Ours does: the sum leaves
# the fused op there, so the graph stays exact (tests/optimizer/test_ort_fusion_cases.py checks it
# in onnxruntime) and pre-LN models (GPT-2, Llama), whose every residual sum also feeds the next
# residual Add, keep their fusions.
_SUM_OUTPUT = ("onnxruntime does not fuse when the residual sum has another reader; we expose it "
               "as SkipLayerNormalization's 4th output")
_FUSED_WITH_SUM = {"Div": 0, "Add": 0, "Sub": 0, "ReduceMean": 0, "Pow": 0, "Sqrt": 0, "LayerNormalization": 0,
                   "com.microsoft.SkipLayerNormalization": 1, "Cast": 0}


_GONE_ERF = {"Div": 0, "Add": 0, "Erf": 0, "Mul": 0}
_GONE_TANH = {"Add": 0, "Tanh": 0, "Mul": 0}
_FORMAT3 = {"Shape": 0, "Expand": 0, "Gather": 0, "Unsqueeze": 0, "LayerNormalization": 0,
            "com.microsoft.SkipLayerNormalization": 0, "ReduceSum": 1, "MatMul": 1, "Add": 2, "Cast": 3,
            "com.microsoft.Attention": 1, "com.microsoft.EmbedLayerNormalization": 1}
_DISTILBERT = {"com.microsoft.EmbedLayerNormalization": 1, "com.microsoft.Attention": 1, "Cast": 2,
               "Shape": 0, "Gather": 0, "Unsqueeze": 0, "ReduceSum": 1}
_ATTENTION = {"MatMul": 1, "Add": 2, "Transpose": 0, "Reshape": 0, "com.microsoft.Attention": 1}
_GPT_ATTENTION = {"Transpose": 0, "Softmax": 0, "com.microsoft.Attention": 1}

CASES: list[OrtCase] = [
    OrtCase("GeluFusionTest", "gelu.onnx", GELU, {**_GONE_ERF, "com.microsoft.Gelu": 1}),
    OrtCase("GeluFusionTest_Opset20", "gelu_opset20.onnx", GELU, {**_GONE_ERF, "Gelu": 1}),
    OrtCase("GeluFusionTestSwitchOrderFormat2", "gelu_format2_0.onnx", GELU, {**_GONE_ERF, "com.microsoft.Gelu": 1}),
    OrtCase("GeluFusionTestFormat2", "gelu_format2_1.onnx", GELU, {**_GONE_ERF, "com.microsoft.Gelu": 1}),
    OrtCase("GeluFusionTestFormat2GraphInput", "gelu_format2_1_use_graph_input.onnx", GELU,
            {**_GONE_ERF, "com.microsoft.Gelu": 1}),
    OrtCase("GeluFusionTestFormat2GraphOutput", "gelu_format2_0_with_bias_use_graph_output.onnx", BIAS_GELU,
            {"com.microsoft.Gelu": 0, "com.microsoft.BiasGelu": 0}),
    OrtCase("BiasGeluTest", "bias_gelu_fusion.onnx", BIAS_GELU,
            {**_GONE_ERF, "com.microsoft.Gelu": 0, "com.microsoft.BiasGelu": 1}),
    OrtCase("BiasOnnxGeluTest", "bias_onnx_gelu_fusion.onnx", BIAS_GELU,
            {"Add": 0, "Gelu": 0, "com.microsoft.FastGelu": 0, "com.microsoft.BiasGelu": 1}),
    OrtCase("BiasOnnxFastGeluTest", "bias_onnx_fast_gelu_fusion.onnx", BIAS_GELU,
            {"Add": 0, "Gelu": 0, "com.microsoft.FastGelu": 1, "com.microsoft.BiasGelu": 0}),
    OrtCase("FastGeluFusionTest", "fast_gelu.onnx", FAST_GELU,
            {"Identity": 2, **_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluUseGraphInputFusionTest", "fast_gelu_use_graph_input.onnx", FAST_GELU,
            {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluWithBiasFusionTest", "fast_gelu_with_bias.onnx", FAST_BIAS_GELU,
            {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluWithBiasUseGraphInputFusionTest", "fast_gelu_with_bias_use_graph_input.onnx", FAST_BIAS_GELU,
            {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluFusionTest2", "fast_gelu2.onnx", FAST_GELU, {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluUseGraphInputFusionTest2", "fast_gelu2_use_graph_input.onnx", FAST_GELU,
            {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluWithBiasFusionTest2", "fast_gelu2_with_bias.onnx", FAST_BIAS_GELU,
            {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluWithBiasUseGraphInputFusionTest2", "fast_gelu2_with_bias_use_graph_input.onnx",
            FAST_BIAS_GELU, {**_GONE_TANH, "com.microsoft.FastGelu": 1}),
    OrtCase("FastGeluFusionWithCastsTest3", "fast_gelu3_with_casts.onnx", CSE_FAST_GELU,
            {**_GONE_TANH, "Cast": 1, "com.microsoft.FastGelu": 1}),
    OrtCase("LayerNormFusionTest", "layer_norm.onnx", LAYER_NORM,
            {"Div": 0, "Add": 0, "Sub": 0, "ReduceMean": 0, "Pow": 0, "Sqrt": 0, "LayerNormalization": 1}),
    OrtCase("TwoLayerNormShareSameInput", "layer_norm_shared_input.onnx", LAYER_NORM, {"LayerNormalization": 2}),
    OrtCase("LayerNormWithCastFusionTest", "layer_norm_with_cast.onnx", LAYER_NORM,
            {"Cast": 0, "LayerNormalization": 1}),
    OrtCase("LayerNormWithCastFusionTest_2", "layer_norm_with_cast_2.onnx", LAYER_NORM,
            {"Cast": 0, "LayerNormalization": 1}),
    OrtCase("LayerNormWithCastFusionTest_3", "layer_norm_with_cast_3.onnx", LAYER_NORM,
            {"Cast": 0, "LayerNormalization": 1}),
    OrtCase("LayerNormWithCastFusionTest_4", "layer_norm_with_cast_4.onnx", LAYER_NORM,
            {"Cast": 0, "LayerNormalization": 1}),
    OrtCase("LayerNormWithSubDupFusionTest", "layer_norm_sub_dup.onnx", LAYER_NORM, {"LayerNormalization": 0},
            at_least={"Div": 1, "Add": 1, "Sub": 1, "ReduceMean": 1, "Pow": 1, "Sqrt": 1}),
    OrtCase("LayerNormScaleBiasTest", "layer_norm_fusion_scale_bias.onnx", LAYER_NORM,
            {"ReduceMean": 0, "Sub": 0, "Cast": 0, "Pow": 0, "Add": 0, "Sqrt": 0, "Div": 0, "Mul": 0,
             "LayerNormalization": 1}),
    OrtCase("SimplifiedLayerNormFusionTest", "layer_norm_t5.onnx", SIMPLIFIED,
            {"Div": 0, "Add": 0, "ReduceMean": 0, "Pow": 0, "Sqrt": 0, "SimplifiedLayerNormalization": 1}),
    # On the CPU provider ORT leaves this one alone: its Casts run the norm in float32 on float16
    # data, and SimplifiedLayerNormalization's CPU kernel takes one type throughout.
    OrtCase("SimplifiedLayerNormWithCastsFusionTest", "simplified_layer_norm_with_casts.onnx", SIMPLIFIED,
            {"SimplifiedLayerNormalization": 0}),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format1.onnx", 0, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format2.onnx", 0, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format3.onnx", 0, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format1_partial.onnx", 1, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format2_partial.onnx", 1, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format3_no_fusion.onnx", 1, 1, 0, 0,
          ours=_FUSED_WITH_SUM, why=_SUM_OUTPUT),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format1_graph_output.onnx", 1, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format2_graph_output.onnx", 1, 0, 1, 0),
    _skip("SkipLayerNormFusionTest", "skip_layer_norm_format3_graph_output.onnx", 1, 1, 0, 0,
          ours=_FUSED_WITH_SUM, why=_SUM_OUTPUT),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format1_with_cast.onnx", 0, 0, 1, 3),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format2_with_cast.onnx", 0, 0, 1, 3),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format3_with_cast.onnx", 0, 0, 1, 2),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format1_partial_with_cast.onnx", 1, 0, 1, 2),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format2_partial_with_cast.onnx", 1, 0, 1, 2),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format3_no_fusion_with_cast.onnx", 1, 1, 0, 0),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format1_graph_output_with_cast.onnx", 1, 0, 1, 2),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format2_graph_output_with_cast.onnx", 1, 0, 1, 2),
    _skip("SkipLayerNormFusionWithCastTest", "skip_layer_norm_format3_graph_output_with_cast.onnx", 1, 1, 0, 0),
    OrtCase("SkipLayerNormFusion_NoBeta", "skip_layer_norm_no_beta.onnx", SKIP,
            {"Add": 0, "LayerNormalization": 0, "com.microsoft.SkipLayerNormalization": 1, "Cast": 0}),
    OrtCase("SkipLayerNormFusion_NoBeta", "skip_layer_norm_no_beta_with_cast.onnx", SKIP,
            {"Add": 0, "LayerNormalization": 0, "com.microsoft.SkipLayerNormalization": 1, "Cast": 2}),
    OrtCase("EmbedLayerNormFusionFormat1", "embed_layer_norm_format1.onnx", EMBED,
            {"Gather": 0, "Add": 0, "ReduceSum": 1, "com.microsoft.Attention": 1,
             "com.microsoft.SkipLayerNormalization": 0, "com.microsoft.EmbedLayerNormalization": 1}),
    OrtCase("EmbedLayerNormFusionFormat2", "embed_layer_norm_format2.onnx", EMBED,
            {"Shape": 0, "Expand": 0, "Gather": 0, "Unsqueeze": 0, "ConstantOfShape": 0, "NonZero": 0,
             "Transpose": 0, "Squeeze": 0, "Add": 0, "ReduceSum": 1, "com.microsoft.Attention": 1,
             "com.microsoft.SkipLayerNormalization": 0, "com.microsoft.EmbedLayerNormalization": 1}),
    OrtCase("EmbedLayerNormFusionFormat3", "embed_layer_norm_format3.onnx", EMBED, _FORMAT3),
    OrtCase("EmbedLayerNormFusionFormat3_OpSet13", "embed_layer_norm_format3_opset13.onnx", EMBED, _FORMAT3),
    OrtCase("EmbedLayerNormFusionFormat3NoCast", "embed_layer_norm_format3_no_cast.onnx", EMBED, _FORMAT3),
    OrtCase("EmbedLayerNormFusionFormat3NoCast_OpSet13", "embed_layer_norm_format3_no_cast_opset13.onnx", EMBED,
            _FORMAT3),
    OrtCase("EmbedLayerNormFusionFormat4", "embed_layer_norm_format4.onnx", EMBED,
            {"Shape": 0, "Expand": 0, "Gather": 0, "Concat": 0, "Unsqueeze": 0, "ConstantOfShape": 0,
             "NonZero": 0, "Transpose": 0, "Squeeze": 0, "Add": 0, "ReduceSum": 1, "com.microsoft.Attention": 1,
             "com.microsoft.SkipLayerNormalization": 0, "com.microsoft.EmbedLayerNormalization": 1}),
    OrtCase("EmbedLayerNormFusionFormat5", "embed_layer_norm_format5.onnx", EMBED,
            {"Gather": 0, "LayerNormalization": 0, "com.microsoft.SkipLayerNormalization": 0, "ReduceSum": 1,
             "MatMul": 1, "Add": 2, "Cast": 3, "com.microsoft.Attention": 1,
             "com.microsoft.EmbedLayerNormalization": 1}),
    OrtCase("EmbedLayerNormFusionFormat6", "embed_layer_norm_format6.onnx", EMBED,
            {**_FORMAT3, "Reshape": 0, "Equal": 0, "Where": 0}),
    OrtCase("EmbedLayerNormFusionFormat7", "embed_layer_norm_format7.onnx", EMBED, _DISTILBERT),
    OrtCase("EmbedLayerNormFusionFormat8", "embed_layer_norm_format8.onnx", EMBED, _DISTILBERT),
    OrtCase("EmbedLayerNormFusionFormat9", "embed_layer_norm_format9.onnx", EMBED,
            {**_DISTILBERT, "Shape": 1, "Gather": 2, "Unsqueeze": 2}),
    OrtCase("EmbedLayerNormFusionMultiple", "embed_layer_norm_multiple.onnx", EMBED,
            {"Shape": 0, "Expand": 0, "Gather": 0, "Unsqueeze": 0, "LayerNormalization": 0,
             "com.microsoft.SkipLayerNormalization": 0, "ReduceSum": 2, "MatMul": 2, "Add": 5, "Cast": 6,
             "com.microsoft.Attention": 2, "com.microsoft.EmbedLayerNormalization": 2}),
    OrtCase("AttentionFusionInt32Test", "attention_int32_mask.onnx", ATTENTION, {**_ATTENTION, "Cast": 0}),
    OrtCase("AttentionFusionInt64Test", "attention_symbolic_batch.onnx", ATTENTION, {**_ATTENTION, "Cast": 1}),
    OrtCase("AttentionFusionFloat32Test", "attention_mask_no_cast.onnx", ATTENTION,
            {**_ATTENTION, "Mul": 0, "Div": 0, "Sub": 0, "Unsqueeze": 0}),
    OrtCase("AttentionFusionWithPastAndUnidirMaskTest", "attention_past_unidir.onnx", ATTENTION, _GPT_ATTENTION),
    OrtCase("AttentionFusionWithPastAndNoUnidirMaskTest", "attention_past_no_unidir.onnx", ATTENTION,
            _GPT_ATTENTION),
    OrtCase("AttentionFusionGPTWithPastAndMaskTest", "gpt2_past_mask_one_layer.onnx", ATTENTION, _GPT_ATTENTION),
    OrtCase("AttentionFusionGPTWithPastNoMaskTest", "gpt2_past_one_layer.onnx", ATTENTION, _GPT_ATTENTION),
    OrtCase("AttentionFusionGPTTest", "gpt2_one_layer.onnx", ATTENTION, _GPT_ATTENTION),
    OrtCase("AttentionFusionDistilBertTest", "attention_distilbert.onnx", ATTENTION,
            {"ReduceSum": 0, "com.microsoft.Attention": 1, "Gather": 0, "Unsqueeze": 0, "Concat": 0,
             "Transpose": 0, "Softmax": 0, "Shape": 0}),
]


def ort_testdata_dir() -> Path | None:
    """The folder holding ONNX Runtime's fusion test models, or None when there is none."""
    folder = Path(os.environ.get(ENV) or DEFAULT_DIR)
    return folder if folder.is_dir() and any(folder.glob("*.onnx")) else None


def run_case(case: OrtCase, folder: Path) -> tuple[dict[str, int], dict[str, tuple[int, str]]]:
    """Our optimizer on one case with only the case's rules: (op counts after, mismatches).

    A mismatch maps an op key to (our count, what ONNX Runtime's test expects, or for a case
    where we differ on purpose, what we give instead)."""
    from collections import Counter

    from optimizer import optimize
    from optimizer.levels import known_rule_names
    from optimizer.match import op_key

    disabled = [name for name in known_rule_names() if name not in case.rules]
    result = optimize(str(folder / case.model), "extended", disabled=disabled)
    counts = Counter(op_key(node) for node in result.model.graph)
    expected = case.ours if case.ours is not None else case.expected
    mismatches = {op: (counts[op], str(want)) for op, want in expected.items() if counts[op] != want}
    mismatches |= {op: (counts[op], f">= {low}") for op, low in case.at_least.items() if counts[op] < low}
    return dict(counts), mismatches
