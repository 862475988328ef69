"""AttentionFusion: a multi-head self-attention block => com.microsoft.Attention.

    X -> linear -> [Split/Slice] -> Reshape/Transpose... -> [Mul scale] -> Q ┐
    X -> linear -> [Split/Slice] -> Reshape/Transpose... -> [Mul scale] -> Kᵀ┴ MatMul
      -> [Mul/Div scale] -> [Add mask] -> Softmax -> [IsNaN/Where guard] -> MatMul(·, V)
      -> Transpose/Reshape... -> [B, S, hidden]
  =>  Attention(X, W_qkv, b_qkv, attention_bias=mask, num_heads, scale)

Anchored on Softmax. "linear" is MatMul+Add (BERT), or the Reshape -> Gemm -> Reshape
that GPT-2's Conv1D exports as (one projection producing Q, K and V, split afterwards).

Why a layout probe instead of a fixed node sequence: exporters reach [B, N, S, H] through
different Reshape/Transpose orders (TorchScript folds K's two transposes into perm
(0,2,3,1); the dynamo exporter's SDPA decomposition transposes K through a 3-D reshape),
and the reshape targets are computed from Shape ops. We run each Reshape/Transpose/Split/
Slice chain on a small numbered array (batch 2, sequence 3, or the model's static sizes),
evaluating the shape subgraphs for those sizes, and read off from the numbers where each
element went. That proves the chain is the head split (or merge) it must be, yields the
number of heads and head size, and tells which projection columns feed Q, K and V.

Why the mask is passed as `attention_bias` rather than mapped to `mask_index`: current
transformers builds the padding/causal mask with vmapped index arithmetic (Flatten+Gather or
GatherND, And of comparisons); proving such a subgraph equals "attention_mask[b, j]" (and
"j <= i") would need evaluating it. The exporter's own additive mask [B|1, 1|N, S, T] is
exact by construction, and ONNX Runtime's CPU Attention broadcasts it over heads.

A key/value cache with nothing in it yet (GPT-2 exported with use_cache=True: K and V concatenated
onto an empty past, and returned as the layer's present key/value) becomes Attention's `present`
output, split back into the two values; the probe checks that they are K and V per head.

A past (ONNX Runtime's GPT-2 export: one stacked `past` (2, B, N, P, H) per layer, K and V
concatenated onto its halves, the stacked result a `present` output) becomes Attention's `past`
input and `present` output (attention_past.py); GPT-2's causal mask, a Where on a slice of a
constant triangle, becomes `unidirectional` (attention_causal.py).

Q, K and V may also reach the scores already projected and split into heads, with work between the
projection and the product that Attention's packed weight cannot express (Llama's rotary
embedding, grouped-query K/V repeated to every head): then the block becomes MultiHeadAttention on
Q (back in [B, S, hidden]) and K, V in heads, the probe checking the Kᵀ chain and the head merge.
When K and V in heads are Concats onto a per-layer past_key / past_value (Hugging Face's cache),
the Concats go into the op as its past inputs and present outputs.

The NaN guard after Softmax (IsNaN -> Where(0), SDPA's answer to a query row whose every key is
masked with -inf: a left-padded row's first positions under a causal mask, an all-zero mask row)
moves after the fused op as Where(IsNaN(output), 0, output). The fused op's softmax yields NaN for
exactly the rows the guard zeroes (every logit -inf, or a NaN/inf score), and there the guarded
subgraph's row is 0·V = 0, so the two agree on every input whose V is finite; where V itself holds
NaN or inf the subgraph's output is NaN already.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.fusions.attention_causal import causal_kind
from optimizer.fusions.attention_past import PastSide, concat_axis, past_side, present_of
from optimizer.match import (
    MS,
    ancestor,
    attr,
    const_array,
    const_scalar,
    const_tensor,
    consumers,
    custom_ancestor,
    describe,
    input_at,
    is_const,
    is_custom,
    is_op,
    producer,
    rank,
    static_shape,
)
from optimizer.rule import Match, Rule, fail
from optimizer.shape_probe import constant_dims, pinned_shapes
from optimizer.text import preview

# Data-movement ops a Q/K/V or output chain may contain; the layout probe checks them.
LAYOUT_OPS = ("Reshape", "Transpose", "Split", "Slice")
# Ops that compute reshape targets; removed with the block when nothing else reads them.
SHAPE_OPS = frozenset(
    {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Constant", "Reshape",
     "Mul", "Div", "Add", "Sub", "Size"}
)
PROBE_BATCH, PROBE_SEQ = 2, 3
PROBE_HEADS = 5  # only where nothing says how many heads: a size no other probe dimension has
MAX_CHAIN = 8


class AttentionFusion(Rule):
    name = "AttentionFusion"
    anchors = ("Softmax",)
    emits = ("com.microsoft.Attention", "com.microsoft.MultiHeadAttention")

    def match(self, graph: ir.Graph, softmax: ir.Node):
        if rank(softmax.inputs[0]) not in (None, 4):
            return fail("softmax", f"{describe(softmax)} normalizes a rank-{rank(softmax.inputs[0])} tensor, not "
                        "[batch, heads, query, key] attention scores", softmax)
        if attr(softmax, "axis", -1) not in (-1, 3):
            return fail("softmax", f"{describe(softmax)} normalizes axis {attr(softmax, 'axis')}, not the key axis")
        core: list[ir.Node] = [softmax]

        # --- after Softmax: optional NaN guard, then probabilities @ V ---------------------
        probs = softmax.outputs[0]
        guard = _nan_guard(softmax)
        if guard is not None:
            core += guard
            probs = guard[-1].outputs[0]
        guard_zero = const_array(guard[1].inputs[1]) if guard is not None else None
        pv = _data_consumer(probs)
        if not is_op(pv, "MatMul") or pv.inputs[0] is not probs:
            found = describe(pv) if pv is not None else f"{len(consumers(probs))} consumers"
            return fail("pv", f"Softmax output does not feed a MatMul with V as its right input (found {found})", pv)
        core.append(pv)

        # --- before Softmax: [Add mask] <- [scale]* <- MatMul(Q, Kᵀ) ------------------------
        scores, mask = softmax.inputs[0], None
        add = producer(scores)
        if is_op(add, "Add"):
            scores, mask = _split_mask(add)
            if scores is None:
                return fail("mask", f"neither input of {describe(add)} comes from the Q·Kᵀ MatMul", add)
            core.append(add)
        fill = _mask_fill(producer(scores))
        if fill is not None:  # masked_fill: Where(mask, fill, scores) or Where(keep, scores, fill)
            where, scores = fill
            core.append(where)
        elif is_op(producer(scores), "Where"):
            where = producer(scores)
            values = [const_scalar(v) for v in where.inputs[1:]]
            shown = next((v for v in values if v is not None), None)
            if shown is not None:
                return fail("mask", f"{describe(where)} fills the scores with {shown:g}, not a large negative value "
                            f"(≤ {MASK_FILL_LIMIT:g}): it does not mask them out", where)
        scale, scores_nodes, qk = _walk_scale(scores)
        if scale is None:
            return fail("scores", f"the scores are scaled by a non-constant {describe(scores_nodes[-1])}", scores_nodes[-1])
        core += scores_nodes
        k_transposed = True  # the K operand arrives as Kᵀ [B, N, H, S]
        if is_op(qk, "FusedMatMul", MS):  # MatMulScaleFusion / MatmulTransposeFusion ran first
            if attr(qk, "transA", 0) or attr(qk, "transBatchA", 0) or attr(qk, "transBatchB", 0):
                return fail("scores", f"{describe(qk)} transposes batch axes; not a Q·Kᵀ product")
            scale *= attr(qk, "alpha", 1.0)
            k_transposed = not attr(qk, "transB", 0)
        elif not is_op(qk, "MatMul"):
            return fail("scores", f"Softmax input does not come from a Q·Kᵀ MatMul (found {describe(qk)})", qk)
        core.append(qk)
        # GPT-2's causal mask, a Where on a slice of a constant triangle: Attention's unidirectional.
        unidirectional, packed_fill, causal_nodes = False, fill, []
        if fill is not None:
            score_values = [qk.outputs[0], *(n.outputs[0] for n in scores_nodes)]
            kind = causal_kind(fill[0].inputs[0], fill[0].inputs[1] is fill[1], _Probe.scores_ints(score_values))
            if not isinstance(kind, str):
                (unidirectional, causal_nodes), packed_fill = kind, None
            elif _reads_block(fill[0].inputs[0], core):  # kept as a bias, it would need the scores' shape
                return fail("mask", f"the masked_fill condition is computed from the scores themselves, and {kind}",
                            producer(fill[0].inputs[0]))

        # --- Q, K, V paths back to their projections ---------------------------------------
        paths = {}
        for role, value in (("Q", qk.inputs[0]), ("K", qk.inputs[1]), ("V", pv.inputs[1])):
            path = _trace_projection(value)
            if isinstance(path, str):
                # Q, K and V may arrive already projected and split into heads, with work between the
                # projection and the product (Llama's rotary embedding and grouped-query K/V repeat):
                # then the fused op is MultiHeadAttention on those heads.
                heads_form = self._match_heads(graph, softmax, core, qk, pv, scale, k_transposed, mask, fill,
                                                 guard_zero)
                if isinstance(heads_form, Match):
                    return heads_form
                reason = f"{role} projection {path}"
                if isinstance(heads_form, str):
                    reason += f"; as heads for MultiHeadAttention: {heads_form}"
                return fail("projection", reason, None)
            paths[role] = path
        q, k, v = paths["Q"], paths["K"], paths["V"]
        for role, path in (("K", k), ("V", v)):
            if path.x is not q.x:
                return fail(
                    "projection",
                    f"{role} projection reads '{path.x.name}', not the same input as Q ('{q.x.name}'): "
                    "cross-attention has no packed-QKV fused form",
                )
        if v.scale != 1.0:
            return fail("projection", "V is scaled before the MatMul; the fused op cannot express that")
        if rank(q.x) not in (None, 3):
            return fail("projection", f"input '{q.x.name}' has rank {rank(q.x)}, expected [batch, sequence, hidden]")
        scale *= q.scale * k.scale

        # --- layout probe: the chains split heads as attention needs ------------------------
        probe = _Probe(q.x)
        heads = {}
        for role, path, key_layout in (("Q", q, False), ("K", k, k_transposed), ("V", v, False)):
            result = probe.head_columns(path, key_layout)
            if isinstance(result, str):
                return fail("layout", f"{role} path: {result}")
            heads[role] = result
        (nq, hq, q_cols), (nk, hk, k_cols), (nv, hv, v_cols) = heads["Q"], heads["K"], heads["V"]
        if not nq == nk == nv or not hq == hk == hv:
            return fail("layout", f"Q, K, V head shapes differ: {nq}x{hq}, {nk}x{hk}, {nv}x{hv}")
        num_heads, head_size = nq, hq
        out = _trace_output(pv.outputs[0], probe, num_heads, head_size)
        if isinstance(out, str):
            return fail("output", out)
        out_nodes, out_value, flat_output = out
        presents = _check_cache(q, k, v, probe, heads)
        if isinstance(presents, str):
            return fail("cache", presents)
        past = _check_past(q, k, v, probe, heads, (qk, pv))
        if isinstance(past, str):
            return fail("past", past)
        if past is not None:
            _, past_nodes, present = past
            core += past_nodes
            presents = [present] if present is not None else []
        fill = packed_fill
        core += causal_nodes
        if fill is not None and not _absorbs_scores(fill[0]):
            return fail("mask", f"{describe(fill[0])} fills masked scores with {_fill_value(fill[0]):g}, which does not "
                        f"absorb a score added to it (only ≤ {ABSORBING_FILL:g} does in float32): a query row whose every "
                        "key is masked gets uniform weights from the graph, softmax of its scores from the fused op",
                        fill[0])

        # --- mask: an additive bias the fused op can broadcast ------------------------------
        padding = None
        if fill is not None:
            problem = _check_mask(fill[0].inputs[0], num_heads)
            if problem is not None:
                reason, node = problem
                return fail("mask", reason.replace("mask '", "masked_fill condition '", 1), node)
        if mask is not None:
            problem = _check_mask(mask, num_heads)
            if problem is not None and _is_key_padding(mask):
                padding = _raw_padding_mask(mask) or ("expand", None, None)
            elif problem is not None:
                reason, node = problem
                return fail("mask", reason, node)

        core += q.nodes + k.nodes + v.nodes + out_nodes
        core = list({id(n): n for n in core}.values())
        nodes = core + _dead_helpers(core, [fill[0].inputs[0] if fill is not None else None, mask])
        return Match(
            nodes=_in_graph_order(graph, nodes),
            outputs=[out_value, *presents],
            captures={
                "graph": graph, "anchor": softmax.name or "Softmax", "x": q.x, "mask": mask, "padding": padding,
                "present": bool(presents), "past": past[0] if past is not None else None,
                "unidirectional": unidirectional, "guard_zero": guard_zero,
                "fill": fill[0] if fill is not None else None,
                "num_heads": num_heads, "scale": scale,
                "flat_output": flat_output, "hidden": num_heads * head_size,
                "parts": [(q, q_cols), (k, k_cols), (v, v_cols)],
            },
        )

    def _rewrite_heads(self, op: ir.tape.Tape, match: Match):
        q4, k4, v4 = match.heads
        name = f"{self.name}/{match.anchor}"
        perm = op.op("Transpose", [q4], {"perm": [0, 2, 1, 3]}, name=f"{name}/query_bsnh")
        flat = _unique_initializer(op, match.graph, np.array([0, 0, match.hidden], np.int64), "attention_query_shape")
        query = op.op("Reshape", [perm, flat], name=f"{name}/query")
        bias = _heads_bias(op, match, q4)
        attributes = {"num_heads": match.num_heads, "scale": float(match.scale)}
        presents = []
        if match.cache is not None:  # new K, V as [B, S, hidden] after the past in the op's cache inputs
            past_key, past_value, k_new, v_new = match.cache
            key, value = (_merged_heads(op, match, v, role) for v, role in ((k_new, "key"), (v_new, "value")))
            inputs = [query, key, value, None, None, bias, past_key, past_value]
            output, *presents = op.op_multi_out("MultiHeadAttention", inputs, attributes, domain=MS, num_outputs=3,
                                                name=name)
        else:
            inputs = [query, k4, v4] + ([None, None, bias] if bias is not None else [])
            output = op.op("MultiHeadAttention", inputs, attributes, domain=MS, name=name)
        output = _guarded(op, match, output)
        if match.flat_output:
            shape = _unique_initializer(op, match.graph, np.array([-1, match.hidden], np.int64), "attention_flat_shape")
            output = op.op("Reshape", [output, shape], name=f"{name}/flatten")
        return [output, *presents]

    def _match_heads(self, graph, softmax, core, qk, pv, scale, k_transposed, mask, fill, guard_zero):
        """The block over Q, K, V already in heads, [B, N, S, H], as MultiHeadAttention: a Match, or
        why not (a string), or None when Q is not such a tensor at all."""
        q4, v4 = qk.inputs[0], pv.inputs[1]
        if rank(q4) != 4 or q4.shape is None:
            return None
        dims = _heads_dims(graph, q4)
        if not isinstance(dims[1], int) or not isinstance(dims[3], int):
            return (f"Q '{q4.name}' has shape {[str(d) for d in q4.shape]}: the number of heads and the head "
                    "size must be known numbers (they vary with the input sizes)")
        num_heads, head_size = dims[1], dims[3]
        probe = _Probe.for_heads(graph, q4, num_heads, head_size)

        def like_q(value: ir.Value) -> bool:  # [B, N, T, H] with Q's heads and head size
            found = _heads_dims(graph, value) if rank(value) == 4 else None
            return found is not None and found[1] == num_heads and found[3] == head_size

        k_chain: list[ir.Node] = []
        k4 = qk.inputs[1]
        if k_transposed:  # Kᵀ: walk back to a [B, N, T, H] value the chain swaps the last axes of
            while not like_q(k4) or not k_chain:
                node = producer(k4)
                if not (is_op(node, "Transpose") or is_op(node, "Reshape")) or len(k_chain) >= 4:
                    return "Kᵀ does not come from K [batch, heads, keys, head_size] through Transpose/Reshape"
                k_chain.insert(0, node)
                k4 = node.inputs[0]
            numbered = np.arange(probe.batch * num_heads * 5 * head_size, dtype=np.int64).reshape(
                probe.batch, num_heads, 5, head_size)
            probe.shapes[id(k4)] = numbered.shape
            probe.symbols.setdefault(str(k4.shape[2]), 5)
            moved = probe.run(k_chain, numbered)
            if isinstance(moved, str) or not np.array_equal(moved, numbered.swapaxes(2, 3)):
                return f"{describe(k_chain[-1])} does not turn K [batch, heads, keys, head_size] into Kᵀ"
        for role, value in (("K", k4), ("V", v4)):
            if not like_q(value):
                return f"{role} '{value.name}' is not [batch, {num_heads}, keys, {head_size}] like Q"
        out = _trace_output(pv.outputs[0], probe, num_heads, head_size)
        if isinstance(out, str):
            return out
        out_nodes, out_value, flat_output = out
        if fill is not None and not _absorbs_scores(fill[0]):
            return (f"{describe(fill[0])} fills masked scores with {_fill_value(fill[0]):g}, which does not absorb a "
                    "score added to it: a query row whose every key is masked would differ")
        if fill is not None and _check_mask(fill[0].inputs[0], num_heads) is not None:
            return _check_mask(fill[0].inputs[0], num_heads)[0]
        padding = None
        if mask is not None:
            problem = _check_mask(mask, num_heads)
            if problem is not None and not _is_key_padding(mask):
                return problem[0]
            padding = ("expand", None, None) if problem is not None else None
        # A cache per layer (past_key, past_value): the Concats onto it go into the fused op, whose
        # present_key / present_value outputs take their place.
        cache = _heads_cache(k4, v4)
        concats = [cache[0], cache[1]] if cache is not None else []
        nodes = list({id(n): n for n in core + k_chain + out_nodes + concats}.values())
        nodes += _dead_helpers(nodes, [fill[0].inputs[0] if fill is not None else None, mask])
        return Match(
            nodes=_in_graph_order(graph, nodes),
            outputs=[out_value, *(c.outputs[0] for c in concats)],
            captures={
                "cache": cache[2:] if cache is not None else None,
                "graph": graph, "anchor": softmax.name or "Softmax", "heads": (q4, k4, v4), "x": q4,
                "mask": mask, "padding": padding, "fill": fill[0] if fill is not None else None, "present": False,
                "guard_zero": guard_zero,
                "num_heads": num_heads, "scale": scale, "flat_output": flat_output, "hidden": num_heads * head_size,
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        if match.captures.get("heads") is not None:
            return self._rewrite_heads(op, match)
        weight, bias = _packed_weights(op, match)
        attributes = {"num_heads": match.num_heads, "scale": float(match.scale)}
        if match.unidirectional:
            attributes["unidirectional"] = 1
        # input, weights, bias, mask_index, past, attention_bias
        inputs: list[ir.Value | None] = [match.x, weight, bias, None, match.past, match.mask]
        if match.padding is not None:
            kind, raw, filter_value = match.padding
            if kind == "index":  # the [batch, key] 0/1 mask itself, as onnxruntime's fusion passes it
                if raw.dtype != ir.DataType.INT32:
                    raw = op.op("Cast", [raw], {"to": ir.DataType.INT32}, name=f"{self.name}/{match.anchor}/mask_index")
                inputs[3], inputs[5] = raw, None
                attributes["mask_filter_value"] = float(filter_value)
            else:  # repeat the one mask row for every query: [B|1, 1, 1, T] -> [B|1, 1, S, T]
                inputs[5] = _expand_over_queries(op, match)
        if match.fill is not None:  # the masked_fill as an additive bias: fill where masked, 0 elsewhere
            fill_bias = _fill_bias(op, match)
            inputs[5] = fill_bias if inputs[5] is None else op.op(
                "Add", [fill_bias, inputs[5]], name=f"{self.name}/{match.anchor}/bias")
        while inputs[-1] is None:
            inputs.pop()
        name = f"{self.name}/{match.anchor}"
        presents = []
        if match.past is not None:  # past (2, B, N, P, H) in, the stacked present out (onnxruntime wants it)
            output, present = op.op_multi_out("Attention", inputs, attributes, domain=MS, num_outputs=2, name=name)
            output = _guarded(op, match, output)
            return [output, present] if match.present else [output]
        if match.present:  # present (2, B, N, S, H): key and value as the cache Concats returned them
            output, present = op.op_multi_out("Attention", inputs, attributes, domain=MS, num_outputs=2, name=name)
            for index, role in enumerate(("key", "value")):
                at = _unique_initializer(op, match.graph, np.array(index, np.int64), f"attention_present_{role}")
                presents.append(op.op("Gather", [present, at], {"axis": 0}, name=f"{name}/present_{role}"))
        else:
            output = op.op("Attention", inputs, attributes, domain=MS, name=name)
        output = _guarded(op, match, output)
        if match.flat_output:  # the block's consumer took [B*S, hidden] (dynamo GPT-2's Gemm)
            shape = _unique_initializer(op, match.graph, np.array([-1, match.hidden], np.int64), "attention_flat_shape")
            output = op.op("Reshape", [output, shape], name=f"{self.name}/{match.anchor}/flatten")
        return [output, *presents]


# --- the chain from a projection to Q / Kᵀ / V --------------------------------------------


class _Projection:
    """One of Q, K, V: the linear it comes from and the layout chain after it."""

    def __init__(self, x, weight, bias, linear_nodes, chain, picks, scale, scale_nodes):
        self.x = x  # the [B, S, hidden_in] input
        self.weight = weight  # [hidden_in, out]
        self.bias = bias  # [out]
        self.linear_nodes = linear_nodes
        self.chain = chain  # layout nodes from the linear output to the MatMul operand
        self.picks = picks  # id(Split node) -> the output index the chain follows
        self.scale = scale
        self.flat_linear = linear_nodes[0].op_type == "Reshape"  # Reshape -> Gemm -> Reshape
        self.nodes = linear_nodes + chain + scale_nodes
        self.initializers: tuple[ir.Value, ir.Value] | None = None  # (W, b) usable unchanged
        self.cache: ir.Value | None = None  # K or V as it leaves through the (empty) cache, if it does
        self.past: tuple[ir.Node, PastSide] | None = None  # the Concat onto a past, and its past half


def _trace_projection(value: ir.Value):
    """Walk from a MatMul operand back to its linear projection; a string says what broke."""
    chain: list[ir.Node] = []
    picks: dict[int, int] = {}
    scale_nodes: list[ir.Node] = []
    scale = 1.0
    cache = past = None
    node = producer(value)
    while node is not None and len(chain) + len(scale_nodes) < MAX_CHAIN:
        if is_op(node, "Mul") or is_op(node, "Div"):
            data, factor = _scalar_operand(node)
            if data is None:
                return f"is scaled by a non-constant {describe(node)}"
            scale *= factor
            scale_nodes.append(node)
            value = data
            node = producer(data)
            continue
        if is_op(node, "Concat") and _sole_data_input(node) is not None and cache is None:
            # K or V appended to an empty cache: the Concat's output is the layer's present key/value
            cache = node.outputs[0]
            chain.insert(0, node)
            value = _sole_data_input(node)
            node = producer(value)
            continue
        if is_op(node, "Concat") and cache is None and past is None:
            side = past_side(node)
            if isinstance(side, str):
                return f"is concatenated onto a cache that Attention cannot take: {side}"
            if side is not None:  # K or V appended to a past: Attention's past input
                past = (node, side)
                chain.insert(0, node)
                value = node.inputs[1]
                node = producer(value)
                continue
        if not any(is_op(node, t) for t in LAYOUT_OPS):
            break
        chain.insert(0, node)
        if is_op(node, "Split"):
            picks[id(node)] = value.index()
        value = node.inputs[0]
        node = producer(value)
    linear = _linear(node)
    if linear is None:
        return f"is not MatMul+Add (or Gemm) on the block input (found {describe(node)})"
    x, weight, bias, linear_nodes, as_is = linear
    projection = _Projection(x, weight, bias, linear_nodes, chain, picks, scale, scale_nodes)
    projection.initializers = as_is
    projection.cache = cache
    projection.past = past
    return projection


class _Weight:
    """A projection weight [in, out] whose data is decoded only when the packed weight is built.

    Matching needs only its shape and dtype; decoding every Q/K/V weight of a 12-layer model
    just to look at them would cost more than the whole rewrite.
    """

    def __init__(self, value: ir.Value, shape: tuple[int, ...], transpose: bool = False) -> None:
        self.value = value
        # The tensor itself, not the value: by the time the packed weight is built (serializing,
        # for shape inference too) the value may have been swapped for a graph input.
        self.tensor = const_tensor(value)
        self.transpose = transpose
        self.shape = shape[::-1] if transpose else shape
        self.dtype = self.tensor.dtype.numpy()

    def array(self) -> np.ndarray:
        data = self.tensor.numpy()
        return data.T if self.transpose else data


def _weight(value: ir.Value | None, transpose: bool = False) -> _Weight | None:
    shape = static_shape(value) if is_const(value) else None
    if shape is None or len(shape) != 2:
        return None
    return _Weight(value, shape, transpose)


def _linear(node: ir.Node | None):
    """(x, W [in, out], b [out], nodes) for MatMul(+Add) or Reshape->Gemm->Reshape, else None."""
    if is_op(node, "Add"):
        for out, b in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            matmul = producer(out)
            bias = const_array(b)
            if is_op(matmul, "MatMul") and bias is not None and bias.ndim == 1:
                weight = _weight(matmul.inputs[1])
                if weight is not None and weight.shape[1] == bias.shape[0]:
                    return matmul.inputs[0], weight, bias, [matmul, node], (matmul.inputs[1], b)
        return None
    if is_op(node, "MatMul"):
        weight = _weight(node.inputs[1])
        if weight is not None:
            return node.inputs[0], weight, np.zeros(weight.shape[1], weight.dtype), [node], None
        return None
    if is_op(node, "Gemm"):  # Conv1D: Reshape(X, [-1, in]) -> Gemm; the chain reshapes back
        return _gemm_linear(node)
    return None


def _gemm_linear(gemm: ir.Node | None):
    if not is_op(gemm, "Gemm") or attr(gemm, "transA", 0) or attr(gemm, "alpha", 1.0) != 1.0:
        return None
    weight = _weight(gemm.inputs[1], transpose=bool(attr(gemm, "transB", 0)))
    bias = const_array(input_at(gemm, 2))
    if weight is None:
        return None
    as_is = None  # the initializers themselves, when Attention can take them unchanged
    if not attr(gemm, "transB", 0) and bias is not None and bias.shape == (weight.shape[1],) and attr(gemm, "beta", 1.0) == 1.0:
        as_is = (gemm.inputs[1], gemm.inputs[2])
    if bias is None:
        bias = np.zeros(weight.shape[1], weight.dtype)
    else:
        bias = np.broadcast_to(bias * attr(gemm, "beta", 1.0), (weight.shape[1],)).astype(weight.dtype)
    flatten = producer(gemm.inputs[0])
    if not is_op(flatten, "Reshape") or rank(flatten.inputs[0]) != 3:
        return None
    return flatten.inputs[0], weight, bias, [flatten, gemm], as_is


def _scalar_operand(node: ir.Node) -> tuple[ir.Value | None, float]:
    """For Mul/Div by a constant scalar: (data input, multiplier)."""
    for data, const in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        factor = const_scalar(const)
        if factor is None:
            continue
        if is_op(node, "Div"):
            if const is not node.inputs[1] or factor == 0.0:
                return None, 0.0
            return data, 1.0 / factor
        return data, factor
    return None, 0.0


def _walk_scale(scores: ir.Value):
    """Constant Mul/Div steps between the Q·Kᵀ MatMul and the mask Add: (scale, nodes, matmul)."""
    scale, nodes = 1.0, []
    node = producer(scores)
    while is_op(node, "Mul") or is_op(node, "Div"):
        data, factor = _scalar_operand(node)
        nodes.append(node)
        if data is None:
            return None, nodes, None
        scale *= factor
        node = producer(data)
    return scale, nodes, node


# A masked_fill value at or below this is "minus infinity" to softmax: exp(-1e4) underflows to 0.
MASK_FILL_LIMIT = -1e4


def _mask_fill(node: ir.Node | None) -> tuple[ir.Node, ir.Value] | None:
    """(the Where, the scores) for a masked_fill: Where(c, fill, scores) or Where(c, scores, fill)
    with fill a constant at or below MASK_FILL_LIMIT (DistilBERT, GPT-2's causal mask).

    As an additive bias, Where(c, fill, 0) + scores, it gives every masked logit fill + score
    instead of fill, which softmax weighs as 0 all the same; a row whose every key is masked is
    the exception (uniform weights before, softmax of the scores after), as with the NaN guard."""
    if not is_op(node, "Where"):
        return None
    for fill_side, data_side in ((1, 2), (2, 1)):
        fill = const_array(node.inputs[fill_side])
        if fill is not None and fill.size == 1 and float(fill.reshape(())) <= MASK_FILL_LIMIT:
            return node, node.inputs[data_side]
    return None


# A fill this large swallows any finite score added to it in float32 (half its ulp is ~1e22), so the
# additive bias Where(c, fill, 0) + scores equals the masked_fill Where(c, fill, scores) exactly,
# fully masked rows (uniform weights either way) included.
ABSORBING_FILL = -1e30


def _fill_value(where: ir.Node) -> float:
    return next(float(a.reshape(())) for a in (const_array(v) for v in where.inputs[1:]) if a is not None and a.size == 1)


def _absorbs_scores(where: ir.Node) -> bool:
    return _fill_value(where) <= ABSORBING_FILL


def _fill_bias(op: ir.tape.Tape, match: Match) -> ir.Value:
    where = match.fill
    fill_side = 1 if const_array(where.inputs[1]) is not None and const_array(where.inputs[1]).size == 1 else 2
    fill_value = float(const_array(where.inputs[fill_side]).reshape(()))
    fill = _unique_initializer(op, match.graph, np.array(fill_value, np.float32), "attention_mask_fill")
    zero = _unique_initializer(op, match.graph, np.array(0.0, np.float32), "attention_mask_zero")
    branches = [fill, zero] if fill_side == 1 else [zero, fill]
    return op.op("Where", [where.inputs[0], *branches], name=f"{AttentionFusion.name}/{match.anchor}/fill_bias")


def _heads_bias(op: ir.tape.Tape, match: Match, x_shape_source: ir.Value) -> ir.Value | None:
    """attention_bias for the heads form: the additive mask and/or the masked_fill as a bias."""
    bias = match.mask
    if match.padding is not None:
        bias = _expand_over_queries(op, match)
    if match.fill is not None:
        fill_bias = _fill_bias(op, match)
        bias = fill_bias if bias is None else op.op("Add", [fill_bias, bias], name=f"{AttentionFusion.name}/{match.anchor}/bias")
    return bias


def _sole_data_input(concat: ir.Node) -> ir.Value | None:
    """The one input of a Concat that holds data, when every other is provably empty (or there
    is none): the Concat then returns that input as it is."""
    data = [v for v in concat.inputs if v is not None and not _is_empty(v)]
    return data[0] if len(data) == 1 else None


def _is_empty(value: ir.Value) -> bool:
    shape = static_shape(value)
    return shape is not None and 0 in shape


def _check_cache(q: _Projection, k: _Projection, v: _Projection, probe: _Probe, heads: dict):
    """The present key and value ([] without a cache), or why the cache does not fit Attention.

    Attention's `present` output is (2, B, N, S, H): K and V per head as [B, N, S, H]. The values
    the cache Concats return must be exactly that, which the probe checks on the chain up to them.
    """
    if q.cache is None and k.cache is None and v.cache is None:
        return []
    if q.cache is not None or k.cache is None or v.cache is None:
        return "only one of key and value goes through a cache (or the query does)"
    for role, path in (("K", k), ("V", v)):
        head = path.chain[: path.chain.index(path.cache.producer()) + 1]
        prefix = _Projection(path.x, path.weight, path.bias, path.linear_nodes, head, path.picks, 1.0, [])
        found = probe.head_columns(prefix, key_layout=False)
        if isinstance(found, str) or found[0] != heads[role][0] or not np.array_equal(found[2], heads[role][2]):
            return f"the present {role} '{path.cache.name}' is not {role} as [batch, heads, sequence, head_size]"
    return [k.cache, v.cache]


def _check_past(q: _Projection, k: _Projection, v: _Projection, probe: _Probe, heads: dict, products):
    """(past, the nodes of the cache path, the present value or None), None without a past, or why
    the cache does not fit Attention's past (2, B, N, P, H) / present (2, B, N, P+S, H)."""
    if q.past is None and k.past is None and v.past is None:
        return None
    if q.past is not None or k.past is None or v.past is None:
        return "only one of key and value is concatenated onto a past (or the query is)"
    (k_concat, k_side), (v_concat, v_side) = k.past, v.past
    if k_side.past is not v_side.past or (k_side.index, v_side.index) != (0, 1):
        return "key and value are not entries 0 and 1 of one stacked past"
    if v_side.swapped:
        return "the past value is transposed; Attention's past holds it as [batch, heads, past, head_size]"
    num_heads, head_size = heads["K"][0], heads["K"][1]
    dims = k_side.past.shape
    if any(isinstance(d, int) and d != want for d, want in ((dims[2], num_heads), (dims[4], head_size))):
        return f"the past '{k_side.past.name}' is {[str(d) for d in dims]}, not (2, batch, {num_heads}, past, {head_size})"
    ends = []
    for role, path, concat, side, product in (("K", k, k_concat, k_side, products[0]), ("V", v, v_concat, v_side, products[1])):
        at = path.chain.index(concat)
        prefix = _Projection(path.x, path.weight, path.bias, path.linear_nodes, path.chain[:at], path.picks, 1.0, [])
        found = probe.head_columns(prefix, key_layout=side.swapped)
        if isinstance(found, str) or found[0] != heads[role][0] or not np.array_equal(found[2], heads[role][2]):
            return f"the new {role} does not reach {describe(concat)} as {role} per head in the past's layout"
        if concat_axis(concat) != (3 if side.swapped else 2):
            return f"{describe(concat)} joins axis {attr(concat, 'axis')}, not the sequence axis of the past"
        inside = {id(n) for n in path.nodes} | {id(product)}
        onward = next((u for u in consumers(concat.outputs[0]) if id(u) in inside), None)
        end = present_of(concat, onward, side.swapped)
        if isinstance(end, str):
            return end
        ends.append(end)
    nodes = k_side.nodes + v_side.nodes
    if ends == [None, None]:
        return k_side.past, nodes, None
    if None in ends or ends[0][1] is not ends[1][1] or (ends[0][2], ends[1][2]) != (0, 1):
        return "the present does not stack the concatenated key and value as (key, value) on a new first axis"
    return k_side.past, nodes + ends[0][0] + ends[1][0] + [ends[0][1]], ends[0][1].outputs[0]


def _reads_block(value: ir.Value, block: list[ir.Node]) -> bool:
    """Whether `value` is computed from an output of `block` (a Shape of the scores, say)."""
    inside = {id(n) for n in block}
    return ancestor(value, lambda node: id(node) in inside) is not None


def _split_mask(add: ir.Node) -> tuple[ir.Value | None, ir.Value | None]:
    """(scores, mask) for the Add before Softmax: scores are the side that reaches the Q·Kᵀ MatMul."""
    for scores, mask in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        fill = _mask_fill(producer(scores))
        _, _, matmul = _walk_scale(fill[1] if fill is not None else scores)
        if (is_op(matmul, "MatMul") or is_op(matmul, "FusedMatMul", MS)) and rank(matmul.inputs[0]) in (None, 4):
            return scores, mask
    return None, None


def _guarded(op: ir.tape.Tape, match: Match, output: ir.Value) -> ir.Value:
    """The subgraph's NaN guard, moved after the fused op: Where(IsNaN(output), 0, output)."""
    if match.guard_zero is None:
        return output
    name = f"{AttentionFusion.name}/{match.anchor}"
    zero = _unique_initializer(op, match.graph, np.zeros((), match.guard_zero.dtype), "attention_guard_zero")
    isnan = op.op("IsNaN", [output], name=f"{name}/masked_rows")
    return op.op("Where", [isnan, zero, output], name=f"{name}/guard")


def _nan_guard(softmax: ir.Node) -> list[ir.Node] | None:
    """Softmax -> IsNaN -> Where(isnan, 0, softmax): SDPA's guard for fully masked rows."""
    users = consumers(softmax.outputs[0])
    isnan = next((n for n in users if is_op(n, "IsNaN")), None)
    where = next((n for n in users if is_op(n, "Where")), None)
    if isnan is None or where is None or len(users) != 2:
        return None
    if where.inputs[0] is not isnan.outputs[0] or where.inputs[2] is not softmax.outputs[0]:
        return None
    zero = const_array(where.inputs[1])
    if zero is None or zero.size != 1 or float(zero.reshape(())) != 0.0:
        return None
    return [isnan, where]


def _check_mask(mask: ir.Value, num_heads: int) -> tuple[str, ir.Node | None] | None:
    """None when `mask` can be the fused op's attention_bias [B|1, 1|N, S, T]; else (reason, node)."""
    if rank(mask) is None:
        barrier = custom_ancestor(mask)
        if barrier is not None:
            return (f"mask path contains custom op {describe(barrier)}; its shape is unknown", barrier)
        return (f"the rank of mask '{mask.name}' is unknown", producer(mask))
    if rank(mask) != 4:
        return (f"mask '{mask.name}' has rank {rank(mask)}, expected [batch, 1 or heads, query, key]", producer(mask))
    heads_dim = mask.shape[1] if mask.shape is not None else None
    if isinstance(heads_dim, int) and heads_dim not in (1, num_heads):
        return (f"mask '{mask.name}' has {heads_dim} in the heads axis, not 1 or {num_heads}", producer(mask))
    query_dim = mask.shape[2] if mask.shape is not None else None
    if query_dim == 1:
        return (f"mask '{mask.name}' is [batch, 1, 1, key]; the fused op needs one row per query", producer(mask))
    return None


def _is_key_padding(mask: ir.Value) -> bool:
    """A [B|1, 1, 1, T] mask: one row of key biases shared by every query (BERT's padding mask)."""
    shape = mask.shape
    return shape is not None and len(shape) == 4 and shape[1] == 1 and shape[2] == 1


def _raw_padding_mask(mask: ir.Value):
    """("index", m, c) when `mask` is (1 - m[:, None, None, :]) * c for a [B, T] input m.

    onnxruntime's Attention takes such an m as its 2-D mask_index and adds mask_filter_value c
    where m is 0, nothing where it is 1: the same as the subgraph for the 0/1 masks
    attention_mask holds by contract (a 2 would differ: the subgraph adds -c). None otherwise.
    """
    mul = producer(mask)
    if not is_op(mul, "Mul"):
        return None
    for side in (0, 1):
        sub, filter_value = producer(input_at(mul, side)), const_scalar(input_at(mul, 1 - side))
        if filter_value is None or not is_op(sub, "Sub") or const_scalar(sub.inputs[0]) != 1.0:
            continue
        value = sub.inputs[1]
        if is_op(producer(value), "Cast"):
            value = producer(value).inputs[0]
        axes: list[int] = []
        while is_op(producer(value), "Unsqueeze") and len(axes) < 2:
            node = producer(value)
            found = attr(node, "axes")
            if found is None:
                found = const_array(input_at(node, 1))
            if found is None:
                return None
            axes = [int(a) for a in np.asarray(found).reshape(-1)] + axes
            value = node.inputs[0]
        if sorted(axes) != [1, 2] or rank(value) != 2:
            return None
        if value.dtype not in (ir.DataType.INT32, ir.DataType.INT64, ir.DataType.FLOAT, ir.DataType.BOOL):
            return None
        return "index", value, filter_value
    return None


def _expand_over_queries(op: ir.tape.Tape, match: Match) -> ir.Value:
    """Expand(mask, [1, 1, S, 1]) with S read from the block input at run time."""
    graph, name = match.graph, f"{AttentionFusion.name}/{match.anchor}"
    one_one = _unique_initializer(op, graph, np.array([1, 1], np.int64), "attention_ones2")
    one = _unique_initializer(op, graph, np.array([1], np.int64), "attention_ones1")
    shape = op.op("Shape", [match.x], name=f"{name}/x_shape")
    seq = op.op("Gather", [shape, one], {"axis": 0}, name=f"{name}/seq")
    target = op.op("Concat", [one_one, seq, one], {"axis": 0}, name=f"{name}/mask_shape")
    return op.op("Expand", [match.mask, target], name=f"{name}/mask_rows")


# --- the layout probe ----------------------------------------------------------------------


class _Probe:
    """Runs layout chains on numbered arrays for a small batch and sequence length."""

    def __init__(self, x: ir.Value):
        dims = list(x.shape) if x.shape is not None else [None, None, None]
        self.batch = dims[0] if isinstance(dims[0], int) else PROBE_BATCH
        self.seq = dims[1] if isinstance(dims[1], int) else PROBE_SEQ
        # Symbolic dims of the block input name the batch and sequence everywhere else.
        self.symbols = {}
        for dim, size in ((dims[0], self.batch), (dims[1], self.seq)):
            if dim is not None and not isinstance(dim, int):
                self.symbols[str(dim)] = size
        self.shapes: dict[int, tuple[int, ...]] = {}  # id(value) -> probe shape
        self.x = x
        self.pinned: dict[str, tuple[int, ...]] = {}  # shapes at pinned input sizes (for_heads)

    @classmethod
    def scores_ints(cls, score_values: list[ir.Value]):
        """ints(value, queries, keys) with the attention scores [batch, heads, queries, keys]: the
        causal mask's slice bounds are computed from their shape."""

        def ints(value: ir.Value, queries: int, keys: int):
            probe = cls.__new__(cls)
            probe.batch, probe.seq, probe.symbols, probe.x, probe.pinned = PROBE_BATCH, queries, {}, None, {}
            probe.shapes = {id(v): (PROBE_BATCH, PROBE_HEADS, queries, keys) for v in score_values}
            return probe.ints(value)

        return ints

    @classmethod
    def for_heads(cls, graph: ir.Graph, q4: ir.Value, num_heads: int, head_size: int) -> _Probe:
        """A probe whose batch and sequence are those of Q in heads, [B, N, S, H].

        Where Q's batch or sequence is symbolic, the probe takes the sizes of the graph inferred
        with its inputs pinned (shape_probe), and reads any other shape it needs from there too.
        """
        dims = list(q4.shape)
        probe = cls.__new__(cls)
        probe.pinned = {}
        if not isinstance(dims[0], int) or not isinstance(dims[2], int):
            probe.pinned = pinned_shapes(graph, q4)[0]
        pinned = probe.pinned.get(q4.name)
        probe.batch = dims[0] if isinstance(dims[0], int) else pinned[0] if pinned else PROBE_BATCH
        probe.seq = dims[2] if isinstance(dims[2], int) else pinned[2] if pinned else PROBE_SEQ
        probe.symbols = {str(d): size for d, size in ((dims[0], probe.batch), (dims[2], probe.seq))
                         if d is not None and not isinstance(d, int)}
        probe.shapes = {id(q4): (probe.batch, num_heads, probe.seq, head_size)}
        probe.x = q4
        return probe

    def head_columns(self, path: _Projection, key_layout: bool):
        """(num_heads, head_size, projection columns per head) or a reason string."""
        weight_in = path.weight.shape[0]
        self.shapes[id(path.x)] = (self.batch, self.seq, weight_in)
        out_features = path.weight.shape[1]
        rows = self.batch * self.seq
        numbered = np.arange(rows * out_features, dtype=np.int64).reshape(self.batch, self.seq, out_features)
        if path.flat_linear:
            flatten = path.linear_nodes[0]
            target = self.ints(flatten.inputs[1])
            if target is None or tuple(_reshape_dims((self.batch, self.seq, weight_in), target, flatten)) != (rows, weight_in):
                return f"{describe(flatten)} does not flatten the input to [batch*sequence, hidden]"
            array = numbered.reshape(rows, out_features)
            self.shapes[id(path.linear_nodes[1].outputs[0])] = array.shape
            chain = path.linear_nodes[2:] + path.chain
        else:
            array = numbered
            self.shapes[id(path.linear_nodes[-1].outputs[0])] = array.shape
            chain = path.chain
        array = self.run(chain, array, path.picks)
        if isinstance(array, str):
            return array
        if array.ndim != 4:
            return f"reaches the MatMul with rank {array.ndim}, not [batch, heads, ...]"
        if key_layout:
            array = array.swapaxes(2, 3)
        batch, num_heads, seq, head_size = array.shape
        if (batch, seq) != (self.batch, self.seq):
            return f"does not put batch and sequence on axes 0 and 2 (probe shape {list(array.shape)})"
        columns = (array[0, :, 0, :] % out_features).reshape(-1)
        row_start = (np.arange(self.batch)[:, None, None, None] * self.seq + np.arange(self.seq)[None, None, :, None]) * out_features
        expected = row_start + columns.reshape(1, num_heads, 1, head_size)
        if not np.array_equal(array, expected):
            return "does not split the hidden axis into heads as [batch, heads, sequence, head_size]"
        return num_heads, head_size, columns

    def run(self, chain: list[ir.Node], array: np.ndarray, picks: dict[int, int] | None = None):
        for node in chain:
            if is_op(node, "Transpose"):
                perm = attr(node, "perm", None)
                array = array.transpose(perm) if perm is not None else array.T
            elif is_op(node, "Reshape"):
                target = self.ints(node.inputs[1])
                if target is None:
                    return f"the target shape of {describe(node)} cannot be evaluated"
                dims = _reshape_dims(array.shape, target, node)
                if dims is None or int(np.prod(dims)) != array.size:
                    return f"{describe(node)} target {preview(target)} does not fit probe shape {list(array.shape)}"
                array = array.reshape(dims)
            elif is_op(node, "Split"):
                array = self._split(node, array, (picks or {}).get(id(node), 0))
                if isinstance(array, str):
                    return array
                continue  # _split records the shape of the output it followed
            elif is_op(node, "Slice"):
                array = self._slice(node, array)
                if isinstance(array, str):
                    return array
            elif is_op(node, "Concat"):  # onto an empty cache: the data as it is
                pass
            self.shapes[id(node.outputs[0])] = array.shape
        return array

    def _split(self, node: ir.Node, array: np.ndarray, index: int):
        axis = attr(node, "axis", 0)
        sizes = const_array(input_at(node, 1)) if input_at(node, 1) is not None else attr(node, "split", None)
        count = len(node.outputs)
        if sizes is None:
            if array.shape[axis] % count:
                return f"{describe(node)} splits an axis of {array.shape[axis]} into {count} unequal parts"
            sizes = [array.shape[axis] // count] * count
        bounds = np.cumsum([0, *list(sizes)])
        picked = np.take(array, np.arange(bounds[index], bounds[index + 1]), axis=axis)
        self.shapes[id(node.outputs[index])] = picked.shape
        return picked

    def _slice(self, node: ir.Node, array: np.ndarray):
        starts, ends = const_array(node.inputs[1]), const_array(node.inputs[2])
        axes = const_array(input_at(node, 3)) if input_at(node, 3) is not None else np.arange(len(starts))
        steps = const_array(input_at(node, 4)) if input_at(node, 4) is not None else np.ones(len(starts), np.int64)
        if starts is None or ends is None or axes is None or steps is None:
            return f"{describe(node)} has non-constant bounds"
        index = [slice(None)] * array.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            index[int(axis)] = slice(int(start), int(min(end, np.iinfo(np.int64).max)), int(step))
        return array[tuple(index)]

    def ints(self, value: ir.Value | None) -> np.ndarray | None:
        """Evaluate a small integer tensor (a reshape target) for the probe sizes; None if we can't."""
        try:
            return self._ints(value)
        except (ValueError, IndexError, TypeError):  # ill-formed for the probe sizes: not provable
            return None

    def _ints(self, value: ir.Value | None) -> np.ndarray | None:
        if value is None:
            return None
        array = const_array(value)
        if array is not None:
            return array.astype(np.int64)
        node = producer(value)
        if node is None:
            return None
        if is_op(node, "Shape"):
            shape = self._shape_of(node.inputs[0])
            if shape is None:
                return None
            start, end = attr(node, "start", 0), attr(node, "end", None)
            return np.array(shape[start:end], np.int64)
        args = [self._ints(v) if v is not None else None for v in node.inputs]
        if any(a is None for a, v in zip(args, node.inputs, strict=True) if v is not None):
            return None
        if is_op(node, "Gather") and attr(node, "axis", 0) == 0:
            return np.take(args[0], args[1])
        if is_op(node, "Unsqueeze"):
            axes = args[1] if len(args) > 1 and args[1] is not None else attr(node, "axes")
            return np.expand_dims(args[0], tuple(int(a) for a in np.atleast_1d(axes)))
        if is_op(node, "Squeeze"):
            return args[0].reshape(-1)[0] if args[0].size == 1 else args[0]
        if is_op(node, "Concat"):
            return np.concatenate([np.atleast_1d(a) for a in args], axis=0)
        if is_op(node, "Cast"):
            return args[0].astype(np.int64)
        if is_op(node, "Reshape"):
            return args[0].reshape(args[1])
        if is_op(node, "Slice"):
            return self._slice(node, args[0]) if not isinstance(self._slice(node, args[0]), str) else None
        arithmetic = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Div": np.floor_divide}
        if node.op_type in arithmetic and is_op(node, node.op_type):
            return arithmetic[node.op_type](args[0], args[1])
        return None

    def _shape_of(self, value: ir.Value) -> tuple[int, ...] | None:
        if id(value) in self.shapes:
            return self.shapes[id(value)]
        if value.name in self.pinned:  # consistent with batch and seq (for_heads)
            return self.pinned[value.name]
        if value.shape is None:
            return None
        dims = []
        for dim in value.shape:
            if isinstance(dim, int):
                dims.append(dim)
            elif str(dim) in self.symbols:
                dims.append(self.symbols[str(dim)])
            else:
                return None
        return tuple(dims)


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
    name = f"{AttentionFusion.name}/{match.anchor}/{role}"
    perm = op.op("Transpose", [heads], {"perm": [0, 2, 1, 3]}, name=f"{name}_bsnh")
    flat = _unique_initializer(op, match.graph, np.array([0, 0, match.hidden], np.int64), f"attention_{role}_shape")
    return op.op("Reshape", [perm, flat], name=name)


def _heads_dims(graph: ir.Graph, value: ir.Value) -> list[int | str | None]:
    """A rank-4 value's dims, the symbolic ones replaced by the number the graph fixes them to
    (TorchScript's Llama leaves the heads of view(batch, seq, -1, head_size) symbolic)."""
    dims = list(value.shape) if value.shape is not None else [None] * 4
    if isinstance(dims[1], int) and isinstance(dims[3], int):
        return dims
    fixed = constant_dims(graph, value)
    if fixed is None or len(fixed) != 4:
        return dims
    return [d if isinstance(d, int) else (f if f is not None else d) for d, f in zip(dims, fixed, strict=True)]


def _reshape_dims(shape, target: np.ndarray, node: ir.Node) -> list[int] | None:
    dims = [int(d) for d in np.atleast_1d(target)]
    if not attr(node, "allowzero", 0):
        dims = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(dims)]
    if dims.count(-1) > 1:
        return None
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        total = int(np.prod(shape))
        if known == 0 or total % known:
            return None
        dims[dims.index(-1)] = total // known
    return dims


def _trace_output(value: ir.Value, probe: _Probe, num_heads: int, head_size: int):
    """Follow Transpose/Reshape after probs@V until [B, S, hidden] (or [B*S, hidden])."""
    batch, seq, hidden = probe.batch, probe.seq, num_heads * head_size
    numbered = np.arange(batch * num_heads * seq * head_size, dtype=np.int64).reshape(batch, num_heads, seq, head_size)
    merged = numbered.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    probe.shapes[id(value)] = numbered.shape
    nodes: list[ir.Node] = []
    array = numbered
    while len(nodes) < MAX_CHAIN:
        user = _data_consumer(value)
        if not (is_op(user, "Transpose") or is_op(user, "Reshape")) or user.inputs[0] is not value:
            break
        array = probe.run([user], array)
        if isinstance(array, str):
            return f"after the attention MatMul: {array}"
        nodes.append(user)
        value = user.outputs[0]
        if array.shape == merged.shape and np.array_equal(array, merged):
            return nodes, value, False
        if array.shape == (batch * seq, hidden) and np.array_equal(array, merged.reshape(batch * seq, hidden)):
            return nodes, value, True
    found = describe(_data_consumer(value)) if _data_consumer(value) is not None else "several consumers"
    return f"the heads are not merged back to [batch, sequence, {hidden}] by Transpose/Reshape (stopped at {found})"


def _data_consumer(value: ir.Value) -> ir.Node | None:
    """The one node reading `value` other than Shape ops (which only read its dimensions).

    A graph output still has its one reader: the driver's boundary check then names it.
    """
    users = [u for u in consumers(value) if not is_op(u, "Shape")]
    return users[0] if len(users) == 1 else None


# --- removing the shape arithmetic only this block used ------------------------------------


def _dead_helpers(core: list[ir.Node], kept: list[ir.Value | None] = ()) -> list[ir.Node]:
    """Shape/Constant nodes that feed only the matched block (they die with it), except those
    computing `kept`: values the fused op still reads (a masked_fill's condition)."""
    inside = {id(n) for n in core}
    kept_ids = {id(v) for v in kept if v is not None}
    candidates: dict[int, ir.Node] = {}
    stack: list[ir.Node] = []
    for node in core:
        for value in node.inputs:  # upstream: reshape targets, scale constants
            helper = producer(value)
            if helper is not None and id(helper) not in inside and helper.op_type in SHAPE_OPS and not is_custom(helper):
                stack.append(helper)
        for value in node.outputs:  # downstream: Shape() of an intermediate value
            stack += [u for u in consumers(value) if is_op(u, "Shape") and id(u) not in inside]
    while stack:
        node = stack.pop()
        if id(node) in candidates or id(node) in inside:
            continue
        if node.op_type not in SHAPE_OPS or is_custom(node):
            continue
        if not all(v.type is None or not _is_float(v) for v in node.outputs) and not is_op(node, "Constant"):
            continue
        candidates[id(node)] = node
        for value in node.outputs:
            stack += [u for u in consumers(value) if u.op_type in SHAPE_OPS]
        if not is_op(node, "Shape"):
            stack += [p for p in (producer(v) for v in node.inputs) if p is not None]
    for key, node in list(candidates.items()):
        if any(id(v) in kept_ids for v in node.outputs):
            del candidates[key]
    changed = True
    while changed:
        changed = False
        keep = inside | set(candidates)
        for key, node in list(candidates.items()):
            if any(v.is_graph_output() or any(id(u) not in keep for u in consumers(v)) for v in node.outputs):
                del candidates[key]
                changed = True
    return list(candidates.values())


def _is_float(value: ir.Value) -> bool:
    dtype = getattr(value.type, "dtype", None)
    return dtype is not None and dtype.is_floating_point()


def _in_graph_order(graph: ir.Graph, nodes: list[ir.Node]) -> list[ir.Node]:
    wanted = {id(n) for n in nodes}
    return [n for n in graph if id(n) in wanted]


# --- the packed weights --------------------------------------------------------------------


def _packed_weights(op: ir.tape.Tape, match: Match) -> tuple[ir.Value, ir.Value]:
    (q, q_cols), (k, k_cols), (v, v_cols) = match.parts
    single = q.linear_nodes[-1] is k.linear_nodes[-1] is v.linear_nodes[-1]
    hidden = match.hidden
    in_order = np.array_equal(np.concatenate([q_cols, k_cols, v_cols]), np.arange(3 * hidden))
    if single and in_order and q.weight.shape[1] == 3 * hidden and q.initializers is not None:
        return q.initializers  # GPT-2's Conv1D is already packed as Attention wants
    parts = [(q.weight, q.bias, q_cols), (k.weight, k.bias, k_cols), (v.weight, v.bias, v_cols)]

    # Packing copies every projection weight (85 MB on BERT-base); it is deferred to when the
    # weights are read or saved, so the graph rewrite itself stays cheap.
    def packed_weight() -> ir.Tensor:
        return ir.tensor(np.concatenate([_columns(w.array(), cols) for w, _, cols in parts], axis=1))

    def packed_bias() -> ir.Tensor:
        return ir.tensor(np.concatenate([_columns(b, cols) for _, b, cols in parts]))

    dtype = ir.DataType.from_numpy(q.weight.dtype)
    weight = ir.LazyTensor(packed_weight, dtype=dtype, shape=ir.Shape((q.weight.shape[0], 3 * hidden)), cache=True)
    bias = ir.LazyTensor(packed_bias, dtype=dtype, shape=ir.Shape((3 * hidden,)), cache=True)
    return (
        _unique_initializer(op, match.graph, weight, "attention_qkv_weight"),
        _unique_initializer(op, match.graph, bias, "attention_qkv_bias"),
    )


def _columns(array: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """array[..., cols]; a slice when the columns are a contiguous run (fancy indexing a
    BERT-base weight column by column costs ~10 ms, a slice nothing)."""
    if len(cols) and np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols))):
        return array[..., cols[0] : cols[0] + len(cols)]
    return array[..., cols]


def _unique_initializer(op: ir.tape.Tape, graph: ir.Graph, data: np.ndarray | ir.TensorProtocol, stem: str) -> ir.Value:
    taken = set(graph.initializers) | {v.name for v in op.initializers}
    index = 0
    while f"{stem}_{index}" in taken:
        index += 1
    name = f"{stem}_{index}"
    tensor = ir.tensor(data) if isinstance(data, np.ndarray) else data
    tensor.name = name
    return op.initializer(tensor, name=name)


__all__ = ["AttentionFusion"]
