"""Fusion rules made wrong on purpose, for the numeric checks to find: each computes something other
than the subgraph it replaces, in a way a user's model could meet.

`swap_rule(monkeypatch, variant)` puts a variant in place of the rule of the same name at every
level for one test, so the optimizer, the engines and the service run it as they run the real one.
"""

from __future__ import annotations

import pytest

from optimizer.fusions.attention_fusion import AttentionFusion
from optimizer.fusions.skip_layer_norm_fusion import SkipLayerNormFusion
from optimizer.levels import LEVELS
from optimizer.rule import Rule

WRONG_EPSILON = 0.5


class SkipLayerNormWrongEpsilon(SkipLayerNormFusion):
    """SkipLayerNormFusion with a wrong constant: epsilon 0.5 instead of the LayerNormalization's,
    which shrinks every normalized row by about sqrt(var / (var + 0.5))."""

    def rewrite(self, op, match):
        match.captures["epsilon"] = WRONG_EPSILON
        return super().rewrite(op, match)


class AttentionWithoutGuard(AttentionFusion):
    """AttentionFusion that drops the subgraph's fully-masked-row guard (Where(IsNaN(p), 0, p)): a
    query row whose every key is masked (the first positions of a left-padded row under a causal
    mask) comes out NaN where the subgraph gives 0."""

    def rewrite(self, op, match):
        match.captures["guard_zero"] = None
        return super().rewrite(op, match)


def swap_rule(monkeypatch: pytest.MonkeyPatch, variant: Rule) -> None:
    for level, rules in list(LEVELS.items()):
        monkeypatch.setitem(LEVELS, level, [variant if rule.name == variant.name else rule for rule in rules])
