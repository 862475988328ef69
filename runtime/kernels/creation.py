"""Kernels that make a tensor from a shape or from attributes alone: Shape, Size, ConstantOfShape,
Constant, Range, EyeLike.

Shape's array and a small ConstantOfShape result are kept per input shape and handed out
read-only: no kernel writes into its inputs, and the session copies an output that is not
writeable for the caller. Constant nodes are placed in the plan's frame once (runtime/plan.py)
and never run; Constant's kernel gives the plan their value.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, ShapeMemo, UnsupportedOp
from runtime.kernels.tensor import ints

# Results made from shapes alone (ConstantOfShape's) are kept up to this size; larger ones are
# made afresh, not held between runs.
KEPT_ELEMENTS = 4096


class Shape(Kernel):
    """The shape as int64, one array per input shape kept and handed out read-only (consumers
    never write into inputs; the session copies an output that is not writeable)."""

    op_type = "Shape"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        # start/end (opset 15) slice the shape with Python's own clamping rules.
        self.start = self.attr("start", 0)
        self.end = self.attr("end")
        self._shapes = ShapeMemo()

    def run(self, data):
        shape = self._shapes.get(data.shape)
        if shape is None:
            shape = self.xp.asarray(data.shape[self.start : self.end], dtype=np.int64)
            if isinstance(shape, np.ndarray):
                shape.flags.writeable = False
            self._shapes.keep(data.shape, shape)
        return (shape,)


class Size(Kernel):
    """The element count as an int64 scalar array, kept per input shape and handed out read-only,
    as Shape's."""

    op_type = "Size"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self._sizes = ShapeMemo()

    def run(self, data):
        size = self._sizes.get(data.shape)
        if size is None:
            size = self.xp.asarray(data.size, dtype=np.int64)
            if isinstance(size, np.ndarray):
                size.flags.writeable = False
            self._sizes.keep(data.shape, size)
        return (size,)


class ConstantOfShape(Kernel):
    op_type = "ConstantOfShape"
    since_version = 9

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        value = self.attr("value")
        self.value = np.zeros(1, dtype=np.float32) if value is None else value.reshape(-1)
        self._filled = ShapeMemo()

    def run(self, shape):
        # A small result is kept read-only, one per shape: consumers never write into inputs,
        # and the session copies an output that is not writeable.
        key = shape.tobytes()
        filled = self._filled.get(key)
        if filled is None:
            filled = self.xp.full(ints(shape), self.value[0], dtype=self.value.dtype)
            if isinstance(filled, np.ndarray) and filled.size <= KEPT_ELEMENTS:
                filled.flags.writeable = False
                self._filled.keep(key, filled)
        return (filled,)


class Constant(Kernel):
    """The value is built once; every run returns the same (never mutated) array."""

    op_type = "Constant"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        attributes = node.attributes
        if "value" in attributes:
            value = self.attr("value")
        elif "value_float" in attributes:
            value = np.array(self.attr("value_float"), dtype=np.float32)
        elif "value_floats" in attributes:
            value = np.array(self.attr("value_floats"), dtype=np.float32)
        elif "value_int" in attributes:
            value = np.array(self.attr("value_int"), dtype=np.int64)
        elif "value_ints" in attributes:
            value = np.array(self.attr("value_ints"), dtype=np.int64)
        elif "value_string" in attributes:
            value = np.array(self.attr("value_string"), dtype=object)
        elif "value_strings" in attributes:
            value = np.array(self.attr("value_strings"), dtype=object)
        elif "sparse_value" in attributes:
            raise UnsupportedOp(f"Constant '{node.name}': sparse_value tensors are not supported")
        else:
            raise UnsupportedOp(f"Constant '{node.name}': no value_* attribute")
        self.value = value if value.dtype == object else self.backend.from_host(value)

    def run(self):
        return (self.value,)


class Range(Kernel):
    op_type = "Range"
    since_version = 11

    def run(self, start, limit, delta):
        return (self.xp.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype),)


class EyeLike(Kernel):
    op_type = "EyeLike"
    since_version = 9

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.k = self.attr("k", 0)
        dtype = self.attr("dtype")
        self.dtype = None if dtype is None else ir.DataType(dtype).numpy()

    def run(self, x):
        return (self.xp.eye(x.shape[0], x.shape[1], k=self.k, dtype=self.dtype or x.dtype),)


KERNELS = [Shape, Size, ConstantOfShape, Constant, Range, EyeLike]
