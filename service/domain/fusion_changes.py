"""How fused-op counts changed between a baseline and a result, and which drops are no regression.

A drop is lost (a fusion-regression) unless something took it up: the ops a rule anchored on it makes
rose by at least as much (the op was absorbed into a larger fusion: a re-enabled BiasGeluFusion takes
GeluFusion's Gelus back), or this result restored at least as many fused ops of earlier regressions (one
standing where a restored op now stands again). Counts in, changes out: no database, so the rule can be
read and tested on its own; fusion_alerts.py turns the changes into alerts.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import TypedDict

from optimizer.fused_ops import ONNXRUNTIME_QUANTIZED_FUSIONS
from optimizer.levels import OPT_IN_RULES, rules_for_level


class CountChange(TypedDict):
    """One fused op's count, before and after; stored as is in an alert's `changes`."""

    op: str
    rule: str | None  # the rule that emits the op, None for an op no rule makes
    before: int
    after: int
    change_pct: float | None  # None when the op was absent from the baseline


@cache
def rule_for_op() -> dict[str, str]:
    """Fused op key → the rule that emits it ("com.microsoft.BiasGelu" → "BiasGeluFusion"; onnxruntime's
    quantization fusions by onnxruntime's names)."""
    names: dict[str, str] = {}
    for rule in rules_for_level("all"):
        for op in rule.emits:
            names.setdefault(op, rule.name)
    for op, rule_name in ONNXRUNTIME_QUANTIZED_FUSIONS.items():
        names.setdefault(op, rule_name)
    return names


@cache
def absorbed_into() -> dict[str, frozenset[str]]:
    """Fused op key → the fused ops a rule anchored on it makes out of it ("com.microsoft.Gelu" →
    BiasGelu). Opt-in rules (GeluApproximation) never run in a measurement, so what they would make
    absorbs nothing."""
    found: dict[str, set[str]] = {}
    for rule in rules_for_level("all"):
        if rule.name in OPT_IN_RULES:
            continue
        for anchor in rule.anchors:
            found.setdefault(anchor, set()).update(op for op in rule.emits if op != anchor)
    return {op: frozenset(ops) for op, ops in found.items()}


def count_changes(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[list[CountChange], list[CountChange]]:
    """(drops, rises) from fused-op counts `before` (the baseline's) to `after`, each sorted by op."""
    drops: list[CountChange] = []
    rises: list[CountChange] = []
    for op in sorted(set(before) | set(after)):
        was, now = before.get(op, 0), after.get(op, 0)
        change = CountChange(op=op, rule=rule_for_op().get(op), before=was, after=now,
                             change_pct=(now - was) / was * 100 if was else None)
        if now < was:
            drops.append(change)
        elif now > was:
            rises.append(change)
    return drops, rises


# A fused op that stands for the same nodes in another form, and the op it must have taken in to do so.
# BiasGelu is the bias Add and the exact (Erf) GELU; FastGelu with its bias input is the bias Add and the
# tanh GELU. A model whose GELU is now the tanh form (Hugging Face's gelu_new) loses BiasGelu to FastGelu
# and runs as fused as before (paired timing on such an export: within noise); a FastGelu that left the
# bias Add standing has one Add more per place, and the drop stays lost. Likewise a tanh GELU rewritten
# as x·sigmoid(1.702x) (quick_gelu) is fused as QuickGelu: no loss where FastGelu had no bias to take in
# (GPT-2's, whose bias is in its Gemm), a loss where the bias Add is left standing (BERT's BiasGelu).
IN_ANOTHER_FORM: dict[str, tuple[str, str]] = {
    "com.microsoft.BiasGelu": ("com.microsoft.FastGelu", "Add"),
    "com.microsoft.FastGelu": ("com.microsoft.QuickGelu", "Add"),
}


def separate_absorbed(
    drops: list[CountChange], rises: list[CountChange], restored: int = 0,
    ops_before: Mapping[str, int] | None = None, ops_after: Mapping[str, int] | None = None,
) -> tuple[list[CountChange], list[CountChange]]:
    """(lost, absorbed): the drops nothing took up, and those a rise of what the op is absorbed into,
    the same nodes fused in another form (IN_ANOTHER_FORM; needs both graphs' op counts), or `restored`
    (how many fused ops of earlier regressions this result restored) make up for."""
    rose = {c["op"]: c["after"] - c["before"] for c in rises}

    def in_another_form(drop: CountChange, lost: int) -> bool:
        if drop["op"] not in IN_ANOTHER_FORM or ops_before is None or ops_after is None:
            return False
        replacement, taken_in = IN_ANOTHER_FORM[drop["op"]]
        return rose.get(replacement, 0) >= lost and ops_after.get(taken_in, 0) <= ops_before.get(taken_in, 0)

    def taken_up(drop: CountChange) -> bool:
        lost = drop["before"] - drop["after"]
        return (sum(rose.get(op, 0) for op in absorbed_into().get(drop["op"], ())) >= lost or restored >= lost
                or in_another_form(drop, lost))

    return [c for c in drops if not taken_up(c)], [c for c in drops if taken_up(c)]


def taken_up_by(drop: CountChange, rises: list[CountChange]) -> list[CountChange]:
    """The rises that can have taken `drop` up: what the op is absorbed into, or its other form. Empty
    when only restored regressions made up for it."""
    into = set(absorbed_into().get(drop["op"], ()))
    if drop["op"] in IN_ANOTHER_FORM:
        into.add(IN_ANOTHER_FORM[drop["op"]][0])
    return [c for c in rises if c["op"] in into]
