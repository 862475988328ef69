"""What a kernel is: one node's computation, built once per session, run many times.

A kernel class is named exactly as its op (opset variants get a suffix, `Softmax_13`) and
declares `op_type`, `domain` and `since_version`. Attributes are read once in `__init__`,
so `run` does only array work. `run` takes the node's inputs in order (None for an
omitted optional input) and returns a tuple of its outputs in order.
"""

from __future__ import annotations

from typing import Any, ClassVar

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

    def run(self, *inputs: np.ndarray | None) -> tuple[np.ndarray, ...]:
        raise NotImplementedError


class UnsupportedOp(Exception):
    """Raised while building a kernel when this node's attribute/type combination isn't implemented."""
