"""The explicit rule-dependency list says what the rules' anchors and emits say."""

from __future__ import annotations

from optimizer.levels import LEVELS, OPT_IN_RULES, RULE_DEPENDENCIES, rule_dependencies


def test_the_dependency_list_is_every_producer_of_each_rules_anchors_in_level_order():
    rules = [rule for rule in dict.fromkeys(LEVELS["all"]) if rule.name not in OPT_IN_RULES]
    derived = {}
    for rule in rules:
        producers = [p.name for p in rules if p is not rule and set(p.emits) & set(rule.anchors)]
        if producers:
            derived[rule.name] = producers
    assert RULE_DEPENDENCIES == derived
    assert rule_dependencies("BiasGeluFusion") == ["GeluFusion", "FastGeluFusion"]
    assert rule_dependencies("AttentionFusion") == []
