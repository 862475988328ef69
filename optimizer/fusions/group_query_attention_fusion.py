"""GroupQueryAttentionFusion: MultiHeadAttention over K/V heads repeated for each query group
=> com.microsoft.GroupQueryAttention on the un-repeated K/V.

    k (B, N_kv, S, H) ─ Unsqueeze(2) ─ Expand (B, N_kv, n, S, H) ─ Reshape (B, N_kv·n, S, H) ─┐
    v (B, N_kv, S, H) ─ Unsqueeze(2) ─ Expand ─ Reshape ─────────────────────────────────────── MultiHeadAttention(q, ·, ·, bias)
  =>  GroupQueryAttention(q, k as (B, S, N_kv·H), v as (B, S, N_kv·H), seqlens_k = S-1 per row,
                          total_sequence_length = S, attention_bias = bias, causal = 0)

The multi-query form (Falcon, GPTBigCode: one K/V head every query head reads, which the products
broadcast) reaches here as Expand(k (B, 1, S, H), [1, N, 1, 1]) and becomes kv_num_heads = 1.

Anchored on the MultiHeadAttention AttentionFusion makes of Llama-style blocks (it runs after it),
so the Q/K·V/head-merge proof is that rule's; this one proves the repeat: the chain run on a
numbered K/V at the pinned probe sizes must give every K/V head n times in a row, which is how
GroupQueryAttention groups query heads (head h reads K/V head h // n). The repeated K and V are
then never built.

Why causal = 0 with the exporter's mask as attention_bias, rather than GroupQueryAttention's own
causal mask: the mask already holds the causal part (and the padding), and keeping it makes the
fused op compute exactly what MultiHeadAttention did without proving what the mask is. seqlens_k
= S-1 for every row says the whole sequence is this step's, with nothing cached before it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import MS, attr, const_array, describe, input_at, is_op, producer, rank, value_name
from optimizer.rule import Match, Rule, fail
from optimizer.shape_probe import evaluated_shapes, pinned_shapes
from optimizer.value_probe import PROBE_ERRORS, evaluate_on_probe

# MultiHeadAttention inputs the fused form has no place for
UNSUPPORTED_INPUTS = {3: "bias", 4: "key_padding_mask", 6: "past_key", 7: "past_value"}


class GroupQueryAttentionFusion(Rule):
    name = "GroupQueryAttentionFusion"
    anchors = ("com.microsoft.MultiHeadAttention",)
    emits = ("com.microsoft.GroupQueryAttention",)

    def match(self, graph: ir.Graph, mha: ir.Node):
        for index, role in UNSUPPORTED_INPUTS.items():
            if input_at(mha, index) is not None:
                return fail(
                    "inputs", f"MultiHeadAttention has a {role} input, which GroupQueryAttention lacks"
                )
        if any(output.uses() for output in mha.outputs[1:]):
            return fail("outputs", "MultiHeadAttention's present key/value are read; this fusion has no past")
        query, key, value = mha.inputs[0], input_at(mha, 1), input_at(mha, 2)
        # a key in heads (B, N, L, H), which the repeat below proves, goes with a (B, S, D) query
        if key is None or value is None or rank(query) not in (None, 3):
            return fail("inputs", "MultiHeadAttention does not take a 3-D query with separate key and value")
        heads = int(attr(mha, "num_heads", 0))
        repeats = []
        for role, repeated in (("key", key), ("value", value)):
            found = _repeat_source(graph, repeated, heads)
            if isinstance(found, str):
                return fail("repeat", f"{role} '{value_name(repeated)}' {found}", producer(repeated))
            repeats.append(found)
        (k, kv_heads, k_nodes), (v, v_heads, v_nodes) = repeats
        if kv_heads != v_heads:
            return fail("repeat", f"key repeats {kv_heads} heads and value {v_heads}")
        return Match(
            nodes=[*k_nodes, *v_nodes, mha],
            outputs=[mha.outputs[0]],
            captures={
                "query": query,
                "key": k,
                "value": v,
                "bias": input_at(mha, 5),
                "heads": heads,
                "kv_heads": kv_heads,
                "scale": attr(mha, "scale"),
                "causal": int(attr(mha, "unidirectional", 0)),
                "anchor": mha.name or "MultiHeadAttention",
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        name = f"{self.name}/{match.anchor.lstrip('/')}"

        def const(label, array):
            return op.initializer(ir.Tensor(np.array(array), name=f"{name}/{label}"))

        flat = const("flat_kv", np.array([0, 0, -1], np.int64))
        kv = [
            op.op(
                "Reshape",
                [op.op("Transpose", [t], {"perm": [0, 2, 1, 3]}, name=f"{name}/{role}_bsnh"), flat],
                name=f"{name}/{role}",
            )
            for role, t in (("key", match.key), ("value", match.value))
        ]
        shape = op.op("Shape", [match.query], name=f"{name}/query_shape")
        length = op.op(
            "Gather",
            [shape, const("sequence_axis", np.array(1, np.int64))],
            {"axis": 0},
            name=f"{name}/sequence",
        )
        total = op.op("Cast", [length], {"to": ir.DataType.INT32}, name=f"{name}/total_sequence_length")
        last = op.op("Sub", [total, const("one", np.array(1, np.int32))], name=f"{name}/last_position")
        batch = op.op(
            "Gather", [shape, const("batch_axis", np.array([0], np.int64))], {"axis": 0}, name=f"{name}/batch"
        )
        seqlens = op.op("Expand", [last, batch], name=f"{name}/seqlens_k")
        attributes = {"num_heads": match.heads, "kv_num_heads": match.kv_heads, "causal": match.causal}
        if match.scale is not None:
            attributes["scale"] = float(match.scale)
        inputs = [match.query, *kv, None, None, seqlens, total, None, None, None, match.bias]
        # no present outputs: nothing reads a cache from a graph that had none
        return op.op("GroupQueryAttention", inputs, attributes, domain=MS, name=name)


def _shared_head(graph: ir.Graph, repeated: ir.Value, heads: int):
    """(k, 1, [Expand]) where `repeated` = Expand(k [B, 1, T, H], [1, heads, 1, 1]): one K/V head every
    query head reads (multi-query attention, as AttentionFusion writes it); else None."""
    expand = producer(repeated)
    if not is_op(expand, "Expand"):
        return None
    source, target = expand.inputs[0], const_array(input_at(expand, 1))
    if rank(source) != 4 or target is None or [int(d) for d in target] != [1, heads, 1, 1]:
        return None
    if source.shape[1] != 1:  # Falcon's TorchScript K, after its rotary Add: inference lost the one head
        shapes = evaluated_shapes(graph, source)
        if shapes is None or any(len(shape) != 4 or shape[1] != 1 for shape in shapes):
            return None
    return source, 1, [expand]


def _shape_at(graph: ir.Graph, which: int):
    """value -> its shape at the pinned probe sizes `which` (0: first, 1: second), inferred or, where
    inference named none (Gemma's K after its rotary embedding), evaluated; None when neither can."""

    def shape(value: ir.Value) -> tuple[int, ...] | None:
        pinned = pinned_shapes(graph, value)[which]
        if value.name in pinned:
            return pinned[value.name]
        evaluated = evaluated_shapes(graph, value)
        return evaluated[which] if evaluated is not None else None

    return shape


def _repeat_source(graph: ir.Graph, repeated: ir.Value, heads: int):
    """(k, kv_heads, nodes) where `repeated` = Reshape(Expand(Unsqueeze(k, 2))) repeats each of k's
    heads heads/kv_heads times in a row; else why not."""
    reshape = producer(repeated)
    shared = _shared_head(graph, repeated, heads)
    if shared is not None:
        return shared
    expand = producer(input_at(reshape, 0)) if is_op(reshape, "Reshape") else None
    unsqueeze = producer(input_at(expand, 0)) if is_op(expand, "Expand") else None
    if not is_op(unsqueeze, "Unsqueeze"):
        return f"does not come from Reshape(Expand(Unsqueeze(k))), the grouped-query repeat (found {describe(reshape)})"
    source = unsqueeze.inputs[0]
    first, second = (_shape_at(graph, which) for which in (0, 1))
    k_shape, out_shape = first(source), first(repeated)
    if k_shape is None or out_shape is None or len(k_shape) != 4:
        return f"has no shape the probe can infer for '{value_name(source)}' (batch, kv_heads, sequence, head_size)"
    kv_heads = k_shape[1]
    if heads % kv_heads or out_shape != (k_shape[0], heads, *k_shape[2:]):
        return f"is {out_shape}, not {heads} heads repeated from the {k_shape} it reads"
    if second(source) is None or second(source)[1] != kv_heads:  # a head count that varies with the sizes
        return f"reads '{value_name(source)}', whose heads are not {kv_heads} at every input size"
    numbered = np.arange(1, 1 + int(np.prod(k_shape)), dtype=np.float64).reshape(k_shape)
    try:
        result = evaluate_on_probe(graph, repeated, {id(source): numbered}, shape_of=first)
    except PROBE_ERRORS as error:
        return f"cannot be evaluated on a probe tensor: {error}"
    if not np.array_equal(result, np.repeat(numbered, heads // kv_heads, axis=1)):
        return "does not repeat each key/value head for a run of neighbouring query heads"
    return source, kv_heads, [unsqueeze, expand, reshape]
