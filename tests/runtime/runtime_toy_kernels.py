"""Small kernels for the executor's own tests, injected with `InferenceSession(extra_kernels=...)`.

They keep the session/executor/profiler tests independent of the kernel families, which
are written and registered separately. Each is a correct numpy implementation of its op
for the cases the tests build, so outputs are still checked against onnxruntime.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.kernels.base import Kernel, SubgraphKernel, UnsupportedOp


class Add(Kernel):
    op_type = "Add"
    since_version = 7

    def run(self, a, b):
        return (self.xp.add(a, b),)


class Mul(Kernel):
    op_type = "Mul"
    since_version = 7

    def run(self, a, b):
        return (self.xp.multiply(a, b),)


class Relu(Kernel):
    op_type = "Relu"
    since_version = 6

    def run(self, x):
        return (self.xp.maximum(x, 0).astype(x.dtype),)


class Relu_14(Relu):
    """Same math; exists so tests can see the opset-14 variant chosen at opset >= 14."""

    since_version = 14


class MatMul(Kernel):
    op_type = "MatMul"
    since_version = 13

    def run(self, a, b):
        return (self.xp.matmul(a, b),)


class Identity(Kernel):
    op_type = "Identity"
    since_version = 1

    def run(self, x):
        return (x,)


class Reshape(Kernel):
    """A view of its input, like the real Reshape: the peak-bytes count must not double it."""

    op_type = "Reshape"
    since_version = 14

    def run(self, x, shape):
        return (x.reshape([int(d) for d in shape]),)


class Split(Kernel):
    op_type = "Split"
    since_version = 13

    def __init__(self, node, opset, backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 0)
        self.count = len(node.outputs)

    def run(self, x, split=None):
        if split is None:
            return tuple(self.xp.array_split(x, self.count, axis=self.axis))
        return tuple(self.xp.split(x, np.cumsum(split)[:-1], axis=self.axis))


class Gelu(Kernel):
    op_type = "Gelu"
    since_version = 20

    def __init__(self, node, opset, backend):
        super().__init__(node, opset, backend)
        if self.attr("approximate", "none") != "none":
            raise UnsupportedOp(f"approximate={self.attr('approximate')!r} is not implemented")

    def run(self, x):
        erf = np.vectorize(math.erf, otypes=[x.dtype])
        return ((0.5 * x * (1 + erf(x / math.sqrt(2)))).astype(x.dtype),)


class BiasGelu(Kernel):
    op_type = "BiasGelu"
    domain = "com.microsoft"
    since_version = 1

    def run(self, x, bias):
        erf = np.vectorize(math.erf, otypes=[x.dtype])
        y = x + bias
        return ((0.5 * y * (1 + erf(y / math.sqrt(2)))).astype(x.dtype),)


class If(SubgraphKernel):
    """The If of the executor docstring: subgraphs planned by the planner the plan hands in,
    outer scope passed on."""

    op_type = "If"
    since_version = 16

    def __init__(self, node, opset, backend, *, plan_subgraph):
        super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
        self.then_branch = self.subgraph("then_branch")
        self.else_branch = self.subgraph("else_branch")

    def run(self, cond, *, outer_scope):
        branch = self.then_branch if bool(cond) else self.else_branch
        return tuple(branch.run({}, outer_scope))


class Greater(Kernel):
    op_type = "Greater"
    since_version = 13

    def run(self, a, b):
        return (self.xp.greater(a, b),)


class ReduceSum(Kernel):
    op_type = "ReduceSum"
    since_version = 13

    def run(self, x, axes=None):
        return (self.xp.asarray(x.sum(), dtype=x.dtype),)


class Explode(Kernel):
    """Fails on purpose: for the error-wrapping tests."""

    op_type = "Explode"
    domain = "test.fusionwatch"
    since_version = 1

    def run(self, x):
        raise FloatingPointError("boom")


class BareOutput(Kernel):
    """Breaks the kernel contract (returns an array, not a tuple): the first run must catch it."""

    op_type = "BareOutput"
    domain = "test.fusionwatch"
    since_version = 1

    def run(self, x):
        return x


TOY_KERNELS = [
    Add,
    Mul,
    Relu,
    Relu_14,
    MatMul,
    Identity,
    Reshape,
    Split,
    Gelu,
    BiasGelu,
    If,
    Greater,
    ReduceSum,
]
TEST_DOMAIN_KERNELS = [Explode, BareOutput]
