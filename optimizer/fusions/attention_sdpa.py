"""The scaled-dot-product core of an attention block, found from its Softmax (the sdpa stage).

    Q -> MatMul(·, Kᵀ) -> [Mul/Div scale]* -> [Add mask | Where masked_fill] -> Softmax
      -> [IsNaN/Where guard] -> MatMul(·, V)

`match_sdpa` reads the products, the scale, the mask and GPT-2's causal Where; the stages after it
(attention_packed.py: projections packed into com.microsoft.Attention; attention_heads.py: Q, K, V
already in heads, MultiHeadAttention; group_query_attention_fusion.py: the repeated K/V heads of
that, GroupQueryAttention) say how Q, K and V reach it. The mask and guard helpers here serve
every stage's rewrite.

Why the mask is passed as `attention_bias` rather than mapped to `mask_index`: current
transformers builds the padding/causal mask with vmapped index arithmetic (Flatten+Gather or
GatherND, And of comparisons); proving such a subgraph equals "attention_mask[b, j]" (and
"j <= i") would need evaluating it. The exporter's own additive mask [B|1, 1|N, S, T] is
exact by construction, and ONNX Runtime's CPU Attention broadcasts it over heads.

The NaN guard after Softmax (IsNaN -> Where(0), SDPA's answer to a query row whose every key is
masked with -inf: a left-padded row's first positions under a causal mask, an all-zero mask row)
moves after the fused op as Where(IsNaN(output), 0, output). The fused op's softmax yields NaN for
exactly the rows the guard zeroes (every logit -inf, or a NaN/inf score), and there the guarded
subgraph's row is 0·V = 0, so the two agree on every input whose V is finite; where V itself holds
NaN or inf the subgraph's output is NaN already.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from optimizer.fusions.attention_causal import causal_kind
from optimizer.fusions.attention_layout import RULE_NAME, LayoutProbe, data_consumer, unique_initializer
from optimizer.match import (
    MS,
    ancestor,
    attr,
    const_array,
    const_scalar,
    consumers,
    custom_ancestor,
    describe,
    input_at,
    is_op,
    producer,
    rank,
)
from optimizer.rule import Fail, Match, fail
from optimizer.shape_probe import constant_dims, pinned_shapes
from optimizer.value_probe import PROBE_ERRORS, evaluate_on_probe


@dataclass
class Sdpa:
    """What the stages after this one build on: the matched core and what it computes."""

    softmax: ir.Node
    qk: ir.Node  # the Q·Kᵀ product (MatMul, or FusedMatMul after MatMulScaleFusion)
    pv: ir.Node  # probabilities @ V
    scale: float
    k_transposed: bool  # the K operand arrives as Kᵀ [B, N, H, T]
    mask: ir.Value | None  # the additive mask
    fill: tuple[ir.Node, ir.Value] | None  # a masked_fill Where and the scores it reads
    packed_fill: tuple[ir.Node, ir.Value] | None  # the fill left once a causal Where became unidirectional
    unidirectional: bool
    causal_nodes: list[ir.Node]
    guard_zero: np.ndarray | None  # the NaN guard's 0, when the block has one
    core: list[ir.Node] = field(default_factory=list)
    # a second additive bias [B|1, N|1, S, T] beside the mask (MPNet's relative position bias): the
    # fused op's attention_bias is their sum, (scores + a) + b computed as scores + (a + b)
    extra_bias: ir.Value | None = None
    # The 3-D form (DeBERTa-v2): Q·Kᵀ and probs·V as [B*N, ...] products, the scores reshaped to
    # [B, N, S, T] for the mask and Softmax and back to [B*N, S, T] after it; the packed stage proves
    # both reshapes keep head n of batch b at row b*N + n.
    scores_reshape: ir.Node | None = None
    probs_reshape: ir.Node | None = None
    # a bias added to the 3-D scores before their reshape, [B*N, 1|S, T] (Bloom's ALiBi): its rows
    # are the scores' rows, so reshaped to [B, N, 1|S, T] it joins attention_bias
    batched_bias: ir.Value | None = None


def match_sdpa(graph: ir.Graph, softmax: ir.Node) -> Sdpa | Fail:
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
    pv = data_consumer(probs)
    while _same_type_cast(pv, softmax.outputs[0]):  # Bloom: a Cast to the type the probabilities have
        core.append(pv)
        probs = pv.outputs[0]
        pv = data_consumer(probs)
    probs_reshape = None
    if is_op(pv, "Reshape") and pv.inputs[0] is probs:  # [B, N, S, T] -> [B*N, S, T] for a 3-D product
        probs_reshape, probs = pv, pv.outputs[0]
        core.append(probs_reshape)
        pv = data_consumer(probs)
    if not is_op(pv, "MatMul") or pv.inputs[0] is not probs:
        found = describe(pv) if pv is not None else f"{len(consumers(probs))} consumers"
        return fail("pv", f"Softmax output does not feed a MatMul with V as its right input (found {found})", pv)
    core.append(pv)

    # --- before Softmax: [Add mask] <- [scale]* <- MatMul(Q, Kᵀ) ------------------------
    scores, mask, extra_bias = softmax.inputs[0], None, None
    while _same_type_cast(producer(scores), producer(scores).inputs[0] if producer(scores) else scores):
        core.append(producer(scores))  # MPT: a Cast of the scores to the type they have
        scores = producer(scores).inputs[0]
    add = producer(scores)
    if is_op(add, "Add"):
        scores, mask = _split_mask(add)
        if scores is None:  # two biases added in turn: a relative position bias, then the mask (MPNet)
            scores, mask, extra_bias, inner = _split_two_biases(add)
            if scores is None:
                return fail("mask", f"neither input of {describe(add)} comes from the Q·Kᵀ MatMul, nor does one "
                            "through a second bias Add", add)
            core.append(inner)
        core.append(add)
    fill = _mask_fill(producer(scores))
    if fill is not None:  # masked_fill: Where(mask, fill, scores) or Where(keep, scores, fill)
        where, scores = fill
        core.append(where)
        inner = producer(scores)
        if extra_bias is None and is_op(inner, "Add") and len(consumers(scores)) == 1:
            # a bias added under the fill (MPT's ALiBi): the fill absorbs it where it masks, so it
            # joins attention_bias beside the fill's bias
            biased, bias = _split_mask(inner)
            if biased is not None:
                core.append(inner)
                scores, extra_bias = biased, bias
    elif is_op(producer(scores), "Where"):
        where = producer(scores)
        values = [const_scalar(v) for v in where.inputs[1:]]
        shown = next((v for v in values if v is not None), None)
        if shown is not None:
            return fail("mask", f"{describe(where)} fills the scores with {shown:g}, not a large negative value "
                        f"(≤ {MASK_FILL_LIMIT:g}): it does not mask them out", where)
    scale, scores_nodes, qk, scores_reshape, batched_bias = _product(scores)
    if (scores_reshape is None) != (probs_reshape is None):
        return fail("scores", "the scores are reshaped from [batch*heads, ...] products on one side of Softmax "
                    "only", scores_reshape or probs_reshape)
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
        kind = causal_kind(fill[0].inputs[0], fill[0].inputs[1] is fill[1], LayoutProbe.scores_ints(graph, score_values))
        if not isinstance(kind, str):
            (unidirectional, causal_nodes), packed_fill = kind, None
        elif _reads_block(fill[0].inputs[0], core):  # kept as a bias, it would need the scores' shape
            return fail("mask", f"the masked_fill condition is computed from the scores themselves, and {kind}",
                        producer(fill[0].inputs[0]))
    return Sdpa(softmax, qk, pv, scale, k_transposed, mask, fill, packed_fill, unidirectional, causal_nodes,
                guard_zero, core, extra_bias, scores_reshape, probs_reshape, batched_bias)


def fill_fails(where: ir.Node) -> Fail | None:
    """Why a masked_fill cannot become an additive bias (its value does not absorb the scores), or None."""
    if absorbs_scores(where):
        return None
    return fail("mask", f"{describe(where)} fills masked scores with {fill_value(where):g}, which does not absorb a "
                f"score added to it (only ≤ {ABSORBING_FILL:g} does in float32): a query row whose every key is "
                "masked gets uniform weights from the graph, softmax of its scores from the fused op", where)


def scalar_operand(node: ir.Node) -> tuple[ir.Value | None, float, list[ir.Node]]:
    """For Mul/Div by a constant scalar, or one computed from sizes alone: (data input, multiplier,
    the nodes computing the multiplier, which go with the block)."""
    for data, const in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        factor, helpers = const_scalar(const), []
        if factor is None:
            factor, helpers = _sizes_scalar(node.graph, const)
        if factor is None:
            continue
        if is_op(node, "Div"):
            if const is not node.inputs[1] or factor == 0.0:
                return None, 0.0, []
            return data, 1.0 / factor, helpers
        return data, factor, helpers
    return None, 0.0, []


def _sizes_scalar(graph: ir.Graph | None, value: ir.Value) -> tuple[float | None, list[ir.Node]]:
    """A scalar the graph computes from its inputs' sizes alone, the same at both probe sizes
    (shape_probe): TorchScript's SDPA scale sqrt(head_size) from a Shape of K, where inference left
    the head size unnamed. Data never reaches it: the probe evaluates constants and Shapes only."""
    if graph is None or value.producer() is None:
        return None, []
    try:
        first, second = pinned_shapes(graph, value)
        at_first = evaluate_on_probe(graph, value, {}, first)
        at_second = evaluate_on_probe(graph, value, {}, second)
    except PROBE_ERRORS:
        return None, []
    if at_first.size != 1 or at_second.size != 1 or not np.issubdtype(at_first.dtype, np.floating):
        return None, []
    if float(at_first.reshape(())) != float(at_second.reshape(())):
        return None, []
    return float(at_first.reshape(())), _computing(value)


def _probe_dims(graph: ir.Graph, value: ir.Value) -> list[int | None] | None:
    """A value computed from constants and sizes alone (a slice of a bias buffer), evaluated at both
    probe sizes: each dimension a number where both agree, None where they differ; None when it
    cannot be evaluated."""
    try:
        first, second = pinned_shapes(graph, value)
        at_first = evaluate_on_probe(graph, value, {}, first)
        at_second = evaluate_on_probe(graph, value, {}, second)
    except PROBE_ERRORS:
        return None
    if at_first.ndim != at_second.ndim:
        return None
    return [a if a == b else None for a, b in zip(at_first.shape, at_second.shape, strict=True)]


def _computing(value: ir.Value) -> list[ir.Node]:
    """The nodes computing `value` back to its Shapes (inclusive) and constants."""
    nodes, stack = {}, [value.producer()]
    while stack:
        node = stack.pop()
        if node is None or id(node) in nodes:
            continue
        nodes[id(node)] = node
        if not is_op(node, "Shape"):
            stack += [v.producer() for v in node.inputs if v is not None]
    return list(nodes.values())


def _walk_scale(scores: ir.Value):
    """Constant Mul/Div steps between the Q·Kᵀ MatMul and the mask Add: (scale, nodes, matmul)."""
    scale, nodes = 1.0, []
    node = producer(scores)
    while is_op(node, "Mul") or is_op(node, "Div"):
        data, factor, helpers = scalar_operand(node)
        nodes += [node, *helpers]
        if data is None:
            return None, nodes, None
        scale *= factor
        node = producer(data)
    return scale, nodes, node


def _product(scores: ir.Value):
    """(scale, nodes, the Q·Kᵀ MatMul, the Reshape to [B, N, S, T] or None, a bias added to the 3-D
    scores or None) for the scores: the product 4-D, or 3-D ([B*N, S, T], reshaped to 4-D, with scale
    steps on either side and at most one bias Add before the reshape)."""
    scale, nodes, node = _walk_scale(scores)
    if scale is None or not is_op(node, "Reshape"):
        return scale, nodes, node, None, None
    inner, more, matmul = _walk_scale(node.inputs[0])
    bias = None
    if is_op(matmul, "Add") and inner is not None:  # baddbmm: bias + alpha * Q·Kᵀ
        add = matmul
        for side in (0, 1):
            scaled, steps, found = _walk_scale(add.inputs[side])
            if scaled is not None and is_op(found, "MatMul") and rank(found.inputs[0]) in (None, 3):
                inner, more, matmul, bias = inner * scaled, [*more, add, *steps], found, add.inputs[1 - side]
                break
    if inner is None or not is_op(matmul, "MatMul") or rank(matmul.inputs[0]) not in (None, 3):
        return scale, nodes, node, None, None
    return scale * inner, [*nodes, node, *more], matmul, node, bias


def _same_type_cast(node: ir.Node | None, value: ir.Value) -> bool:
    """A Cast of `value` to the type it already has: it changes nothing."""
    to = attr(node, "to", None) if is_op(node, "Cast") else None
    return to is not None and value.dtype is not None and int(to) == int(value.dtype)


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


def fill_value(where: ir.Node) -> float:
    return next(float(a.reshape(())) for a in (const_array(v) for v in where.inputs[1:]) if a is not None and a.size == 1)


def absorbs_scores(where: ir.Node) -> bool:
    return fill_value(where) <= ABSORBING_FILL


def _split_mask(add: ir.Node) -> tuple[ir.Value | None, ir.Value | None]:
    """(scores, mask) for the Add before Softmax: scores are the side that reaches the Q·Kᵀ MatMul."""
    for scores, mask in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        fill = _mask_fill(producer(scores))
        _, _, matmul, reshape, _ = _product(fill[1] if fill is not None else scores)
        if (is_op(matmul, "MatMul") or is_op(matmul, "FusedMatMul", MS)) and rank(matmul.inputs[0]) in (
            None, 3 if reshape is not None else 4
        ):
            return scores, mask
    return None, None


def _split_two_biases(add: ir.Node):
    """(scores, mask, other bias, the inner Add) for Add(Add(scores, a), b) in either operand order,
    the mask being whichever of a and b is one row of key biases (a padding mask) if one is; else Nones."""
    for side in (0, 1):
        inner = producer(add.inputs[side])
        if not is_op(inner, "Add") or len(consumers(inner.outputs[0])) != 1:
            continue
        scores, first = _split_mask(inner)
        if scores is None:
            continue
        second = add.inputs[1 - side]
        mask, extra = (first, second) if is_key_padding(first) and not is_key_padding(second) else (second, first)
        return scores, mask, extra, inner
    return None, None, None, None


def extra_bias_fails(graph: ir.Graph, extra: ir.Value | None, num_heads: int) -> Fail | None:
    """Why a second bias cannot join the mask in attention_bias, or None."""
    if extra is None:
        return None
    if rank(extra) == 3:  # [N|1, 1, T], broadcast as [1, N|1, 1, T] (MPT's ALiBi: a slice of a buffer)
        dims = _probe_dims(graph, extra) or constant_dims(graph, extra) or list(extra.shape)
        if dims[0] in (1, num_heads) and dims[1] == 1:
            return None
        return fail("mask", f"the bias '{extra.name}' added beside the mask is {[str(d) for d in extra.shape]}, "
                    f"not [1 or {num_heads}, 1, key]", producer(extra))
    problem = check_mask(extra, num_heads)
    if problem is None or _one_query_row(extra):
        return None
    return fail("mask", f"the bias added beside the mask: {problem[0]}", problem[1])


def _one_query_row(bias: ir.Value) -> bool:
    """A [B|1, N|1, 1, T] bias: one row, repeated over the queries (ALiBi)."""
    return rank(bias) == 4 and bias.shape[2] == 1


def with_extra_bias(op: ir.tape.Tape, match: Match, bias: ir.Value | None) -> ir.Value | None:
    """attention_bias with the second bias (if any) added to it."""
    extra = match.captures.get("extra_bias")
    if extra is None:
        return bias
    if rank(extra) == 3:
        axes = unique_initializer(op, match.graph, np.array([0], np.int64), "attention_bias_batch_axis")
        extra = op.op("Unsqueeze", [extra, axes], name=f"{RULE_NAME}/{match.anchor}/bias_batch")
        extra = expand_over_queries(op, match, extra)
    elif _one_query_row(extra):
        extra = expand_over_queries(op, match, extra)
    if bias is None:
        return extra
    return op.op("Add", [extra, bias], name=f"{RULE_NAME}/{match.anchor}/biases")


def _reads_block(value: ir.Value, block: list[ir.Node]) -> bool:
    """Whether `value` is computed from an output of `block` (a Shape of the scores, say)."""
    inside = {id(n) for n in block}
    return ancestor(value, lambda node: id(node) in inside) is not None


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


def check_mask(mask: ir.Value, num_heads: int) -> tuple[str, ir.Node | None] | None:
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


def is_key_padding(mask: ir.Value) -> bool:
    """A [B|1, 1, 1, T] mask: one row of key biases shared by every query (BERT's padding mask)."""
    shape = mask.shape
    return shape is not None and len(shape) == 4 and shape[1] == 1 and shape[2] == 1


def raw_padding_mask(mask: ir.Value):
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


def guarded(op: ir.tape.Tape, match: Match, output: ir.Value) -> ir.Value:
    """The subgraph's NaN guard, moved after the fused op: Where(IsNaN(output), 0, output)."""
    if match.guard_zero is None:
        return output
    name = f"{RULE_NAME}/{match.anchor}"
    zero = unique_initializer(op, match.graph, np.zeros((), match.guard_zero.dtype), "attention_guard_zero")
    isnan = op.op("IsNaN", [output], name=f"{name}/masked_rows")
    return op.op("Where", [isnan, zero, output], name=f"{name}/guard")


def fill_bias(op: ir.tape.Tape, match: Match) -> ir.Value:
    where = match.fill
    fill_side = 1 if const_array(where.inputs[1]) is not None and const_array(where.inputs[1]).size == 1 else 2
    fill_value = float(const_array(where.inputs[fill_side]).reshape(()))
    fill = unique_initializer(op, match.graph, np.array(fill_value, np.float32), "attention_mask_fill")
    zero = unique_initializer(op, match.graph, np.array(0.0, np.float32), "attention_mask_zero")
    branches = [fill, zero] if fill_side == 1 else [zero, fill]
    return op.op("Where", [where.inputs[0], *branches], name=f"{RULE_NAME}/{match.anchor}/fill_bias")


def heads_bias(op: ir.tape.Tape, match: Match, x_shape_source: ir.Value) -> ir.Value | None:
    """attention_bias for the heads form: the additive mask and/or the masked_fill as a bias."""
    bias = match.mask
    if match.padding is not None:
        bias = expand_over_queries(op, match)
    if match.fill is not None:
        fill = fill_bias(op, match)
        bias = fill if bias is None else op.op("Add", [fill, bias], name=f"{RULE_NAME}/{match.anchor}/bias")
    return with_extra_bias(op, match, bias)


def expand_over_queries(op: ir.tape.Tape, match: Match, bias: ir.Value | None = None) -> ir.Value:
    """Expand(mask, [1, 1, S, 1]) with S read at run time from the block input [B, S, hidden], or
    from Q in heads [B, N, S, H] in the heads form."""
    graph, name = match.graph, f"{RULE_NAME}/{match.anchor}"
    one_one = unique_initializer(op, graph, np.array([1, 1], np.int64), "attention_ones2")
    one = unique_initializer(op, graph, np.array([1], np.int64), "attention_ones1")
    axis = one if match.captures.get("heads") is None else unique_initializer(
        op, graph, np.array([2], np.int64), "attention_query_axis")
    shape = op.op("Shape", [match.x], name=f"{name}/x_shape")
    seq = op.op("Gather", [shape, axis], {"axis": 0}, name=f"{name}/seq")
    target = op.op("Concat", [one_one, seq, one], {"axis": 0}, name=f"{name}/mask_shape")
    bias = match.mask if bias is None else bias
    return op.op("Expand", [bias, target], name=f"{name}/{'mask' if bias is match.mask else 'bias'}_rows")
