"""RotaryEmbeddingFusion: Llama's rotate-half rotary embedding => com.microsoft.RotaryEmbedding.

    x (B, N, S, H) ─ Slice [H/2:] ─ Neg ─┐         (or the two outputs of one Split)
    x ───────────── Slice [:H/2] ───────── Concat(-1) ─ Mul(·, sin4) ─┐
    x ─────────────────────────────────────────────── Mul(·, cos4) ── Add
    cos4 = Unsqueeze(C, 1),  C = [Cast] [Mul scale] Cos(Concat(f, f, axis=-1)),  sin4 alike with Sin
  =>  RotaryEmbedding(x, position_ids', cos_cache, sin_cache, interleaved=0)

Anchored on Neg, which these exports use nowhere else. Why a probe for the rotate-half: the
TorchScript exporter computes the slice bounds from Shape(x) at run time, the dynamo exporter writes
them as constants; running the Slice/Neg/Concat chain (and the bounds' shape arithmetic) on a
numbered x proves either spelling is `concat(-x[..., H/2:], x[..., :H/2])`.

Why the caches are built from the model's own angles rather than folded: Llama exports compute
f = position_ids · inv_freq (B, S, H/2) at run time, and nothing in the graph bounds the positions.
The op's caches are indexed by position id, so the rewrite makes f itself the cache: one row per
token, cos_cache = Cos(f as (B·S, H/2)) (times the exporter's attention scaling), and position ids
0 .. B·S-1 shaped (B, S). The values are the ones the unfused graph multiplies by, bit for bit, and
no position can fall outside the cache. Every site reading one f builds the same nodes;
CommonSubexpressionElimination merges them in the next round. The op requires per-token position
ids shaped (B, S) as x's batch and sequence, so f must have those (shown by the pinned shape probe);
where it broadcasts over either, no rule fires.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.fusions.gelu_fusion import check_gelu_dtype
from optimizer.match import (
    MS,
    attr,
    const_array,
    consumers,
    describe,
    is_op,
    other_input,
    producer,
    sole_consumer,
    through_noop_casts,
    value_name,
)
from optimizer.rule import Match, Rule, fail
from optimizer.shape_probe import constant_dims, pinned_shapes
from optimizer.value_probe import PROBE_ERRORS, evaluate_on_probe

PROBE_BATCH, PROBE_SEQUENCE = 2, 3  # stand-ins for dimensions the graph leaves symbolic
MAX_BOUND_NODES = 24  # shape arithmetic behind a slice bound that the probe will evaluate
# What onnxruntime's CPU provider registers the op for (bfloat16 has no kernel there).
ROTARY_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


class RotaryEmbeddingFusion(Rule):
    name = "RotaryEmbeddingFusion"
    anchors = ("Neg",)
    emits = ("com.microsoft.RotaryEmbedding",)

    def match(self, graph: ir.Graph, neg: ir.Node):
        # --- rotate_half(x) = Concat(Neg(Slice(x, H/2:)), Slice(x, :H/2)) ---------------------
        upper = producer(neg.inputs[0])
        if not is_op(upper, "Slice") and not is_op(upper, "Split"):
            return fail(
                "rotate_half", f"Neg negates {describe(upper)}, not a Slice or Split of the rotated tensor", upper
            )
        x = upper.inputs[0]
        concat = sole_consumer(neg.outputs[0])
        if not is_op(concat, "Concat") or len(concat.inputs) != 2 or concat.inputs[0] is not neg.outputs[0]:
            return fail(
                "rotate_half",
                f"Neg's result is not the first of two inputs of one Concat "
                f"(read by {', '.join(describe(n) for n in consumers(neg.outputs[0])) or 'nothing'})",
            )
        lower = producer(concat.inputs[1])
        if not (is_op(lower, "Slice") or is_op(lower, "Split")) or lower.inputs[0] is not x:
            return fail(
                "rotate_half",
                f"Concat's second input comes from {describe(lower)}, not a Slice or Split of '{value_name(x)}'",
                lower,
            )
        dtype_problem = check_gelu_dtype(x, "RotaryEmbedding", ROTARY_TYPES)
        if dtype_problem:
            return dtype_problem
        dims = constant_dims(graph, x)
        if dims is None or len(dims) != 4 or dims[1] is None or dims[3] is None:
            return fail(
                "shape",
                f"'{value_name(x)}' is not known to be (batch, heads, sequence, head_size) with "
                f"fixed heads and head size (dimensions: {dims})",
            )
        head_size = dims[3]
        probed = _rotate_half_probe(graph, x, dims, concat)
        if isinstance(probed, str):
            return fail("rotate_half", probed, concat)

        # --- x·cos4 + rotate_half(x)·sin4 ----------------------------------------------------
        sin_mul = sole_consumer(concat.outputs[0])
        if not is_op(sin_mul, "Mul"):
            return fail("sin", f"rotate_half(x) is read by {describe(sin_mul)}, not one Mul by sin", sin_mul)
        add = sole_consumer(sin_mul.outputs[0])
        if not is_op(add, "Add"):
            return fail("sum", f"rotate_half(x)·sin is read by {describe(add)}, not one Add", add)
        cos_mul = producer(other_input(add, sin_mul.outputs[0]))
        if not is_op(cos_mul, "Mul") or x not in cos_mul.inputs:
            return fail(
                "cos",
                f"the Add's other term comes from {describe(cos_mul)}, not '{value_name(x)}'·cos",
                cos_mul,
            )
        cos = _angles(other_input(cos_mul, x), "Cos")
        if isinstance(cos, str):
            return fail("cos", cos, cos_mul)
        sin = _angles(other_input(sin_mul, concat.outputs[0]), "Sin")
        if isinstance(sin, str):
            return fail("sin", sin, sin_mul)
        if cos[0] is not sin[0]:
            return fail(
                "angles",
                f"cos and sin are taken of different angles ('{value_name(cos[0])}', '{value_name(sin[0])}')",
            )
        freqs = cos[0]
        problem = _per_token(graph, freqs, x, head_size)
        if problem:
            return fail("positions", problem)
        return Match(
            nodes=list({id(n): n for n in (upper, neg, lower, concat, sin_mul, cos_mul, add)}.values()),
            outputs=[add.outputs[0]],
            captures={
                "x": x,
                "freqs": freqs,
                "half": head_size // 2,
                "cos_scale": cos[1],
                "sin_scale": sin[1],
                "anchor": neg.name or "Neg",
                "graph": graph,
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        name = f"{self.name}/{match.anchor.lstrip('/')}"
        f = match.freqs
        constant = _shared_constants(match.graph, op)
        rows = op.op("Reshape", [f, constant("rows", [-1, match.half])], name=f"{name}/angles")
        caches = []
        for fn, scale in (("Cos", match.cos_scale), ("Sin", match.sin_scale)):
            cache = op.op(fn, [rows], name=f"{name}/{fn.lower()}_cache")
            if scale is not None:
                cache = op.op("Mul", [cache, scale], name=f"{name}/{fn.lower()}_scaled")
            caches.append(cache)
        # position ids 0 .. B·S-1 shaped (B, S): token t reads cache row t
        f_shape = op.op("Shape", [f], name=f"{name}/angles_shape")
        batch_sequence = op.op(
            "Gather",
            [f_shape, constant("batch_sequence_axes", [0, 1])],
            {"axis": 0},
            name=f"{name}/batch_sequence",
        )
        tokens = op.op("ReduceProd", [batch_sequence], {"keepdims": 0}, name=f"{name}/tokens")
        ids = op.op("Range", [constant("start", 0), tokens, constant("step", 1)], name=f"{name}/token_index")
        position_ids = op.op("Reshape", [ids, batch_sequence], name=f"{name}/position_ids")
        return op.op(
            "RotaryEmbedding", [match.x, position_ids, *caches], {"interleaved": 0}, domain=MS, name=name
        )


def _shared_constants(graph: ir.Graph, op: ir.tape.Tape):
    """int64 constants by name, one per graph: every site's helper nodes then read the same values,
    so CommonSubexpressionElimination can merge the nodes themselves."""

    def constant(label: str, values) -> ir.Value:
        name = f"{RotaryEmbeddingFusion.name}/{label}"
        array = np.array(values, np.int64)
        existing = graph.initializers.get(name)
        if existing is not None and np.array_equal(const_array(existing), array):
            return existing
        if existing is not None:  # another head size in the same graph
            name = f"{name}_{'_'.join(str(v) for v in array.reshape(-1))}"
            existing = graph.initializers.get(name)
            if existing is not None:
                return existing
        return op.initializer(ir.Tensor(array, name=name))

    return constant


def _angles(value: ir.Value | None, fn: str) -> tuple[ir.Value, ir.Value | None] | str:
    """(f, scale or None) where `value` = Unsqueeze([Cast] [Mul scale] fn(Concat(f, f, -1)), axis 1)."""
    unsqueeze = producer(value)
    if not is_op(unsqueeze, "Unsqueeze") or _unsqueeze_axes(unsqueeze) != [1]:
        return (
            f"{fn.lower()} factor comes from {describe(unsqueeze)}, not an Unsqueeze on axis 1 (over heads)"
        )
    source, _ = through_noop_casts(unsqueeze.inputs[0])
    scale = None
    node = producer(source)
    if is_op(node, "Mul"):
        scaled = next((v for v in node.inputs if is_op(producer(v), fn)), None)
        scale = other_input(node, scaled) if scaled is not None else None
        factor = const_array(scale)
        if factor is None or factor.size != 1:
            return f"{describe(node)} scales {fn} by something other than one constant"
        node = producer(scaled)
    if not is_op(node, fn):
        return f"{fn.lower()} factor comes from {describe(node)}, not {fn}"
    doubled = producer(node.inputs[0])
    if not (
        is_op(doubled, "Concat")
        and len(doubled.inputs) == 2
        and doubled.inputs[0] is doubled.inputs[1]
        and attr(doubled, "axis") in (-1, 2)
    ):
        return f"{fn} is taken of {describe(doubled)}, not of the angles repeated along the last axis (Concat(f, f))"
    return doubled.inputs[0], scale


def _unsqueeze_axes(node: ir.Node) -> list[int] | None:
    axes = attr(node, "axes")
    if axes is None and len(node.inputs) > 1:
        array = const_array(node.inputs[1])
        axes = None if array is None else array.reshape(-1).tolist()
    return None if axes is None else [int(a) for a in axes]


def _per_token(graph: ir.Graph, freqs: ir.Value, x: ir.Value, head_size: int) -> str | None:
    """Why the angles f are not one row per token of x (B, S, H/2), or None when they are."""
    first, second = pinned_shapes(graph, freqs)
    for shapes in (first, second):
        f_shape, x_shape = shapes.get(freqs.name), shapes.get(x.name)
        if f_shape is None or x_shape is None:
            return f"the probe infers no shape for the angles '{value_name(freqs)}' or '{value_name(x)}'"
        if f_shape != (x_shape[0], x_shape[2], head_size // 2):
            return (
                f"the angles '{value_name(freqs)}' are {f_shape} where '{value_name(x)}' is {x_shape}; "
                f"RotaryEmbedding needs one angle row per token, (batch, sequence, head_size/2)"
            )
    return None


def _rotate_half_probe(graph: ir.Graph, x: ir.Value, dims: list, concat: ir.Node) -> str | None:
    """Why the chain from `x` to `concat` is not rotate-half on a numbered x, or None when it is."""
    shape = tuple(
        d if d is not None else (PROBE_BATCH if i == 0 else PROBE_SEQUENCE) for i, d in enumerate(dims)
    )
    numbered = np.arange(1, 1 + np.prod(shape), dtype=np.float64).reshape(shape)
    known = {id(x): numbered}
    try:
        result = evaluate_on_probe(graph, concat.outputs[0], known, limit=MAX_BOUND_NODES)
    except PROBE_ERRORS as error:
        return f"the slices around Neg cannot be evaluated on a probe tensor: {error}"
    half = shape[3] // 2
    expected = np.concatenate([-numbered[..., half:], numbered[..., :half]], axis=-1)
    if shape[3] % 2 or result.shape != expected.shape or not np.array_equal(result, expected):
        return (
            f"Concat(Neg(Slice(x)), Slice(x)) is not x's two halves swapped with the first negated "
            f"(head size {shape[3]}); RotaryEmbedding rotates the two halves of each head"
        )
    return None
