"""What a fusion rule is: an anchor op, a `match` that explains itself, and a `rewrite`.

A rule looks at one anchor node at a time. `match` returns
  - `fail(step, reason)` wherever the pattern does not match, from the very first check on —
    this is a *near miss*, and the reason is shown to users verbatim, so write it for them
    ("consumer Gelu is domain '' opset 20"), not for a debugger. "Why did X not fuse?" is the
    question the product answers, so every anchor that did not fire gets an answer; a rule
    returning `None` gets the driver's generic one, which says less than the rule could,
  - a `Match` naming the nodes to remove and the values the rewrite will replace.
The driver (optimizer/driver.py) checks the safety rules every fusion shares — no
intermediate value may be a graph output or feed a node outside the match — so each
rule only describes its own pattern.

Rule objects are created once (levels.py) and shared by every optimization in the process, possibly
at the same time in several threads: a rule keeps nothing between calls. What a call learns goes
into its arguments or its return value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import onnx_ir as ir

from optimizer.match import op_key

RULE_META_KEY = "fusionwatch.rule"  # on every node a rule created: which rule
FUSED_META_KEY = "fusionwatch.fused"  # on the fused nodes among them (the rule's `emits`)


@dataclass
class Fail:
    """A near miss: the step of the pattern where matching stopped, and why."""

    step: str
    reason: str
    node: ir.Node | None = None  # the node that broke the pattern, when there is one


def fail(step: str, reason: str, node: ir.Node | None = None) -> Fail:
    return Fail(step, reason, node)


@dataclass
class Match:
    """A matched pattern.

    `nodes` are removed by the rewrite; `outputs` are the values of the old subgraph that
    the rewrite's new nodes replace (in the same order as `Rule.rewrite` returns them).
    Any other output of `nodes` must stay inside the match. `captures` holds whatever the
    rule needs in `rewrite` (inputs, constants, attributes).
    """

    nodes: list[ir.Node]
    outputs: list[ir.Value]
    captures: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.captures[name]
        except KeyError:
            raise AttributeError(name) from None


class Rule:
    """Base class of every optimizer rule.

    `name` is ONNX Runtime's transformer name, so a user's `disabled_optimizers` list carries
    over. `anchors` are op keys ("Add", "com.microsoft.Gelu") the rule is offered; the driver
    indexes rules by anchor so most rules never see most nodes. A rule with no anchors is a
    whole-graph pass: its `run_on_graph` is called once per round instead.
    `emits` are the op keys of the fused nodes this rule creates; the report counts those
    (helpers a rewrite adds, such as a Cast of the mask, are not fusions).
    `refines_shapes`: see its comment.
    """

    name: ClassVar[str] = ""
    anchors: ClassVar[tuple[str, ...]] = ()
    emits: ClassVar[tuple[str, ...]] = ()
    # Rules after which the driver re-runs shape inference: ones that turn shape arithmetic
    # into constants, so dimensions inference could only name become numbers.
    refines_shapes: ClassVar[bool] = False
    # Rules that rewrite a form other rules match (several Slices into one Split): the driver holds
    # them back until the level's other rules have settled.
    runs_after_others: ClassVar[bool] = False

    def match(self, graph: ir.Graph, node: ir.Node) -> Match | Fail | None:
        raise NotImplementedError

    def rewrite(self, op: ir.tape.Tape, match: Match) -> ir.Value | list[ir.Value]:
        """Record the replacement nodes on `op` (`op.op("Gelu", [x], domain=MS)`); return their values
        that stand for `match.outputs`, in that order.

        The tape is not bound to the graph: the driver inserts its nodes and initializers, rewires
        consumers and removes `match.nodes`. A new weight is `ir.Tensor(array)`: `ir.tensor` first
        tests its argument against runtime-checkable Protocols, ~35 µs a call, more than the rest
        of a ReshapeFusion rewrite.
        """
        raise NotImplementedError

    def run_on_graph(self, graph: ir.Graph, near_misses: list[tuple[ir.Node, Fail]]) -> int:
        """Whole-graph passes (constant folding, say) override this; returns how many times it fired.

        Nodes the pass could have changed and left alone go into `near_misses`, with the reason.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def mark_created(node: ir.Node, rule: Rule) -> None:
    """Tag a node a rule created, so the report can count it as a fusion when it is one."""
    node.meta[RULE_META_KEY] = rule.name
    if op_key(node) in rule.emits:
        node.meta[FUSED_META_KEY] = True
