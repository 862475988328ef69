"""Q, K and V projected from one input, packed into com.microsoft.Attention (the mha stage, packed).

    X -> linear -> [Split/Slice] -> Reshape/Transpose... -> [Mul scale] -> Q ┐
    X -> linear -> [Split/Slice] -> Reshape/Transpose... -> [Mul scale] -> Kᵀ┴ (the sdpa core)
    X -> linear -> [Split/Slice] -> Reshape/Transpose... -> V ───────────────┘
      -> Transpose/Reshape... -> [B, S, hidden]
  =>  Attention(X, W_qkv, b_qkv, attention_bias=mask, num_heads, scale)

"linear" is MatMul+Add (BERT), or the Reshape -> Gemm -> Reshape that GPT-2's Conv1D exports as
(one projection producing Q, K and V, split afterwards). The layout probe (attention_layout.py)
proves each chain splits heads as attention needs and says which weight columns feed which head.

A key/value cache with nothing in it yet (GPT-2 exported with use_cache=True: K and V concatenated
onto an empty past, and returned as the layer's present key/value) becomes Attention's `present`
output, split back into the two values; the probe checks that they are K and V per head.
A past (ONNX Runtime's GPT-2 export: one stacked `past` (2, B, N, P, H) per layer, K and V
concatenated onto its halves, the stacked result a `present` output) becomes Attention's `past`
input and `present` output (attention_past.py); GPT-2's causal mask, a Where on a slice of a
constant triangle, becomes `unidirectional` (attention_causal.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.fusions.attention_layout import (
    LAYOUT_OPS,
    MAX_CHAIN,
    RULE_NAME,
    LayoutProbe,
    batched_heads_fails,
    dead_helpers,
    in_graph_order,
    trace_output,
    unique_initializer,
)
from optimizer.fusions.attention_past import PastSide, concat_axis, past_side, present_of
from optimizer.fusions.attention_sdpa import (
    Sdpa,
    check_mask,
    expand_over_queries,
    extra_bias_fails,
    fill_bias,
    fill_fails,
    guarded,
    heads_bias,
    is_key_padding,
    raw_padding_mask,
    scalar_operand,
    with_extra_bias,
)
from optimizer.match import (
    MS,
    attr,
    const_array,
    const_tensor,
    consumers,
    describe,
    input_at,
    is_const,
    is_op,
    producer,
    quantized_note,
    rank,
    static_shape,
)
from optimizer.rule import Fail, Match, fail


def trace_projections(sdpa: Sdpa) -> dict[str, Projection] | tuple[str, str]:
    """Q, K and V each back to its linear projection, or (the role, what broke) for the first that is not."""
    paths = {}
    for role, value in (("Q", sdpa.qk.inputs[0]), ("K", sdpa.qk.inputs[1]), ("V", sdpa.pv.inputs[1])):
        path = _trace_projection(value)
        if isinstance(path, str):
            return role, path
        paths[role] = path
    return paths


def match_packed(graph: ir.Graph, sdpa: Sdpa, paths: dict[str, Projection]) -> Match | Fail:
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
    scale = sdpa.scale * q.scale * k.scale
    core = list(sdpa.core)

    # --- layout probe: the chains split heads as attention needs ------------------------
    probe = LayoutProbe(graph, q.x)
    heads = {}
    for role, path, key_layout in (("Q", q, False), ("K", k, sdpa.k_transposed), ("V", v, False)):
        result = probe.head_columns(path, key_layout)
        if isinstance(result, str):
            return fail("layout", f"{role} path: {result}")
        heads[role] = result
    (nq, hq, q_cols), (nk, hk, k_cols), (nv, hv, v_cols) = heads["Q"], heads["K"], heads["V"]
    if not nq == nk == nv or not hq == hk == hv:
        return fail("layout", f"Q, K, V head shapes differ: {nq}x{hq}, {nk}x{hk}, {nv}x{hv}")
    num_heads, head_size = nq, hq
    batched = sdpa.scores_reshape is not None
    if batched:
        problem = batched_heads_fails(probe, sdpa.core, sdpa.scores_reshape, sdpa.probs_reshape, num_heads)
        if problem is not None:
            return fail("layout", problem, sdpa.scores_reshape)
    batched_bias = sdpa.batched_bias
    if batched_bias is not None and (rank(batched_bias) != 3 or batched_bias.shape[1] not in (1, probe.seq)):
        return fail("mask", f"the bias '{batched_bias.name}' added to the [batch*heads, S, T] scores is "
                    f"{[str(d) for d in batched_bias.shape] if batched_bias.shape else 'of unknown shape'}, not "
                    "[batch*heads, 1, T]", producer(batched_bias))
    if batched_bias is not None and sdpa.extra_bias is not None:
        return fail("mask", "the scores carry a bias before their reshape and another beside the mask")
    out = trace_output(sdpa.pv.outputs[0], probe, num_heads, head_size, batched)
    if isinstance(out, str):
        return fail("output", out)
    out_nodes, out_value, flat_output = out
    presents = _check_cache(q, k, v, probe, heads)
    if isinstance(presents, str):
        return fail("cache", presents)
    past = _check_past(q, k, v, probe, heads, (sdpa.qk, sdpa.pv))
    if isinstance(past, str):
        return fail("past", past)
    if past is not None:
        _, past_nodes, present = past
        core += past_nodes
        presents = [present] if present is not None else []
    fill = sdpa.packed_fill
    core += sdpa.causal_nodes
    if fill is not None and fill_fails(fill[0]) is not None:
        return fill_fails(fill[0])

    # --- mask: an additive bias the fused op can broadcast ------------------------------
    padding = None
    mask = sdpa.mask
    if fill is not None:
        problem = check_mask(fill[0].inputs[0], num_heads)
        if problem is not None:
            reason, node = problem
            return fail("mask", reason.replace("mask '", "masked_fill condition '", 1), node)
    if mask is not None:
        problem = check_mask(mask, num_heads)
        if problem is not None and is_key_padding(mask):
            padding = raw_padding_mask(mask) or ("expand", None, None)
        elif problem is not None:
            reason, node = problem
            return fail("mask", reason, node)

    if extra_bias_fails(graph, sdpa.extra_bias, num_heads) is not None:
        return extra_bias_fails(graph, sdpa.extra_bias, num_heads)

    core += q.nodes + k.nodes + v.nodes + out_nodes
    core = list({id(n): n for n in core}.values())
    nodes = core + dead_helpers(core, [fill[0].inputs[0] if fill is not None else None, mask, sdpa.extra_bias,
                                       batched_bias])
    return Match(
        nodes=in_graph_order(graph, nodes),
        outputs=[out_value, *presents],
        captures={
            "graph": graph, "anchor": sdpa.softmax.name or "Softmax", "x": q.x, "mask": mask, "padding": padding,
            "present": bool(presents), "past": past[0] if past is not None else None,
            "unidirectional": sdpa.unidirectional, "guard_zero": sdpa.guard_zero, "extra_bias": sdpa.extra_bias,
            "batched_bias": batched_bias,
            "fill": fill[0] if fill is not None else None,
            "num_heads": num_heads, "scale": scale,
            "flat_output": flat_output, "hidden": num_heads * head_size,
            "parts": [(q, q_cols), (k, k_cols), (v, v_cols)],
        },
    )


def rewrite_packed(op: ir.tape.Tape, match: Match) -> list[ir.Value]:
    name = f"{RULE_NAME}/{match.anchor}"
    if match.batched_bias is not None:  # [B*N, 1, T] -> [B, N, 1, T] -> [B, N, S, T], beside the mask
        match.captures["extra_bias"] = _bias_in_heads(op, match)
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
                raw = op.op("Cast", [raw], {"to": ir.DataType.INT32}, name=f"{name}/mask_index")
            inputs[3], inputs[5] = raw, None
            attributes["mask_filter_value"] = float(filter_value)
        else:  # repeat the one mask row for every query: [B|1, 1, 1, T] -> [B|1, 1, S, T]
            inputs[5] = expand_over_queries(op, match)
    if match.fill is not None:  # the masked_fill as an additive bias: fill where masked, 0 elsewhere
        fill = fill_bias(op, match)
        inputs[5] = fill if inputs[5] is None else op.op("Add", [fill, inputs[5]], name=f"{name}/bias")
    inputs[5] = with_extra_bias(op, match, inputs[5])
    while inputs[-1] is None:
        inputs.pop()
    presents = []
    if match.past is not None:  # past (2, B, N, P, H) in, the stacked present out (onnxruntime wants it)
        output, present = op.op_multi_out("Attention", inputs, attributes, domain=MS, num_outputs=2, name=name)
        output = guarded(op, match, output)
        return [output, present] if match.present else [output]
    if match.present:  # present (2, B, N, S, H): key and value as the cache Concats returned them
        output, present = op.op_multi_out("Attention", inputs, attributes, domain=MS, num_outputs=2, name=name)
        for index, role in enumerate(("key", "value")):
            at = unique_initializer(op, match.graph, np.array(index, np.int64), f"attention_present_{role}")
            presents.append(op.op("Gather", [present, at], {"axis": 0}, name=f"{name}/present_{role}"))
    else:
        output = op.op("Attention", inputs, attributes, domain=MS, name=name)
    output = guarded(op, match, output)
    if match.flat_output:  # the block's consumer took [B*S, hidden] (dynamo GPT-2's Gemm)
        shape = unique_initializer(op, match.graph, np.array([-1, match.hidden], np.int64), "attention_flat_shape")
        output = op.op("Reshape", [output, shape], name=f"{name}/flatten")
    return [output, *presents]


def rewrite_projected(op: ir.tape.Tape, match: Match) -> list[ir.Value]:
    """MultiHeadAttention over Q, K, V as projected (attention_shared.py: a projection stays in the
    graph for another reader, and packed Attention would compute it again)."""
    name = f"{RULE_NAME}/{match.anchor}"
    bias = heads_bias(op, match, match.x)  # a key-padding mask repeated over the queries of x [B, S, hidden]
    attributes = {"num_heads": match.num_heads, "scale": float(match.scale)}
    inputs = [*match.projected] + ([None, None, bias] if bias is not None else [])
    output = guarded(op, match, op.op("MultiHeadAttention", inputs, attributes, domain=MS, name=name))
    if match.flat_output:
        shape = unique_initializer(op, match.graph, np.array([-1, match.hidden], np.int64), "attention_flat_shape")
        output = op.op("Reshape", [output, shape], name=f"{name}/flatten")
    return [output]


def _bias_in_heads(op: ir.tape.Tape, match: Match) -> ir.Value:
    """The 3-D scores' bias [B*N, 1|S, T] as [B, N, S, T]: row b*N + n is head n of batch b."""
    name, bias = f"{RULE_NAME}/{match.anchor}", match.batched_bias
    lead = unique_initializer(op, match.graph, np.array([-1, match.num_heads], np.int64), "attention_bias_heads")
    shape = op.op("Shape", [bias], name=f"{name}/bias_shape")
    rows = unique_initializer(op, match.graph, np.array([1], np.int64), "attention_bias_rows_from")
    end = unique_initializer(op, match.graph, np.array([3], np.int64), "attention_bias_rows_to")
    tail = op.op("Slice", [shape, rows, end], name=f"{name}/bias_rows")
    target = op.op("Concat", [lead, tail], {"axis": 0}, name=f"{name}/bias_target")
    heads = op.op("Reshape", [bias, target], name=f"{name}/bias_in_heads")
    if bias.shape[1] != 1:
        return heads
    queries = unique_initializer(op, match.graph, np.array([1, 1], np.int64), "attention_bias_ones")
    one = unique_initializer(op, match.graph, np.array([1], np.int64), "attention_bias_one")
    seq = op.op("Gather", [op.op("Shape", [match.x], name=f"{name}/x_shape_bias"), one], {"axis": 0},
                name=f"{name}/bias_seq")
    expand = op.op("Concat", [queries, seq, one], {"axis": 0}, name=f"{name}/bias_query_rows")
    return op.op("Expand", [heads, expand], name=f"{name}/bias_rows_per_query")


# --- the chain from a projection to Q / Kᵀ / V --------------------------------------------


class Projection:
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


def _picks_one_entry(node: ir.Node | None) -> bool:
    """Gather of one constant index out of a head split: Bloom picks Q, K or V out of its projection
    reshaped to [B, S, N, 3, H] that way."""
    index = const_array(input_at(node, 1)) if is_op(node, "Gather") else None
    return index is not None and index.ndim == 0 and is_op(producer(node.inputs[0]), "Reshape")


def _trace_projection(value: ir.Value):
    """Walk from a MatMul operand back to its linear projection; a string says what broke."""
    chain: list[ir.Node] = []
    picks: dict[int, int] = {}
    scale_nodes: list[ir.Node] = []
    scale = 1.0
    cache = past = None
    node = producer(value)
    scales = 0
    while node is not None and len(chain) + scales < MAX_CHAIN:
        if is_op(node, "Mul") or is_op(node, "Div"):
            data, factor, helpers = scalar_operand(node)
            if data is None:
                return f"is scaled by a non-constant {describe(node)}"
            scale *= factor
            scales += 1
            scale_nodes += [node, *helpers]
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
        if not any(is_op(node, t) for t in LAYOUT_OPS) and not _picks_one_entry(node):
            break
        chain.insert(0, node)
        if is_op(node, "Split"):
            picks[id(node)] = value.index()
        value = node.inputs[0]
        node = producer(value)
    linear = _linear(node)
    if linear is None:
        return f"is not MatMul+Add (or Gemm) on the block input (found {describe(node)}{quantized_note(node)})"
    x, weight, bias, linear_nodes, as_is = linear
    projection = Projection(x, weight, bias, linear_nodes, chain, picks, scale, scale_nodes)
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


def _sole_data_input(concat: ir.Node) -> ir.Value | None:
    """The one input of a Concat that holds data, when every other is provably empty (or there
    is none): the Concat then returns that input as it is."""
    data = [v for v in concat.inputs if v is not None and not _is_empty(v)]
    return data[0] if len(data) == 1 else None


def _is_empty(value: ir.Value) -> bool:
    shape = static_shape(value)
    return shape is not None and 0 in shape


def _check_cache(q: Projection, k: Projection, v: Projection, probe: LayoutProbe, heads: dict):
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
        prefix = Projection(path.x, path.weight, path.bias, path.linear_nodes, head, path.picks, 1.0, [])
        found = probe.head_columns(prefix, key_layout=False)
        if isinstance(found, str) or found[0] != heads[role][0] or not np.array_equal(found[2], heads[role][2]):
            return f"the present {role} '{path.cache.name}' is not {role} as [batch, heads, sequence, head_size]"
    return [k.cache, v.cache]


def _check_past(q: Projection, k: Projection, v: Projection, probe: LayoutProbe, heads: dict, products):
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
        prefix = Projection(path.x, path.weight, path.bias, path.linear_nodes, path.chain[:at], path.picks, 1.0, [])
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
        return ir.Tensor(np.concatenate([_columns(w.array(), cols) for w, _, cols in parts], axis=1))

    def packed_bias() -> ir.Tensor:
        return ir.Tensor(np.concatenate([_columns(b, cols) for _, b, cols in parts]))

    dtype = ir.DataType.from_numpy(q.weight.dtype)
    weight = ir.LazyTensor(packed_weight, dtype=dtype, shape=ir.Shape((q.weight.shape[0], 3 * hidden)), cache=True)
    bias = ir.LazyTensor(packed_bias, dtype=dtype, shape=ir.Shape((3 * hidden,)), cache=True)
    return (
        unique_initializer(op, match.graph, weight, "attention_qkv_weight"),
        unique_initializer(op, match.graph, bias, "attention_qkv_bias"),
    )


def _columns(array: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """array[..., cols]; a slice when the columns are a contiguous run (fancy indexing a
    BERT-base weight column by column costs ~10 ms, a slice nothing)."""
    if len(cols) and np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols))):
        return array[..., cols[0] : cols[0] + len(cols)]
    return array[..., cols]
