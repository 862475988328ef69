"""Shape arithmetic done once per shape: steps whose inputs are all shapes or constants keep
their results and hand them out again when the same inputs come back.

An exported transformer computes its reshape targets at run time: Shape -> Gather -> Unsqueeze
-> Concat -> Reshape, over and over (221 of the tiny GPT-2's 321 steps at level `disabled`).
Each of those numpy calls on a 1- or 2-element int64 array costs ~0.5-1.3 µs, about as much as
onnxruntime spends on a whole node. Yet their values change only when a feed's shape does.

Which steps: planning (`shape_steps`) marks a step *shape-computing* when its op is a
deterministic ONNX op from `PURE_OPS` and each of its inputs is a constant (an initializer no
feed can replace, a Constant node's value), an omitted input, a Shape/Size output, or another
shape-computing step's output. Such a step's result is a function of the feeds' shapes only.

How a result is found again: Shape keeps one read-only array per input shape
(runtime/kernels/creation.py), so the same shape hands the next step the same object. A step's
`StepMemo` is keyed on the identities (`id`) of its varying inputs; each entry holds those
inputs, so no other object can take their ids while the entry lives. An entry is kept only when
every varying input is read-only (nobody can change it under the key: kernels never write into
their inputs, and the session copies a read-only output before the caller gets it) and every
output is a small numpy array (at most `KEPT_ELEMENTS`) or scalar, which is then made
read-only too, so the next step down can key on it in turn. Anything else (a large
ConstantOfShape, a GPU array) is computed on every run as before.

The step still runs, in its place: its kernel call becomes a dictionary look-up. Nothing is
skipped or fused, profiles still show the node, and a changed shape misses and computes afresh
(each step keeps up to `MAX_ENTRIES` shapes' results).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# Deterministic ops of ONNX's own domain whose results depend on their inputs' values alone:
# what exporters' shape arithmetic is made of. Random ops, Dropout and control flow are absent.
PURE_OPS = frozenset({
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "Concat", "ConstantOfShape", "Div",
    "Equal", "Expand", "Flatten", "Floor", "Gather", "GatherElements", "Greater", "GreaterOrEqual",
    "Identity", "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Range",
    "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "Reshape", "Sign", "Slice", "Split",
    "Sqrt", "Squeeze", "Sub", "Sum", "Tile", "Transpose", "Unsqueeze", "Where", "Xor",
})  # fmt: skip
# Ops whose output is the shape of their input: one value per input shape.
SHAPE_OPS = frozenset({"Shape", "Size"})

KEPT_ELEMENTS = 4096  # a kept output's largest size, as ConstantOfShape's own (creation.py)
MAX_ENTRIES = 32  # shapes' results kept per step; a model fed ever new shapes starts afresh


def shape_steps(
    ops: Sequence[tuple[str, bool]], inputs: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], fixed: set[int]
) -> list[bool]:
    """For each step (its (op, plain ONNX op without subgraphs), input and output slots), whether
    it computes from shapes and constants alone; `fixed` holds the constant slots and the
    always-None slot."""
    from_shapes = set(fixed)
    marked = []
    for (op, plain), reads, writes in zip(ops, inputs, outputs, strict=True):
        if plain and op in SHAPE_OPS:
            from_shapes.update(writes)
            marked.append(False)  # its input varies; the kernel keeps its arrays per shape itself
        elif plain and op in PURE_OPS and all(slot in from_shapes for slot in reads):
            from_shapes.update(writes)
            marked.append(True)
        else:
            marked.append(False)
    return marked


class StepMemo:
    """One step's kept results by the ids of its varying inputs (the positions `varying`).

    `results` maps a key (`id(x)` for one varying input, a tuple of ids for several, () for
    none) to (outputs, inputs held); `run(*args)` is the kernel's call with the look-up in
    front. The plan's function does the same look-up inline (runtime/plan_function.py)."""

    def __init__(self, run: Callable[..., Any], varying: tuple[int, ...]) -> None:
        self.varying = varying
        self.results: dict[Any, tuple[tuple, tuple]] = {}
        self.compute = run
        self.run = self._write_run()

    def key(self, args: Sequence[Any]) -> Any:
        if len(self.varying) == 1:
            return id(args[self.varying[0]])
        return tuple(id(args[position]) for position in self.varying)

    def _write_run(self) -> Callable[..., Any]:
        results, key = self.results, self.key

        def run(*args: Any) -> Any:
            entry = results.get(key(args))
            return entry[0] if entry is not None else self.miss(*args)

        return run

    def miss(self, *args: Any) -> Any:
        """Compute, and keep the result where it is safe to (see the module docstring)."""
        outputs = self.compute(*args)
        held = tuple(args[position] for position in self.varying)
        if all(_frozen(value) for value in held) and isinstance(outputs, tuple) and all(_keepable(v) for v in outputs):
            for value in outputs:
                if type(value) is np.ndarray:
                    value.flags.writeable = False
            if len(self.results) >= MAX_ENTRIES:
                self.results.clear()
            self.results[self.key(args)] = (outputs, held)
        return outputs


def _frozen(value: Any) -> bool:
    """A value nobody can change: a read-only numpy array, a numpy scalar, or an omitted input."""
    if type(value) is np.ndarray:
        return not value.flags.writeable
    return value is None or isinstance(value, np.generic)


def _keepable(value: Any) -> bool:
    if type(value) is np.ndarray:
        return value.size <= KEPT_ELEMENTS
    return value is None or isinstance(value, np.generic)
