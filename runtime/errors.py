"""The runtime's errors: each names the model element at fault and what would be valid.

Everything a caller can get wrong (the model, the feeds, the output names) is a ValueError
subclass, as ONNX Runtime's InvalidArgument is; a kernel failing mid-run is a RuntimeError
that names the node, with the kernel's own exception chained.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def domain_label(domain: str) -> str:
    return "ai.onnx" if domain in ("", "ai.onnx") else domain


@dataclass
class UnsupportedOp:
    """One (domain, op, opset) we cannot run, with every node that uses it."""

    domain: str
    op_type: str
    opset: int | None  # None: the model imports no opset for this domain
    nodes: list[str] = field(default_factory=list)
    reason: str = "no kernel"

    def describe(self) -> str:
        opset = f"opset {self.opset}" if self.opset is not None else "domain not imported by the model"
        where = ", ".join(f"'{name}'" for name in self.nodes)
        return f"{domain_label(self.domain)}.{self.op_type} ({opset}): {self.reason}; used by {where}"


class UnsupportedModelError(ValueError):
    """The model uses ops (or op variants) we have no kernel for; raised at session creation."""

    def __init__(self, unsupported: list[UnsupportedOp]) -> None:
        self.unsupported = unsupported
        lines = "\n".join(f"  {entry.describe()}" for entry in unsupported)
        super().__init__(f"model uses {len(unsupported)} op(s) fusionwatch cannot run:\n{lines}")


class GraphPlanError(ValueError):
    """The graph itself cannot be executed: a value nobody defines, a cycle, a scope error."""


class InvalidFeedError(ValueError):
    """A feed is missing, unknown, or of the wrong type or shape for the model's input."""


class InvalidOutputNameError(ValueError):
    """`run` was asked for an output the model does not have."""


class NodeExecutionError(RuntimeError):
    """A kernel raised while running; the message names the node, the op and the input shapes."""
