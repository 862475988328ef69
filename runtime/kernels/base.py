"""What a kernel is: one node's computation, built once per session, run many times.

A kernel class is named exactly as its op (opset variants get a suffix, `Softmax_13`) and
declares `op_type`, `domain` and `since_version`. Attributes are read once in `__init__`,
so `run` does only array work. `run` takes the node's inputs in order (None for an
omitted optional input) and returns a tuple of its outputs in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import numpy as np
import onnx_ir as ir

from runtime.backends import Backend, numpy_backend


class Kernel:
    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    since_version: ClassVar[int] = 1

    def __init__(self, node: ir.Node, opset: int, backend: Backend = numpy_backend) -> None:
        self.node = node
        self.opset = opset
        self.backend = backend
        self.xp = backend.xp
        self.on_cuda = backend.runs_cuda_kernels

    def attr(self, name: str, default: Any = None) -> Any:
        """An attribute as a plain Python value (int, float, str, list, ndarray, ir.Graph)."""
        attribute = self.node.attributes.get(name)
        if attribute is None:
            return default
        if attribute.type == ir.AttributeType.TENSOR:
            return attribute.as_tensor().numpy()
        if attribute.type == ir.AttributeType.GRAPH:
            return attribute.as_graph()
        if attribute.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
            return list(attribute.value)
        return attribute.value

    def bind_constants(self, constants: tuple[Any, ...]) -> None:
        """Called once, when the plan is built, with each input's value where it is the same in
        every run (an initializer no feed can replace, a Constant node's value), else None; a
        kernel may work out here what depends on those alone (Unsqueeze's axes, Slice's bounds)
        instead of on every run. The default keeps nothing."""

    def run(self, *inputs: np.ndarray | None) -> tuple[np.ndarray, ...]:
        raise NotImplementedError


class ShapeMemo(dict):
    """What a kernel worked out for an input shape (a target shape, an index), kept for the next
    run with that shape. Only for what depends on the shape and on constant inputs alone
    (`Kernel.bind_constants`). Bounded: a model fed ever new shapes starts it afresh."""

    LIMIT = 256

    def keep(self, key: Any, value: Any) -> Any:
        if len(self) >= self.LIMIT:
            self.clear()
        self[key] = value
        return value


class SubgraphRunner(Protocol):
    """A planned subgraph (an If branch, a Loop or Scan body), as a control-flow kernel runs it.

    `run(feeds, outer_scope)` takes feeds by `input_names` and returns outputs in `output_names`
    order; `outer_scope` holds, by name, the enclosing graphs' values the subgraph reads."""

    graph: ir.Graph

    @property
    def input_names(self) -> list[str]: ...

    @property
    def output_names(self) -> list[str]: ...

    def run(self, feeds: Mapping[str, Any], outer_scope: Mapping[str, Any] | None = None) -> list[Any]: ...


# Plans a subgraph in the scope its node was planned in (opsets, backend, extra kernels).
PlanSubgraph = Callable[[ir.Graph], SubgraphRunner]


class SubgraphKernel(Kernel):
    """A kernel whose node has graph attributes (If, Loop, Scan, SequenceMap).

    The plan builds it with `plan_subgraph`, which it uses in `__init__` to plan each subgraph
    (`self.subgraph("body")`), so a body with an op we lack fails at session creation. Its `run`
    is called as `run(*inputs, outer_scope=mapping)`; it passes `mapping` on to the subgraph's
    `run` unchanged. The kernel never imports the executor: the plan hands the planner in."""

    def __init__(
        self, node: ir.Node, opset: int, backend: Backend = numpy_backend, *, plan_subgraph: PlanSubgraph
    ) -> None:
        super().__init__(node, opset, backend)
        self._plan_subgraph = plan_subgraph

    def subgraph(self, attribute: str) -> SubgraphRunner:
        """The graph attribute `attribute`, planned."""
        return self._plan_subgraph(self.attr(attribute))


class UnsupportedOp(Exception):
    """Raised while building a kernel when this node's attribute/type combination isn't implemented."""
