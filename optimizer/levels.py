"""Optimization levels as plain ordered lists, named as ONNX Runtime's GraphOptimizationLevel.

Each level includes the rules of the ones before. Order matters and is commented where it
does. Rules carry ONNX Runtime's names so a user's `disabled_optimizers` list carries over.
"""

from __future__ import annotations

from optimizer.fusions.attention_fusion import AttentionFusion
from optimizer.fusions.bias_gelu_fusion import BiasGeluFusion
from optimizer.fusions.cast_elimination import CastElimination
from optimizer.fusions.common_subexpression_elimination import CommonSubexpressionElimination
from optimizer.fusions.constant_folding import ConstantFolding
from optimizer.fusions.conv_activation_fusion import ConvActivationFusion
from optimizer.fusions.conv_add_fusion import ConvAddFusion
from optimizer.fusions.conv_bn_fusion import ConvBNFusion
from optimizer.fusions.conv_mul_fusion import ConvMulFusion
from optimizer.fusions.eliminate_dropout import EliminateDropout
from optimizer.fusions.eliminate_identity import EliminateIdentity
from optimizer.fusions.eliminate_slice import EliminateSlice
from optimizer.fusions.embed_layer_norm_fusion import EmbedLayerNormFusion
from optimizer.fusions.fast_gelu_fusion import FastGeluFusion
from optimizer.fusions.fuse_relu_clip import FuseReluClip
from optimizer.fusions.gelu_approximation import GeluApproximation
from optimizer.fusions.gelu_fusion import GeluFusion
from optimizer.fusions.gemm_activation_fusion import GemmActivationFusion
from optimizer.fusions.group_query_attention_fusion import GroupQueryAttentionFusion
from optimizer.fusions.layer_norm_fusion import LayerNormFusion
from optimizer.fusions.matmul_add_fusion import MatMulAddFusion
from optimizer.fusions.matmul_integer_to_float_fusion import MatMulIntegerToFloatFusion
from optimizer.fusions.matmul_scale_fusion import MatMulScaleFusion
from optimizer.fusions.matmul_transpose_fusion import MatmulTransposeFusion
from optimizer.fusions.nhwc_conv_layout import NhwcTransformer
from optimizer.fusions.pad_fusion import PadFusion
from optimizer.fusions.quick_gelu_fusion import QuickGeluFusion
from optimizer.fusions.reshape_fusion import ReshapeFusion
from optimizer.fusions.rotary_embedding_fusion import RotaryEmbeddingFusion
from optimizer.fusions.simplified_layer_norm_fusion import SimplifiedLayerNormFusion
from optimizer.fusions.skip_layer_norm_fusion import SkipLayerNormFusion
from optimizer.fusions.slice_to_split_fusion import GatherSliceToSplitFusion
from optimizer.fusions.transpose_optimizer import TransposeOptimizer
from optimizer.fusions.unsqueeze_elimination import UnsqueezeElimination
from optimizer.rule import Rule

LEVEL_NAMES = ("disabled", "basic", "extended", "layout", "all")

# Single-node eliminations are cheap and expose patterns to everything after them: first.
BASIC_CLEANUPS: list[Rule] = [
    EliminateIdentity(),
    CastElimination(),
    EliminateDropout(),
    EliminateSlice(),
    UnsqueezeElimination(),
    ConstantFolding(),
    # After folding, so constants that became equal merge too; before ReshapeFusion, which
    # needs one Shape producer where TorchScript exports repeat it.
    CommonSubexpressionElimination(),
    ReshapeFusion(),
    ConvBNFusion(),
    ConvMulFusion(),
    ConvAddFusion(),
    # After folding, which makes the pads of TensorFlow-style "same" padding constant.
    PadFusion(),
    FuseReluClip(),
]

BASIC: list[Rule] = BASIC_CLEANUPS + [
    MatMulAddFusion(),
]

EXTENDED: list[Rule] = BASIC_CLEANUPS + [
    # GELU patterns become single ops first, so the bias and approximation rules see them.
    GeluFusion(),
    FastGeluFusion(),
    QuickGeluFusion(),
    # LayerNorm before SkipLayerNorm and Attention: both anchor on LayerNormalization.
    LayerNormFusion(),
    SimplifiedLayerNormFusion(),
    # Before AttentionFusion, as in ONNX Runtime's transformer optimizer: the rotated Q and K then
    # reach the scores as one op each, which the attention rule reads as heads.
    RotaryEmbeddingFusion(),
    AttentionFusion(),
    # After AttentionFusion: it turns the MultiHeadAttention over repeated K/V heads that rule
    # makes of a grouped-query block into GroupQueryAttention.
    GroupQueryAttentionFusion(),
    EmbedLayerNormFusion(),
    SkipLayerNormFusion(),
    BiasGeluFusion(),
    # A quantize_dynamic model's products (MatMulInteger -> Cast -> Mul by the scales -> Add bias).
    MatMulIntegerToFloatFusion(),
    MatMulScaleFusion(),
    MatmulTransposeFusion(),
    # MatMul+Add -> Gemm runs after every fusion that anchors on such an Add (BiasGelu,
    # SkipLayerNorm, Attention); run first, as in ONNX Runtime 1.31, it swallows those Adds.
    MatMulAddFusion(),
    GemmActivationFusion(),
    ConvActivationFusion(),
    # Held back by the driver until the rest settle: rotary and attention read the Slices it replaces.
    GatherSliceToSplitFusion(),
    TransposeOptimizer(),
    # Off unless asked for (it changes numerics): Gelu/BiasGelu -> FastGelu.
    GeluApproximation(),
]

# Layout rules for our CPU kernels are added by runtime's layout work.
LAYOUT_RULES: list[Rule] = [
    # After ConvActivationFusion (in EXTENDED): it converts FusedConv as it finds it.
    NhwcTransformer(),
]

LEVELS: dict[str, list[Rule]] = {
    "disabled": [],
    "basic": BASIC,
    "extended": EXTENDED,
    "layout": EXTENDED + LAYOUT_RULES,
    "all": EXTENDED + LAYOUT_RULES,
}

# Rules that change numerics run only when the caller opts in.
OPT_IN_RULES = frozenset({"GeluApproximation"})

# Which rules produce the op another rule anchors on (its `anchors` among their `emits`), in the
# order they run (a rule feeding itself, as ReshapeFusion does, is not listed). When a rule stops
# firing, the cause is often here: a tanh GELU that GeluFusion does not recognise leaves
# BiasGeluFusion without its Gelu. Opt-in rules are left out (the service never runs them);
# tests/optimizer/test_rule_dependencies.py checks this list against the rules' anchors and emits.
RULE_DEPENDENCIES: dict[str, list[str]] = {
    "BiasGeluFusion": ["GeluFusion", "FastGeluFusion"],
    "SkipLayerNormFusion": ["LayerNormFusion", "SimplifiedLayerNormFusion"],
    "EmbedLayerNormFusion": ["LayerNormFusion"],
    "GroupQueryAttentionFusion": ["AttentionFusion"],
    "MatMulScaleFusion": ["MatmulTransposeFusion"],
    "MatmulTransposeFusion": ["MatMulScaleFusion"],
    "GemmActivationFusion": ["MatMulAddFusion"],
    "ConvActivationFusion": ["ConvBNFusion", "ConvMulFusion", "ConvAddFusion"],
}


def rule_dependencies(rule: str) -> list[str]:
    """The rules whose products `rule` anchors on ([] for a rule that needs none)."""
    return list(RULE_DEPENDENCIES.get(rule, []))


def known_rule_names() -> list[str]:
    return sorted({rule.name for rules in LEVELS.values() for rule in rules})


def rules_for_level(
    level: str, disabled=(), enable_gelu_approximation: bool = False
) -> list[Rule]:
    """The ordered rules to run at `level`, less the disabled ones."""
    if level not in LEVELS:
        raise ValueError(f"unknown optimization level {level!r}; choose one of {', '.join(LEVEL_NAMES)}")
    unknown = sorted(set(disabled) - set(known_rule_names()))
    if unknown:
        raise ValueError(
            f"unknown rule name(s) to disable: {', '.join(unknown)}; known rules: {', '.join(known_rule_names())}"
        )
    skip = set(disabled)
    if not enable_gelu_approximation:
        skip |= OPT_IN_RULES
    return [rule for rule in LEVELS[level] if rule.name not in skip]
