"""Q, K and V already in heads, as com.microsoft.MultiHeadAttention (the mha stage, heads).

    q4 [B, N, S, H] ─────────────────────────────┐
    k4 [B, N, T, H] -> Transpose/Reshape -> Kᵀ ──┴ (the sdpa core) <- v4 [B, N, T, H]
      -> Transpose/Reshape... -> [B, S, hidden]
  =>  MultiHeadAttention(q4 as [B, S, hidden], k4, v4, attention_bias=mask, num_heads, scale)

Q, K and V may reach the scores already projected and split into heads, with work between the
projection and the product that Attention's packed weight cannot express (Llama's rotary
embedding, grouped-query K/V repeated to every head): then the block becomes MultiHeadAttention
on Q (back in [B, S, hidden]) and K, V in heads, the probe checking the Kᵀ chain and the head
merge. When K and V in heads are Concats onto a per-layer past_key / past_value (Hugging Face's
cache), the Concats go into the op as its past inputs and present outputs. GroupQueryAttentionFusion
then takes the MultiHeadAttention whose K and V are repeated heads.

The heads and head size must be numbers the graph fixes. Where onnx's inference names none
(TorchScript's partial rotary slices each head with bounds it does not propagate), they are read by
evaluating the chain at both probe sizes (shape_probe.evaluated_shapes). TorchScript's SDPA scales
Q and Kᵀ each by sqrt(scale): Mul/Div steps by a scalar on either operand join the op's scale.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.fusions import attention_layout as layout
from optimizer.fusions.attention_sdpa import (
    Sdpa,
    check_mask,
    extra_bias_fails,
    fill_fails,
    guarded,
    heads_bias,
    is_key_padding,
    scalar_operand,
)
from optimizer.match import MS, attr, const_array, consumers, describe, is_op, producer, rank
from optimizer.rule import Fail, Match, fail
from optimizer.shape_probe import constant_dims, evaluated_dims


def match_heads(graph: ir.Graph, sdpa: Sdpa) -> Match | Fail | None:
    """The block over Q, K, V already in heads, [B, N, S, H], as MultiHeadAttention: a Match, or
    why not, or None when Q is not such a tensor at all."""
    qk, pv, fill, mask = sdpa.qk, sdpa.pv, sdpa.fill, sdpa.mask
    # TorchScript's SDPA scales Q and Kᵀ each by sqrt(scale) before their product: a constant, or one
    # computed from K's shape (Falcon) that MatMulScaleFusion cannot fold; either joins the op's scale
    q4, scale, scale_nodes = _unscaled(qk.inputs[0])
    v4 = pv.inputs[1]
    if rank(q4) != 4 or q4.shape is None:
        return None
    if sdpa.scores_reshape is not None:
        return fail("heads", "the products are [batch*heads, ...] 3-D ones; only packed projections fuse in that form")
    dims = _heads_dims(graph, q4)
    if not isinstance(dims[1], int) or not isinstance(dims[3], int):
        return fail("heads", f"Q '{q4.name}' has shape {[str(d) for d in q4.shape]}: the number of heads and the "
                    "head size must be known numbers (they vary with the input sizes)")
    num_heads, head_size = dims[1], dims[3]
    probe = layout.LayoutProbe.for_heads(graph, q4, num_heads, head_size)

    def kv_heads(value: ir.Value) -> int | None:  # N for [B, N, T, H] like Q, 1 for one head every query head shares
        found = _heads_dims(graph, value) if rank(value) == 4 else None
        if found is None or found[3] != head_size or found[1] not in (num_heads, 1):
            return None
        return found[1]

    def like_q(value: ir.Value) -> bool:
        return kv_heads(value) is not None

    k_chain: list[ir.Node] = []
    k4 = qk.inputs[1]
    if sdpa.k_transposed:  # Kᵀ: walk back to a [B, N, T, H] value the chain swaps the last axes of
        while not like_q(k4) or not k_chain:
            k4, factor, steps = _unscaled(k4)  # a scalar commutes with the data movement around it
            scale, scale_nodes = scale * factor, scale_nodes + steps
            if steps and like_q(k4) and k_chain:
                break
            node = producer(k4)
            if not (is_op(node, "Transpose") or is_op(node, "Reshape")) or len(k_chain) >= 4:
                return fail("heads", "Kᵀ does not come from K [batch, heads, keys, head_size] through Transpose/Reshape")
            k_chain.insert(0, node)
            k4 = node.inputs[0]
        numbered = np.arange(probe.batch * kv_heads(k4) * 5 * head_size, dtype=np.int64).reshape(
            probe.batch, kv_heads(k4), 5, head_size)
        probe.shapes[id(k4)] = numbered.shape
        probe.symbols.setdefault(str(k4.shape[2]), 5)
        moved = probe.run(k_chain, numbered)
        if isinstance(moved, str) or not np.array_equal(moved, numbered.swapaxes(2, 3)):
            return fail("heads", f"{describe(k_chain[-1])} does not turn K [batch, heads, keys, head_size] into Kᵀ")
    for role, value in (("K", k4), ("V", v4)):
        if not like_q(value):
            return fail("heads", f"{role} '{value.name}' is not [batch, {num_heads} or 1, keys, {head_size}] like Q")
    if kv_heads(k4) != kv_heads(v4):
        return fail("heads", f"K '{k4.name}' has {kv_heads(k4)} heads and V '{v4.name}' {kv_heads(v4)}")
    # One K/V head the products broadcast to every query head (multi-query attention, Falcon): the
    # fused op reads it expanded to num_heads, which is what the broadcast computes.
    shared_kv = kv_heads(k4) == 1 and num_heads > 1
    out = layout.trace_output(pv.outputs[0], probe, num_heads, head_size)
    if isinstance(out, str):
        return fail("output", out)
    out_nodes, out_value, flat_output = out
    if fill is not None and fill_fails(fill[0]) is not None:
        return fill_fails(fill[0])
    if fill is not None and check_mask(fill[0].inputs[0], num_heads) is not None:
        return fail("mask", *check_mask(fill[0].inputs[0], num_heads))
    padding = None
    if mask is not None:
        problem = check_mask(mask, num_heads)
        if problem is not None and not is_key_padding(mask):
            return fail("mask", *problem)
        padding = ("expand", None, None) if problem is not None else None
    # A cache per layer (past_key, past_value): the Concats onto it go into the fused op, whose
    # present_key / present_value outputs take their place.
    if extra_bias_fails(graph, sdpa.extra_bias, num_heads) is not None:
        return extra_bias_fails(graph, sdpa.extra_bias, num_heads)
    cache = _heads_cache(k4, v4)
    if cache is not None and shared_kv:
        return fail("heads", "K and V are one head shared by every query head and concatenated onto a past: "
                    "MultiHeadAttention's past holds every head")
    concats = [cache[0], cache[1]] if cache is not None else []
    nodes = list({id(n): n for n in sdpa.core + scale_nodes + k_chain + out_nodes + concats}.values())
    nodes += layout.dead_helpers(nodes, [fill[0].inputs[0] if fill is not None else None, mask, sdpa.extra_bias])
    # transformers' SDPA slices the mask to key.shape[-2], read from the concatenated key, the present
    # output (Optimum's GPT-2 and BART decoders with past). Left reading the fused op's present, that
    # Shape would make the op's mask from the op's own output, a cycle: it joins the match and is
    # computed from the past's shape and the new keys' length instead (present_shape).
    inside = {id(n) for n in nodes}
    present_shapes = [(index, reader) for index, concat in enumerate(concats)
                      for reader in consumers(concat.outputs[0]) if is_op(reader, "Shape") and id(reader) not in inside]
    nodes += [reader for _, reader in present_shapes]
    return Match(
        nodes=layout.in_graph_order(graph, nodes),
        outputs=[out_value, *(c.outputs[0] for c in concats), *(reader.outputs[0] for _, reader in present_shapes)],
        captures={
            "present_shapes": present_shapes,
            "cache": cache[2:] if cache is not None else None,
            "graph": graph, "anchor": sdpa.softmax.name or "Softmax", "heads": (q4, k4, v4), "x": q4,
            "mask": mask, "padding": padding, "fill": fill[0] if fill is not None else None, "present": False,
            "guard_zero": sdpa.guard_zero, "shared_kv": shared_kv, "extra_bias": sdpa.extra_bias,
            "num_heads": num_heads, "scale": sdpa.scale * scale, "flat_output": flat_output, "hidden": num_heads * head_size,
        },
    )


def rewrite_heads(op: ir.tape.Tape, match: Match) -> list[ir.Value]:
    q4, k4, v4 = match.heads
    name = f"{layout.RULE_NAME}/{match.anchor}"
    perm = op.op("Transpose", [q4], {"perm": [0, 2, 1, 3]}, name=f"{name}/query_bsnh")
    flat = layout.unique_initializer(op, match.graph, np.array([0, 0, match.hidden], np.int64), "attention_query_shape")
    query = op.op("Reshape", [perm, flat], name=f"{name}/query")
    bias = heads_bias(op, match, q4)
    attributes = {"num_heads": match.num_heads, "scale": float(match.scale)}
    presents = []
    if match.cache is not None:  # new K, V as [B, S, hidden] after the past in the op's cache inputs
        past_key, past_value, k_new, v_new = match.cache
        key, value = (_merged_heads(op, match, v, role) for v, role in ((k_new, "key"), (v_new, "value")))
        inputs = [query, key, value, None, None, bias, past_key, past_value]
        output, *presents = op.op_multi_out("MultiHeadAttention", inputs, attributes, domain=MS, num_outputs=3,
                                            name=name)
        presents += [_present_shape(op, match, (past_key, past_value)[index], (key, value)[index], reader)
                     for index, reader in match.present_shapes]
    else:
        if match.shared_kv:  # [B, 1, T, H] -> [B, N, T, H]; GroupQueryAttentionFusion takes the Expand back out
            heads = layout.unique_initializer(op, match.graph, np.array([1, match.num_heads, 1, 1], np.int64),
                                              "attention_kv_heads")
            k4, v4 = (op.op("Expand", [t, heads], name=f"{name}/{role}_heads") for t, role in ((k4, "key"), (v4, "value")))
        inputs = [query, k4, v4] + ([None, None, bias] if bias is not None else [])
        output = op.op("MultiHeadAttention", inputs, attributes, domain=MS, name=name)
    output = guarded(op, match, output)
    if match.flat_output:
        shape = layout.unique_initializer(op, match.graph, np.array([-1, match.hidden], np.int64), "attention_flat_shape")
        output = op.op("Reshape", [output, shape], name=f"{name}/flatten")
    return [output, *presents]


def _present_shape(op: ir.tape.Tape, match: Match, past: ir.Value, new: ir.Value, reader: ir.Node) -> ir.Value:
    """What `reader`, a Shape of Concat(past [B, N, P, H], new heads, axis 2), computed, from values
    the fused op reads: past's shape plus [0, 0, S, 0], S the length of `new` [B, S, hidden]; then
    the reader's start/end (opset 15), which clamp as Slice's bounds do."""
    name = f"{layout.RULE_NAME}/{match.anchor}/present_shape"
    sequence_axis = layout.unique_initializer(op, match.graph, np.array([1], np.int64), "attention_sequence_axis")
    zeros = layout.unique_initializer(op, match.graph, np.array([0, 0], np.int64), "attention_shape_zeros")
    zero = layout.unique_initializer(op, match.graph, np.array([0], np.int64), "attention_shape_zero")
    length = op.op("Gather", [op.op("Shape", [new], name=f"{name}/new"), sequence_axis], {"axis": 0},
                   name=f"{name}/length")
    step = op.op("Concat", [zeros, length, zero], {"axis": 0}, name=f"{name}/step")
    shape = op.op("Add", [op.op("Shape", [past], name=f"{name}/past"), step], name=name)
    start, end = int(attr(reader, "start", 0)), attr(reader, "end", None)
    if start == 0 and end is None:
        return shape
    bounds = [layout.unique_initializer(op, match.graph, np.array([b], np.int64), "attention_shape_bound")
              for b in (start, np.iinfo(np.int64).max if end is None else int(end))]
    return op.op("Slice", [shape, *bounds, zero], name=f"{name}/slice")


def _unscaled(value: ir.Value) -> tuple[ir.Value, float, list[ir.Node]]:
    """(the value before them, their product, the Muls/Divs) for Mul/Div steps by a scalar
    (attention_sdpa.scalar_operand: a constant, or one computed from sizes alone) whose results
    only the next step reads; the shape arithmetic computing a scalar dies with the block when
    nothing else reads it."""
    factor, nodes = 1.0, []
    while len(nodes) < 2 and (is_op(producer(value), "Mul") or is_op(producer(value), "Div")):
        data, found, _ = scalar_operand(producer(value))
        # rank: a one-element [1, 1, 1, 1, 1] operand broadcasts the data to an extra axis
        if data is None or len(value.uses()) != 1 or rank(value) != rank(data):
            break
        factor, nodes, value = factor * found, [*nodes, producer(value)], data
    return value, factor, nodes


def _heads_cache(k4: ir.Value, v4: ir.Value):
    """(K Concat, V Concat, past_key, past_value, new K, new V) when K and V in heads are each a
    Concat of a [B, N, P, H] graph input (the past) and the new heads along the sequence axis,
    as Hugging Face's cache writes them; else None."""
    found = []
    for value in (k4, v4):
        concat = producer(value)
        if not is_op(concat, "Concat") or len(concat.inputs) != 2 or int(attr(concat, "axis", 0)) not in (2, -2):
            return None
        past, new = concat.inputs
        if not past.is_graph_input() or rank(past) != 4 or rank(new) != 4:
            return None
        found.append((concat, past, new))
    (k_concat, past_key, k_new), (v_concat, past_value, v_new) = found
    return k_concat, v_concat, past_key, past_value, k_new, v_new


def _merged_heads(op: ir.tape.Tape, match: Match, heads: ir.Value, role: str) -> ir.Value:
    """[B, N, S, H] heads as the [B, S, N*H] the fused op takes: the value they were split from when
    that is a Reshape(x, [0, 0, N, H]) -> Transpose(0, 2, 1, 3) away, else a Transpose + Reshape."""
    transpose = producer(heads)
    split = producer(transpose.inputs[0]) if is_op(transpose, "Transpose") else None
    if list(attr(transpose, "perm", []) or []) == [0, 2, 1, 3] and is_op(split, "Reshape") and rank(split.inputs[0]) == 3:
        target = const_array(split.inputs[1])
        if target is not None and [int(d) for d in target] == [0, 0, match.num_heads, match.hidden // match.num_heads]:
            if not attr(split, "allowzero", 0):
                return split.inputs[0]
    name = f"{layout.RULE_NAME}/{match.anchor}/{role}"
    perm = op.op("Transpose", [heads], {"perm": [0, 2, 1, 3]}, name=f"{name}_bsnh")
    flat = layout.unique_initializer(op, match.graph, np.array([0, 0, match.hidden], np.int64), f"attention_{role}_shape")
    return op.op("Reshape", [perm, flat], name=name)


def _heads_dims(graph: ir.Graph, value: ir.Value) -> list[int | str | None]:
    """A rank-4 value's dims, the symbolic ones replaced by the number the graph fixes them to
    (TorchScript's Llama leaves the heads of view(batch, seq, -1, head_size) symbolic)."""
    dims = list(value.shape) if value.shape is not None else [None] * 4
    if isinstance(dims[1], int) and isinstance(dims[3], int):
        return dims
    fixed = constant_dims(graph, value)
    if fixed is None or len(fixed) != 4 or fixed[1] is None or fixed[3] is None:
        # GPT-NeoX's partial rotary, Gemma's repeated K: inference names nothing past them
        fixed = evaluated_dims(graph, value) or fixed
    if fixed is None or len(fixed) != 4:
        return dims
    return [d if isinstance(d, int) else (f if f is not None else d) for d, f in zip(dims, fixed, strict=True)]
