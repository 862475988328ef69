"""The causal mask of a GPT-2 export, recognized so Attention can take `unidirectional=1`.

    Where(Cast(Slice(Slice(bias [1, 1, W, W], rows T-S..T), columns 0..T)), scores, fill)

GPT-2's attention keeps a constant lower-triangular `bias` buffer and slices the block that
the current queries (the last S of T positions, after a past of T-S) see. ONNX Runtime's fusion
(attention_fusion_helper.h, MatchUnidirMaskSubgraph) matches the Shape/Slice/Squeeze/Sub
arithmetic that computes those bounds node by node; we evaluate the chain instead, on the
buffer itself, for a few (S, T): if every result is "key j visible to query i iff j <= T-S+i"
the mask is causal, which is what `unidirectional` does; all visible means the Where masks
nothing (a bidirectional buffer). Anything else is a mask the fused op cannot express.

Why evaluating rather than matching the arithmetic: exporters compute the bounds in different
ways (Shape of the scores or of K, one Slice over two axes or two Slices), and the values are
what matters; evaluating on the real buffer proves them for the sizes tried, and the sizes are
chosen so a bound that ignores S, T or the past would differ.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from optimizer.match import const_array, describe, input_at, is_op, producer

# (queries, keys) the slice bounds are evaluated for: with and without a past, one query.
PROBE_SIZES = ((3, 5), (2, 2), (1, 4))
MAX_SLICES = 3

# ints(value, queries, keys): an integer tensor evaluated with the scores' shape set to
# [batch, heads, queries, keys]; None when it cannot be.
Evaluate = Callable[[ir.Value, int, int], np.ndarray | None]


def causal_kind(condition: ir.Value, keep_if_true: bool, ints: Evaluate) -> tuple[bool, list[ir.Node]] | str:
    """For Where(condition, ...) masking the scores: (True if the mask is causal, False if it masks
    nothing; the Slice/Cast nodes computing it), or why it is neither (a string)."""
    chain, value = [], condition
    while is_op(producer(value), "Cast") or is_op(producer(value), "Slice"):
        if len(chain) > MAX_SLICES + 1:
            break
        chain.insert(0, producer(value))
        value = producer(value).inputs[0]
    buffer = const_array(value)
    if buffer is None or not any(is_op(n, "Slice") for n in chain):
        return f"the mask '{condition.name}' is not a slice of a constant buffer"
    if buffer.ndim != 4 or buffer.shape[:2] != (1, 1):
        return f"the mask buffer '{value.name}' has shape {list(buffer.shape)}, not [1, 1, positions, positions]"
    seen = set()
    for queries, keys in PROBE_SIZES:
        if keys > buffer.shape[2] or keys > buffer.shape[3]:
            continue
        sliced = _run(chain, buffer, lambda v, q=queries, k=keys: ints(v, q, k))
        if isinstance(sliced, str):
            return sliced
        visible = (sliced != 0) if keep_if_true else (sliced == 0)
        if visible.shape[-2:] != (queries, keys):
            return (f"the mask slices [{', '.join(map(str, visible.shape))}] out of '{value.name}' for "
                    f"{queries} queries over {keys} keys")
        past = keys - queries
        causal = np.arange(keys)[None, :] <= past + np.arange(queries)[:, None]
        if visible.all() and causal.all():
            continue  # one query after a past sees every key either way
        if np.array_equal(visible.reshape(queries, keys), causal):
            seen.add(True)
        elif visible.all():
            seen.add(False)
        else:
            return f"the mask from '{value.name}' is neither causal (j <= past + i) nor all visible"
    if len(seen) != 1:
        return f"the mask from '{value.name}' is not causal for every sequence length tried"
    return seen.pop(), chain


def _run(chain: list[ir.Node], array: np.ndarray, ints: Callable[[ir.Value], np.ndarray | None]):
    for node in chain:
        if is_op(node, "Cast"):
            continue  # only the zero / non-zero pattern matters
        bounds = [ints(v) if v is not None else None for v in (node.inputs[1], node.inputs[2],
                                                                input_at(node, 3), input_at(node, 4))]
        starts, ends, axes, steps = bounds
        if starts is None or ends is None or (input_at(node, 3) is not None and axes is None) or (
            input_at(node, 4) is not None and steps is None
        ):
            return f"the bounds of {describe(node)} cannot be evaluated from the scores' shape"
        starts, ends = np.atleast_1d(starts), np.atleast_1d(ends)
        axes = np.arange(len(starts)) if axes is None else np.atleast_1d(axes)
        steps = np.ones(len(starts), np.int64) if steps is None else np.atleast_1d(steps)
        index = [slice(None)] * array.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            index[int(axis)] = slice(int(start), int(min(end, np.iinfo(np.int64).max)), int(step))
        array = array[tuple(index)]
    return array


__all__ = ["causal_kind"]
