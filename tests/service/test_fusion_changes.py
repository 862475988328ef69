"""The fused-op count comparison (service/domain/fusion_changes.py): drops, rises, and which drops a
larger fusion or a restored op took up, on plain counts."""

from __future__ import annotations

from service.domain.fusion_changes import absorbed_into, count_changes, separate_absorbed, taken_up_by

GELU, BIAS_GELU, LAYER_NORM = "com.microsoft.Gelu", "com.microsoft.BiasGelu", "LayerNormalization"


def test_counts_split_into_drops_and_rises_sorted_by_op_with_the_rule_that_emits_each():
    drops, rises = count_changes({GELU: 4, LAYER_NORM: 2, "Gemm": 3}, {GELU: 1, LAYER_NORM: 2, BIAS_GELU: 2})
    assert drops == [
        {"op": "Gemm", "rule": "MatMulAddFusion", "before": 3, "after": 0, "change_pct": -100.0},
        {"op": GELU, "rule": "GeluFusion", "before": 4, "after": 1, "change_pct": -75.0},
    ]
    assert rises == [{"op": BIAS_GELU, "rule": "BiasGeluFusion", "before": 0, "after": 2, "change_pct": None}]


def test_unchanged_counts_and_unknown_ops_change_nothing_or_carry_no_rule():
    assert count_changes({GELU: 2}, {GELU: 2}) == ([], [])
    drops, rises = count_changes({"Custom.Op": 1}, {})
    assert drops == [{"op": "Custom.Op", "rule": None, "before": 1, "after": 0, "change_pct": -100.0}] and rises == []


def test_a_drop_matched_by_a_rise_of_the_fusion_that_absorbs_it_is_no_loss():
    assert BIAS_GELU in absorbed_into()[GELU]
    drops, rises = count_changes({GELU: 4}, {GELU: 1, BIAS_GELU: 3})
    lost, absorbed = separate_absorbed(drops, rises)
    assert lost == [] and [c["op"] for c in absorbed] == [GELU]


def test_a_drop_larger_than_the_absorbing_rise_is_lost():
    drops, rises = count_changes({GELU: 4}, {GELU: 1, BIAS_GELU: 2})
    lost, absorbed = separate_absorbed(drops, rises)
    assert [c["op"] for c in lost] == [GELU] and absorbed == []


def test_a_rise_of_an_unrelated_op_absorbs_nothing():
    drops, rises = count_changes({LAYER_NORM: 2}, {LAYER_NORM: 0, BIAS_GELU: 5})
    lost, absorbed = separate_absorbed(drops, rises)
    assert [c["op"] for c in lost] == [LAYER_NORM] and absorbed == []


def test_restored_fused_ops_take_up_a_drop_as_large_or_smaller():
    drops, rises = count_changes({LAYER_NORM: 3}, {LAYER_NORM: 1})
    assert separate_absorbed(drops, rises, restored=2) == ([], drops)
    assert separate_absorbed(drops, rises, restored=1) == (drops, [])


FAST_GELU = "com.microsoft.FastGelu"


def test_bias_gelu_fused_as_fast_gelu_with_its_bias_is_no_loss_but_one_that_left_the_bias_add_is():
    """Hugging Face's gelu_new exports the tanh GELU: FastGeluFusion takes the bias Add in, where
    BiasGeluFusion did for the exact GELU (the tiny BERT export of the walkthrough: Add 1 → 1)."""
    drops, rises = count_changes({BIAS_GELU: 2}, {FAST_GELU: 2})
    same_adds = separate_absorbed(drops, rises, ops_before={"Add": 1, BIAS_GELU: 2}, ops_after={"Add": 1, FAST_GELU: 2})
    assert same_adds == ([], drops)
    bias_left = separate_absorbed(drops, rises, ops_before={"Add": 1, BIAS_GELU: 2}, ops_after={"Add": 3, FAST_GELU: 2})
    assert bias_left == (drops, [])
    assert separate_absorbed(drops, rises) == (drops, [])  # without the graphs' op counts nothing says so
    fewer = count_changes({BIAS_GELU: 2}, {FAST_GELU: 1})
    assert separate_absorbed(*fewer, ops_before={"Add": 1}, ops_after={"Add": 1})[0] == fewer[0]


def test_a_tanh_gelu_rewritten_as_quick_gelu_is_no_loss_unless_it_leaves_a_bias_add():
    """GPT-2 with activation_function="quick_gelu" (a walkthrough's commit): FastGelu 2 → QuickGelu 2, the
    bias already in the Gemm before, the Adds unchanged; the exact GELU's BiasGelu → QuickGelu leaves the
    bias Add standing and stays lost."""
    quick = "com.microsoft.QuickGelu"
    drops, rises = count_changes({FAST_GELU: 2}, {quick: 2})
    assert separate_absorbed(drops, rises, ops_before={"Add": 4}, ops_after={"Add": 4}) == ([], drops)
    assert separate_absorbed(drops, rises, ops_before={"Add": 4}, ops_after={"Add": 6}) == (drops, [])
    assert [c["op"] for c in taken_up_by(drops[0], rises)] == [quick]
    bias_gelu = count_changes({BIAS_GELU: 2}, {quick: 2})
    assert separate_absorbed(*bias_gelu, ops_before={"Add": 4}, ops_after={"Add": 6}) == (bias_gelu[0], [])

def test_what_took_a_drop_up_is_named():
    # LayerNormalization absorbed into SkipLayerNormalization (the dynamo export of a BERT), BiasGelu
    # fused in its other form; an unrelated rise takes nothing up.
    drops, rises = count_changes(
        {"LayerNormalization": 9, "com.microsoft.BiasGelu": 4},
        {"LayerNormalization": 1, "com.microsoft.SkipLayerNormalization": 8, "com.microsoft.FastGelu": 4,
         "com.microsoft.Attention": 4})
    by_op = {d["op"]: [c["op"] for c in taken_up_by(d, rises)] for d in drops}
    assert by_op == {"LayerNormalization": ["com.microsoft.SkipLayerNormalization"],
                     "com.microsoft.BiasGelu": ["com.microsoft.FastGelu"]}
