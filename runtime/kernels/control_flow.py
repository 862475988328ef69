"""Control flow (If, Loop, Scan, SequenceMap) and the sequence and optional values they carry.

Control-flow kernels are `SubgraphKernel`s (runtime/kernels/base.py): they plan their subgraphs
in `__init__` with the planner the plan hands them (`self.subgraph("body")`), so a body with an
op we lack fails at session creation, and they are called as `run(*inputs, outer_scope=mapping)`.

Values other than tensors: a sequence is a Python list of arrays and an empty optional is
None (an optional holding something is just that value). Sequence kernels never mutate a
list they are given, since a list may be read by several nodes or carried across Loop
iterations; they build a new one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, SubgraphKernel, SubgraphRunner


def _empty_stack(value: ir.Value, axis: int, xp, what: str) -> Any:
    """The stacked output of zero iterations: no item to take a shape from, so the body
    output's declared type decides (unknown dimensions become 0, as ONNX Runtime does)."""
    if value.dtype is None:
        raise ValueError(
            f"{what} ran zero iterations and body output '{value.name}' declares no element type, "
            "so its empty stacked output has no dtype"
        )
    dims = [] if value.shape is None else [d if isinstance(d, int) else 0 for d in value.shape]
    dims.insert(axis if axis >= 0 else len(dims) + 1 + axis, 0)
    return xp.zeros(dims, dtype=value.dtype.numpy())


def _scalar(array, what: str) -> Any:
    """A one-element tensor's value as a Python scalar; exporters write scalars as 0-d or [1]."""
    if array.size != 1:
        raise ValueError(f"{what} must hold one value, got shape {list(array.shape)}")
    return array.reshape(()).item()


def _check_count(what: str, expected: int, actual: int, node: ir.Node) -> None:
    if expected != actual:
        raise ValueError(f"{node.op_type} '{node.name}': {what} is {actual}, expected {expected}")


# ---------------------------------------------------------------- If


class If(SubgraphKernel):
    op_type = "If"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend, *, plan_subgraph):
        super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
        self.then_branch = self.subgraph("then_branch")
        self.else_branch = self.subgraph("else_branch")
        for name, branch in (("then_branch", self.then_branch), ("else_branch", self.else_branch)):
            _check_count(f"{name}'s output count", len(node.outputs), len(branch.output_names), node)

    def run(self, cond, *, outer_scope):
        branch = self.then_branch if bool(_scalar(cond, "If's condition")) else self.else_branch
        return tuple(branch.run({}, outer_scope))


# ---------------------------------------------------------------- Loop


class Loop(SubgraphKernel):
    """Runs `body` while the trip count (M, optional) and condition (optional) allow.

    Body inputs are (iteration number, condition, carried...), its outputs (condition,
    carried..., scan outputs...); scan outputs of every iteration are stacked on a new axis 0.
    """

    op_type = "Loop"
    since_version = 1

    def __init__(self, node, opset, backend=numpy_backend, *, plan_subgraph):
        super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
        self.body = self.subgraph("body")
        self.carried = len(node.inputs) - 2
        _check_count(
            "body's input count (iteration, condition, carried values)",
            2 + self.carried,
            len(self.body.input_names),
            node,
        )
        self.scan_outputs = len(self.body.output_names) - 1 - self.carried
        if self.scan_outputs < 0:
            raise ValueError(
                f"Loop '{node.name}': body has {len(self.body.output_names)} outputs, fewer than the "
                f"condition plus {self.carried} carried value(s)"
            )
        self.iteration_name, self.condition_name, *self.carried_names = self.body.input_names
        self.scan_values = list(self.body.graph.outputs)[1 + self.carried :]
        # Bodies written before the spec settled declare the iteration number and condition as
        # [1], not scalars; they get them so, as onnxruntime gives them.
        iteration_value, condition_value = list(self.body.graph.inputs)[:2]
        self.iteration_shape = (1,) if _declared_rank(iteration_value) == 1 else ()
        self.condition_shape = (1,) if _declared_rank(condition_value) == 1 else ()

    def run(self, trip_count, cond, *initial, outer_scope):
        xp = self.xp
        limit = None if trip_count is None else int(_scalar(trip_count, "Loop's trip count M"))
        condition = xp.asarray(True) if cond is None else cond
        carried = list(initial)
        scanned: list[list[Any]] = [[] for _ in range(self.scan_outputs)]
        iteration = 0
        while (limit is None or iteration < limit) and bool(_scalar(condition, "Loop's condition")):
            feeds = dict(zip(self.carried_names, carried, strict=True))
            feeds[self.iteration_name] = xp.full(self.iteration_shape, iteration, dtype=np.int64)
            feeds[self.condition_name] = xp.reshape(condition, self.condition_shape)
            condition, *rest = self.body.run(feeds, outer_scope)
            carried = rest[: self.carried]
            for items, value in zip(scanned, rest[self.carried :], strict=True):
                items.append(value)
            iteration += 1
        stacked = [
            xp.stack(items) if items else _empty_stack(value, 0, xp, f"Loop '{self.node.name}'")
            for items, value in zip(scanned, self.scan_values, strict=True)
        ]
        return (*carried, *stacked)


def _declared_rank(value) -> int | None:
    return None if value.shape is None else len(value.shape)


# ---------------------------------------------------------------- Scan


def _scan(body: SubgraphRunner, states: list, slices: list, outer_scope) -> tuple[list, list[list]]:
    """Run `body` once per step over `slices` (each already ordered by its direction and with
    the scan axis first); the final states and each scan output's per-step values."""
    count = len(states)
    state_names, slice_names = body.input_names[:count], body.input_names[count:]
    length = slices[0].shape[0] if slices else 0
    collected: list[list[Any]] = [[] for _ in range(len(body.output_names) - count)]
    for step in range(length):
        feeds = dict(zip(state_names, states, strict=True))
        feeds.update(zip(slice_names, (s[step] for s in slices), strict=True))
        outputs = body.run(feeds, outer_scope)
        states = outputs[:count]
        for items, value in zip(collected, outputs[count:], strict=True):
            items.append(value)
    return states, collected


class Scan(SubgraphKernel):
    """Opset 9+: scan inputs are sliced along `scan_input_axes`, per-step scan outputs are
    stacked along `scan_output_axes`; direction 1 walks (or stacks) from the end."""

    op_type = "Scan"
    since_version = 9

    def __init__(self, node, opset, backend=numpy_backend, *, plan_subgraph):
        super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
        self.body = self.subgraph("body")
        scan_inputs = self.attr("num_scan_inputs")
        self.states = len(node.inputs) - scan_inputs
        _check_count(
            "body's input count (states, then scan slices)",
            len(node.inputs),
            len(self.body.input_names),
            node,
        )
        scan_outputs = len(self.body.output_names) - self.states
        self.input_axes = self._per_item("scan_input_axes", scan_inputs, 0)
        self.input_reverse = [d == 1 for d in self._per_item("scan_input_directions", scan_inputs, 0)]
        self.output_axes = self._per_item("scan_output_axes", scan_outputs, 0)
        self.output_reverse = [d == 1 for d in self._per_item("scan_output_directions", scan_outputs, 0)]
        self.scan_values = list(self.body.graph.outputs)[self.states :]

    def _per_item(self, name: str, count: int, default: int) -> list[int]:
        values = self.attr(name, [default] * count)
        _check_count(f"the length of {name}", count, len(values), self.node)
        return values

    def run(self, *inputs, outer_scope):
        xp = self.xp
        states, scanned = list(inputs[: self.states]), inputs[self.states :]
        slices = []
        for x, axis, reverse in zip(scanned, self.input_axes, self.input_reverse, strict=True):
            moved = xp.moveaxis(x, axis, 0)
            slices.append(moved[::-1] if reverse else moved)
        lengths = {s.shape[0] for s in slices}
        if len(lengths) > 1:
            raise ValueError(f"scan inputs have different lengths along their scan axes: {sorted(lengths)}")
        states, collected = _scan(self.body, states, slices, outer_scope)
        outputs = []
        for items, axis, reverse, value in zip(
            collected, self.output_axes, self.output_reverse, self.scan_values, strict=True
        ):
            if not items:
                outputs.append(_empty_stack(value, axis, xp, f"Scan '{self.node.name}'"))
            else:
                outputs.append(xp.stack(items[::-1] if reverse else items, axis=axis))
        return (*states, *outputs)


class Scan_8(SubgraphKernel):
    """Opset 8: every input has a leading batch axis and scan inputs scan along axis 1;
    `sequence_lens` (optional) gives each batch entry's length, and scan outputs are padded
    with zeros past it."""

    op_type = "Scan"
    since_version = 8

    def __init__(self, node, opset, backend=numpy_backend, *, plan_subgraph):
        super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
        self.body = self.subgraph("body")
        scan_inputs = self.attr("num_scan_inputs")
        self.states = len(node.inputs) - 1 - scan_inputs
        _check_count(
            "body's input count (states, then scan slices)",
            len(node.inputs) - 1,
            len(self.body.input_names),
            node,
        )
        directions = self.attr("directions", [0] * scan_inputs)
        _check_count("the length of directions", scan_inputs, len(directions), node)
        self.input_reverse = [d == 1 for d in directions]

    def run(self, sequence_lens, *inputs, outer_scope):
        xp = self.xp
        states, scanned = inputs[: self.states], inputs[self.states :]
        batch = (states or scanned)[0].shape[0]
        longest = scanned[0].shape[1] if scanned else 0
        lengths = [longest] * batch if sequence_lens is None else [int(n) for n in sequence_lens.tolist()]
        final_states: list[list[Any]] = [[] for _ in states]
        per_batch: list[list[Any]] = []  # [batch][scan output] -> stacked steps
        for b in range(batch):
            slices = [
                x[b, : lengths[b]][::-1] if reverse else x[b, : lengths[b]]
                for x, reverse in zip(scanned, self.input_reverse, strict=True)
            ]
            ended, collected = _scan(self.body, [s[b] for s in states], slices, outer_scope)
            for items, value in zip(final_states, ended, strict=True):
                items.append(value)
            per_batch.append([xp.stack(items) if items else None for items in collected])
        outputs = []
        for k, value in enumerate(list(self.body.graph.outputs)[self.states :]):
            steps = [entry[k] for entry in per_batch if entry[k] is not None]
            if not steps:
                outputs.append(_empty_stack(value, 0, xp, f"Scan '{self.node.name}'")[None].repeat(batch, 0))
                continue
            padded = xp.zeros((batch, longest, *steps[0].shape[1:]), dtype=steps[0].dtype)
            for b in range(batch):
                if per_batch[b][k] is not None:
                    padded[b, : lengths[b]] = per_batch[b][k]
            outputs.append(padded)
        return (*(xp.stack(items) for items in final_states), *outputs)


# ---------------------------------------------------------------- SequenceMap


class SequenceMap(SubgraphKernel):
    """Runs `body` on each position of the input sequence; extra inputs that are sequences
    are indexed alongside it, tensors are passed whole to every call."""

    op_type = "SequenceMap"
    since_version = 17

    def __init__(self, node, opset, backend=numpy_backend, *, plan_subgraph):
        super().__init__(node, opset, backend, plan_subgraph=plan_subgraph)
        self.body = self.subgraph("body")
        _check_count("body's input count", len(node.inputs), len(self.body.input_names), node)

    def run(self, sequence, *extra, outer_scope):
        for position, value in enumerate(extra, start=1):
            if isinstance(value, list) and len(value) != len(sequence):
                raise ValueError(
                    f"sequence input {position} has {len(value)} items, input 0 has {len(sequence)}"
                )
        names = self.body.input_names
        results: list[list[Any]] = [[] for _ in self.body.output_names]
        for index, item in enumerate(sequence):
            feeds = {names[0]: item}
            for name, value in zip(names[1:], extra, strict=True):
                feeds[name] = value[index] if isinstance(value, list) else value
            for items, value in zip(results, self.body.run(feeds, outer_scope), strict=True):
                items.append(value)
        return tuple(results)


# ---------------------------------------------------------------- sequences


def _position(position, length: int, allow_end: bool) -> int:
    """A sequence position as a non-negative index; -length..length-1 (..length with allow_end)."""
    index = int(_scalar(position, "a sequence position"))
    upper = length if allow_end else length - 1
    if not -length <= index <= upper:
        raise IndexError(
            f"position {index} is out of range for a sequence of {length} (valid: {-length}..{upper})"
        )
    return index + length if index < 0 else index


class SequenceEmpty(Kernel):
    op_type = "SequenceEmpty"
    since_version = 11

    def run(self):
        return ([],)


class SequenceConstruct(Kernel):
    op_type = "SequenceConstruct"
    since_version = 11

    def run(self, *tensors):
        return (list(tensors),)


class SequenceInsert(Kernel):
    op_type = "SequenceInsert"
    since_version = 11

    def run(self, sequence, tensor, position=None):
        result = list(sequence)
        index = len(result) if position is None else _position(position, len(result), allow_end=True)
        result.insert(index, tensor)
        return (result,)


class SequenceAt(Kernel):
    op_type = "SequenceAt"
    since_version = 11

    def run(self, sequence, position):
        return (sequence[_position(position, len(sequence), allow_end=False)],)


class SequenceErase(Kernel):
    op_type = "SequenceErase"
    since_version = 11

    def run(self, sequence, position=None):
        if not sequence:
            raise IndexError("SequenceErase on an empty sequence")
        result = list(sequence)
        del result[-1 if position is None else _position(position, len(result), allow_end=False)]
        return (result,)


class SequenceLength(Kernel):
    op_type = "SequenceLength"
    since_version = 11

    def run(self, sequence):
        return (self.xp.asarray(len(sequence), dtype=np.int64),)


class SplitToSequence(Kernel):
    """Splits into pieces of `split` (a scalar: equal pieces, the last may be shorter; a
    1-D tensor: those lengths) or, without `split`, into single slices, squeezed unless keepdims."""

    op_type = "SplitToSequence"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis", 0)
        self.keepdims = bool(self.attr("keepdims", 1))

    def run(self, x, split=None):
        xp = self.xp
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        length = x.shape[axis]
        if split is None:
            pieces = [
                xp.take(x, [i], axis=axis) if self.keepdims else xp.take(x, i, axis=axis)
                for i in range(length)
            ]
            return (pieces,)
        if split.ndim == 0:
            size = int(_scalar(split, "split"))
            if size <= 0:
                raise ValueError(f"split must be positive, got {size}")
            bounds = list(range(size, length, size))
        else:
            sizes = [int(s) for s in split.tolist()]
            if sum(sizes) != length or any(s < 0 for s in sizes):
                raise ValueError(f"split lengths {sizes} do not add up to axis {axis}'s length {length}")
            bounds = list(np.cumsum(sizes[:-1]))
        return (list(xp.split(x, bounds, axis=axis)),)


class ConcatFromSequence(Kernel):
    op_type = "ConcatFromSequence"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.axis = self.attr("axis")
        if self.axis is None:
            raise ValueError(f"ConcatFromSequence '{node.name}' has no axis attribute (it is required)")
        self.new_axis = bool(self.attr("new_axis", 0))

    def run(self, sequence):
        if not sequence:
            raise ValueError("ConcatFromSequence of an empty sequence: there is no element type or shape")
        if self.new_axis:
            return (self.xp.stack(sequence, axis=self.axis),)
        return (self.xp.concatenate(sequence, axis=self.axis),)


# ---------------------------------------------------------------- optionals


class Optional(Kernel):
    op_type = "Optional"
    since_version = 15

    def run(self, value=None):
        return (value,)


class OptionalHasElement(Kernel):
    op_type = "OptionalHasElement"
    since_version = 15

    def run(self, value=None):
        return (self.xp.asarray(value is not None),)


class OptionalGetElement(Kernel):
    op_type = "OptionalGetElement"
    since_version = 15

    def run(self, value):
        if value is None:
            raise ValueError("OptionalGetElement of an empty optional")
        return (value,)


KERNELS = [
    If,
    Loop,
    Scan_8,
    Scan,
    SequenceMap,
    SequenceEmpty,
    SequenceConstruct,
    SequenceInsert,
    SequenceAt,
    SequenceErase,
    SequenceLength,
    SplitToSequence,
    ConcatFromSequence,
    Optional,
    OptionalHasElement,
    OptionalGetElement,
]
