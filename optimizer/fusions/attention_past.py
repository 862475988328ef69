"""A key/value cache with a past, in the form com.microsoft.Attention's `past`/`present` take.

    past (2, B, N, P, H) -> Gather(0) [-> Transpose(0,1,3,2)] ┐
                                           K (new) ──────────┴ Concat(seq axis) -> (the K side of Q·Kᵀ)
    past ---------------> Gather(1) ─────────────────────────┐
                                           V (new) ──────────┴ Concat(seq axis) -> (probs @ V)
    present = Concat(axis 0)(Unsqueeze(K [B, N, P+S, H], 0), Unsqueeze(V [B, N, P+S, H], 0))

GPT-2 exported with one `past_<layer>` tensor per layer (the form of ONNX Runtime's own GPT-2
tests, and of its convert_to_onnx for GPT-2) stacks key and value on a leading axis of 2, which
is exactly Attention's `past` input; the stacked Concat of the results is its `present` output.
These helpers find the two ends; the caller's layout probe proves the new K and V arrive at the
Concats as K and V per head, and that the Concat axis is their sequence axis.

Why past must come first in the Concat: Attention appends the new keys after the past ones, and
the causal mask (`unidirectional`) counts positions that way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from optimizer.match import attr, const_array, consumers, describe, input_at, is_op, producer

SWAP_LAST = (0, 1, 3, 2)


@dataclass
class PastSide:
    """The past half of a cache Concat: `past[index]`, swapped to [B, N, H, P] when `swapped`."""

    past: ir.Value  # the (2, B, N, P, H) graph input
    index: int  # 0 for the key, 1 for the value
    swapped: bool
    nodes: list[ir.Node]


def past_side(concat: ir.Node) -> PastSide | str | None:
    """The past half of `concat`, why it is not one (a string), or None when the Concat does not
    read a stacked past at all."""
    if len(concat.inputs) != 2 or concat.inputs[0] is None:
        return None
    if _reads_past(concat.inputs[1]) and not _reads_past(concat.inputs[0]):
        return (f"{describe(concat)} puts the new keys/values before the past; Attention appends them after it "
                "(and counts causal positions that way)")
    nodes: list[ir.Node] = []
    value = concat.inputs[0]
    swapped = False
    node = producer(value)
    if is_op(node, "Transpose"):
        if tuple(attr(node, "perm", ()) or ()) != SWAP_LAST:
            return None
        swapped = True
        nodes.append(node)
        node = producer(node.inputs[0])
    if not is_op(node, "Gather"):
        return None
    index = const_array(node.inputs[1])
    past = node.inputs[0]
    if index is None or index.ndim != 0 or attr(node, "axis", 0) != 0 or not past.is_graph_input():
        return None
    if past.shape is None or len(past.shape) != 5 or past.shape[0] != 2:
        return f"the cache '{past.name}' is not a stacked (2, batch, heads, past, head_size) key/value"
    nodes.insert(0, node)
    if int(index) not in (0, 1):
        return f"{describe(node)} picks entry {int(index)} of the cache '{past.name}', not key (0) or value (1)"
    return PastSide(past, int(index), swapped, nodes)


def _reads_past(value: ir.Value | None) -> bool:
    node = producer(value)
    if is_op(node, "Transpose"):
        node = producer(node.inputs[0])
    return is_op(node, "Gather") and node.inputs[0].is_graph_input() and rank_of(node.inputs[0]) == 5


def rank_of(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


def concat_axis(concat: ir.Node) -> int:
    """The Concat's axis counted from the front of a rank-4 tensor."""
    axis = int(attr(concat, "axis", 0))
    return axis + 4 if axis < 0 else axis


def present_of(concat: ir.Node, onward: ir.Node, swapped: bool):
    """Where the concatenated key or value leaves the block as the stacked present:
    (nodes up to it, the present Concat, its position there), None if it does not leave, or why
    not (a string). `onward` is the node that carries it on to the product."""
    value = concat.outputs[0]
    users = [u for u in consumers(value) if u is not onward and not is_op(u, "Shape")]
    if not users and not value.is_graph_output():
        return None
    if value.is_graph_output() or len(users) != 1:
        return (f"the concatenated cache '{value.name}' is read outside the block; Attention's present output "
                "is the stacked (2, batch, heads, total, head_size) tensor only")
    nodes: list[ir.Node] = []
    node = users[0]
    if swapped:  # back from [B, N, H, T] to [B, N, T, H]
        if not is_op(node, "Transpose") or tuple(attr(node, "perm", ()) or ()) != SWAP_LAST:
            return f"the concatenated key '{value.name}' reaches the present through {describe(node)}, not a transpose back"
        nodes.append(node)
        node = _sole_user(node.outputs[0])
    if not is_op(node, "Unsqueeze") or _axes(node) != [0]:
        return f"the concatenated cache '{value.name}' reaches {describe(node)}, not Unsqueeze(axis 0) into the present"
    nodes.append(node)
    stack = _sole_user(node.outputs[0])
    if not is_op(stack, "Concat") or attr(stack, "axis", 0) != 0 or len(stack.inputs) != 2:
        return f"the unsqueezed cache feeds {describe(stack)}, not the Concat(axis 0) of key and value"
    return nodes, stack, list(stack.inputs).index(node.outputs[0])


def _sole_user(value: ir.Value) -> ir.Node | None:
    users = consumers(value)
    return users[0] if len(users) == 1 and not value.is_graph_output() else None


def _axes(node: ir.Node) -> list[int] | None:
    axes = attr(node, "axes", None)
    if axes is None and input_at(node, 1) is not None:
        axes = const_array(input_at(node, 1))
    return None if axes is None else [int(a) for a in np.atleast_1d(axes)]


__all__ = ["PastSide", "past_side", "concat_axis", "present_of"]
