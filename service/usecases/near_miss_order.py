"""Near misses as a person reads them: the ones that answer "why" first, the noise counted, nothing cut silently.

JSON keeps every near miss. People's output (CLI tables, the commit page, hook messages) lists first
every near miss of the rules in question (those whose counts changed, and the rules they depend on),
then the other anchors that passed their rule's first check; other anchors that failed the first check
("neither input of Mul comes from a Conv" on a model without a Conv) are counted per rule, not
listed, unless every one is asked for. A list that stops says how many it left out.

A rule's first check is the first `fail(...)` its `match` reaches in source order, or the driver's
"anchor" step for a rule that returned nothing: the step a node fails when it is merely not where
the pattern starts.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import Any

from optimizer.levels import LEVELS

SHOWN = 5  # near misses listed before "and N more"
_FIRST_FAIL = re.compile(r"""\bfail\(\s*["']([^"']+)["']""")


@cache
def first_check_step(rule: str) -> str:
    """The step name of `rule`'s first check ("conv" for ConvMulFusion)."""
    for rules in LEVELS.values():
        for candidate in rules:
            if candidate.name == rule:
                try:
                    found = _FIRST_FAIL.search(inspect.getsource(type(candidate).match))
                except (OSError, TypeError):
                    found = None
                return found.group(1) if found else "anchor"
    return "anchor"


def failed_first_check(miss: dict[str, Any]) -> bool:
    step = miss.get("step")
    return step == "anchor" or step == first_check_step(str(miss.get("rule")))


def readable(misses: list[dict[str, Any]], rules_first: list[str], show_all: bool = False,
             shown: int = SHOWN) -> list[str]:
    """Lines for people: the near misses that explain most first, the rest counted."""
    rank = {rule: index for index, rule in enumerate(rules_first)}
    def listed_one(miss: dict[str, Any]) -> bool:
        return show_all or miss.get("rule") in rank or not failed_first_check(miss)

    listed = [m for m in misses if listed_one(m)]
    counted = [m for m in misses if not listed_one(m)]
    listed.sort(key=lambda m: rank.get(m.get("rule"), len(rank)))  # stable: the optimizer's order within a rule
    lines = [_line(m) for m in listed[:shown]]
    if len(listed) > shown:
        lines.append(f"and {len(listed) - shown} more")
    if counted:
        per_rule: dict[str, int] = {}
        for miss in counted:
            per_rule[miss.get("rule")] = per_rule.get(miss.get("rule"), 0) + 1
        what = ", ".join(f"{rule} {count}" for rule, count in per_rule.items())
        lines.append(f"{len(counted)} anchor(s) failed their rule's first check, not listed ({what}; --all lists them)")
    return lines


def _line(miss: dict[str, Any]) -> str:
    barrier = miss.get("barrier")
    barrier = f" [custom op {barrier}]" if barrier and barrier not in str(miss.get("reason")) else ""
    return f"{miss.get('rule')} at {miss.get('anchor')}: {miss.get('reason')}{barrier}"
