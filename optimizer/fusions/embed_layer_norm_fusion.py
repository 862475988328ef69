"""EmbedLayerNormFusion: BERT's embedding sum -> LayerNormalization => com.microsoft.EmbedLayerNormalization.

    word = Gather(word_table, input_ids)
    pos  = Gather(position_table, position_ids)
    seg  = Gather(segment_table, token_type_ids)          (absent in DistilBERT; a constant row, folded into
                                                           the position table, when called without them)
    LayerNormalization(word + seg + pos, gamma, beta)     (the Adds in any order and nesting)
        => EmbedLayerNormalization(input_ids, token_type_ids, word_table, position_table,
                                   segment_table, gamma, beta, , [position_ids])
    (output, mask_index[, embedding_sum when the sum is also read elsewhere])

Like ONNX Runtime (embed_layer_norm_fusion.cc) the fusion happens only in front of a fused
attention, which comes in two forms: com.microsoft.Attention reads the LayerNorm output itself,
the standard Attention of opset 23 (what the dynamo exporter writes) reads it through the Q, K
and V projections (`feeds_attention`). Ids are cast to int32 (the op's only id type), epsilon is copied
from the LayerNormalization, and the op's mask_index output is created but left unread
(ONNX Runtime's C++ fusion does not fold the attention mask in either).

Where the positions come from differs. ONNX Runtime recognises the Shape/Expand/Range
subgraphs of 2020-era exports (Range(0, S), or NonZero(ConstantOfShape([S], 1)) below opset 11),
or a constant, and then drops the position ids (the op counts 0..S-1 by itself). Today's
exporters slice a `position_ids` buffer instead, a subgraph ONNX Runtime does not know, so its
fusion never fires on them. We pass whatever computes the ids as the op's optional position_ids
input, which reproduces the graph exactly for any ids of shape (batch, seq) or (1, seq); a count
0..S-1 (those subgraphs, unexpanded as TorchScript's GPT-2 writes it, or a constant) is dropped.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    MS,
    attr,
    const_array,
    consumers,
    describe,
    is_const,
    is_op,
    op_key,
    producer,
    quantized_note,
    rank,
    static_shape,
    through_noop_casts,
    value_name,
)
from optimizer.rule import Match, Rule, fail

ID_DTYPES = (ir.DataType.INT32, ir.DataType.INT64)
# What lies between a hidden state and an attention op that projects it itself (ONNX Attention-23,
# MultiHeadAttention, GroupQueryAttention): projections, head split, rotary embedding.
PROJECTION_OPS = frozenset({"MatMul", "Add", "Gemm", "Reshape", "Transpose", "Split", "Slice", "Mul", "Cast",
                            "RotaryEmbedding", "com.microsoft.RotaryEmbedding"})
FUSED_ATTENTION_OPS = frozenset({"Attention", "com.microsoft.MultiHeadAttention", "com.microsoft.GroupQueryAttention"})
PROJECTION_DEPTH = 8  # GPT-2 at opset 23: Reshape, Gemm, Reshape, Split, Reshape, Transpose, Attention
LAYER_NORM_DEFAULT_EPSILON = 1e-5


class EmbedLayerNormFusion(Rule):
    name = "EmbedLayerNormFusion"
    anchors = ("LayerNormalization",)
    emits = ("com.microsoft.EmbedLayerNormalization",)

    def match(self, graph: ir.Graph, ln: ir.Node):
        ln_add = producer(ln.inputs[0])
        if not is_op(ln_add, "Add"):
            return fail("embedding", f"input of {describe(ln)} comes from {describe(ln_add)}, not a sum of embedding lookups", ln_add)
        tree = _embedding_tree(ln_add)
        if tree is None:  # an encoder LayerNorm, say
            note = next((n for n in map(quantized_note, map(producer, ln_add.inputs)) if n), "")
            return fail("embedding", f"{describe(ln_add)} does not add two or three Gather lookups of embedding tables{note}")
        adds, gathers, folded = tree
        # A mixed-precision LayerNorm (LayerNormFusion absorbs float16/float32 Casts) returns
        # gamma's type; EmbedLayerNormalization computes and returns float.
        for role, weight in zip(("gamma", "beta"), ln.inputs[1:3], strict=False):
            if weight is not None and weight.dtype is not None and weight.dtype != ir.DataType.FLOAT:
                return fail("dtype", f"{role} '{value_name(weight)}' of {describe(ln)} is {weight.dtype.name.lower()}; "
                            "the fusion handles float")
        word, others = gathers[0], gathers[1:]
        if folded is not None:  # constant folding already looked the positions up
            return self._match_folded_positions(ln, adds, word, others, folded)

        for gather in gathers:
            if int(attr(gather, "axis", 0)) != 0:
                return fail("embedding", f"{describe(gather)} gathers along axis {attr(gather, 'axis')}, not rows of a table")
            table = static_shape(gather.inputs[0])
            if not is_const(gather.inputs[0]) or table is None or len(table) != 2:
                return fail("embedding", f"table '{value_name(gather.inputs[0])}' of {describe(gather)} is not a constant 2-D tensor")
        hidden = static_shape(word.inputs[0])[1]
        for gather in others:
            if static_shape(gather.inputs[0])[1] != hidden:
                return fail("embedding", f"table '{value_name(gather.inputs[0])}' has width "
                            f"{static_shape(gather.inputs[0])[1]} but the word table has {hidden}")

        input_ids = word.inputs[1]
        failure = _check_ids(input_ids, "input ids", word)
        if failure:
            return failure
        position, segment = _split_position_segment(others)
        segment_row = None
        if position is None and len(others) == 2:
            # Called without token_type_ids, BERT and RoBERTa look the segment row up with a
            # constant buffer (all 0) expanded to the batch: one constant row added to every
            # token, which folds exactly into the position table the other lookup reads.
            for constant, other in ((others[0], others[1]), (others[1], others[0])):
                row = _uniform_ids(constant.inputs[1])
                if row is not None and is_const(other.inputs[0]) and 0 <= row < static_shape(constant.inputs[0])[0]:
                    position, segment_row = other, (constant.inputs[0], row)
                    break
        if position is None:
            names = ", ".join(f"'{value_name(g.inputs[1])}'" for g in others)
            return fail("embedding", f"cannot tell the position lookup from the segment lookup: ids {names} are "
                        "both graph inputs or both computed")
        segment_ids = None
        if segment is not None:
            segment_ids = segment.inputs[1]
            failure = _check_ids(segment_ids, "segment ids", segment)
            if failure:
                return failure
            if _dims(segment_ids) != _dims(input_ids):
                return fail("segment", f"segment ids '{value_name(segment_ids)}' have shape {_dims(segment_ids)} but "
                            f"input ids '{value_name(input_ids)}' have {_dims(input_ids)}")
        position_ids = position.inputs[1]
        if _is_expanded_default_positions(position_ids, input_ids):
            position_ids = None
        elif rank(position_ids) != 2 or position_ids.dtype not in ID_DTYPES:
            return fail("position", f"position ids '{value_name(position_ids)}' of {describe(position)} are not "
                        "a 2-D int32/int64 tensor of shape (batch, seq) or (1, seq)")
        elif _is_default_positions(position_ids, input_ids):
            position_ids = None

        if len(ln.inputs) < 3 or ln.inputs[2] is None:
            return fail("layernorm", f"{describe(ln)} has no beta; EmbedLayerNormalization needs one")
        axis = int(attr(ln, "axis", -1))
        if axis not in (-1, 2):
            return fail("layernorm", f"{describe(ln)} normalizes from axis {axis}, not the hidden axis")
        for role, weight in (("gamma", ln.inputs[1]), ("beta", ln.inputs[2])):
            if static_shape(weight) != (hidden,):
                return fail("layernorm", f"{role} '{value_name(weight)}' has shape {static_shape(weight)}, not ({hidden},)")
        # Inference may not type the sum (a model whose shapes it cannot follow); the tables say.
        dtype = ln.inputs[0].dtype or word.inputs[0].dtype
        if dtype != ir.DataType.FLOAT:
            return fail("dtype", f"the embedding sum is {dtype.name.lower() if dtype else 'of unknown type'}; "
                        "the fusion handles float")
        if not feeds_attention(ln.outputs[0]):
            return fail("attention", f"{describe(ln)} feeds no attention (com.microsoft.Attention, or ONNX "
                        "Attention through its projections); like ONNX Runtime, the embedding is fused only in "
                        "front of a fused attention")
        # GPT-2 style pre-LN models also read the embedding sum as the first residual: the op's
        # embedding_sum output provides it (ONNX Runtime's Python fusion does the same).
        embedding_sum = ln_add.outputs[0]
        keep_sum = embedding_sum.is_graph_output() or any(user is not ln for user, _ in embedding_sum.uses())
        # TorchScript's GPT-2 and DistilBERT read the batch and sequence sizes off the word lookup:
        # those Shapes read the ids' instead (_lookup_shape).
        shape_readers = [u for u in consumers(word.outputs[0]) if is_op(u, "Shape")]
        return Match(
            nodes=[*gathers, *adds, *shape_readers, ln],
            outputs=[ln.outputs[0], *([embedding_sum] if keep_sum else []), *(u.outputs[0] for u in shape_readers)],
            captures={
                "shape_readers": shape_readers,
                "input_ids": input_ids,
                "segment_ids": segment_ids,
                "position_ids": position_ids,
                "word_table": word.inputs[0],
                "position_table": position.inputs[0],
                "segment_row": segment_row,
                "segment_table": segment.inputs[0] if segment is not None else None,
                "gamma": ln.inputs[1],
                "beta": ln.inputs[2],
                "epsilon": float(attr(ln, "epsilon", LAYER_NORM_DEFAULT_EPSILON)),
                "anchor_name": ln.name or "LayerNormalization",
                "keep_sum": keep_sum,
            },
        )

    def _match_folded_positions(self, ln, adds, word, others, folded):
        """word [+ segment] lookups plus a constant (1 or B, S, H) of looked-up positions."""
        input_ids = word.inputs[1]
        failure = _check_ids(input_ids, "input ids", word)
        if failure:
            return failure
        seq = input_ids.shape[1] if input_ids.shape is not None else None
        table = const_array(folded)
        if not isinstance(seq, int) or table.shape[1] != seq or table.shape[2] != static_shape(word.inputs[0])[1]:
            return fail("position", f"constant '{value_name(folded)}' of shape {list(table.shape)} is not the position "
                        f"embeddings of a static sequence of input ids '{value_name(input_ids)}'")
        if not np.all(table == table[:1]):
            return fail("position", f"constant '{value_name(folded)}' differs between batch rows; it is not a position embedding")
        segment = others[0] if others else None
        if segment is not None and not segment.inputs[1].is_graph_input():
            return fail("segment", f"segment ids '{value_name(segment.inputs[1])}' are computed, not a graph input")
        if not feeds_attention(ln.outputs[0]):
            return fail("attention", f"{describe(ln)} feeds no attention (com.microsoft.Attention, or ONNX "
                        "Attention through its projections); like ONNX Runtime, the embedding is fused only in "
                        "front of a fused attention")
        embedding_sum = adds[0].outputs[0]
        keep_sum = embedding_sum.is_graph_output() or any(user is not ln for user, _ in embedding_sum.uses())
        return Match(
            nodes=[word, *others, *adds, ln],
            outputs=[ln.outputs[0], embedding_sum] if keep_sum else [ln.outputs[0]],
            captures={
                "input_ids": input_ids,
                "segment_ids": segment.inputs[1] if segment is not None else None,
                "position_ids": None,
                "word_table": word.inputs[0],
                "position_table": None,
                "folded_positions": (f"{value_name(folded)}/position_table", table[0]),
                "segment_table": segment.inputs[0] if segment is not None else None,
                "gamma": ln.inputs[1],
                "beta": ln.inputs[2],
                "epsilon": float(attr(ln, "epsilon", LAYER_NORM_DEFAULT_EPSILON)),
                "anchor_name": ln.name or "LayerNormalization",
                "keep_sum": keep_sum,
            },
        )

    def rewrite(self, op: ir.tape.Tape, match: Match):
        position_table = match.position_table
        if match.captures.get("folded_positions") is not None:
            name, table = match.folded_positions
            position_table = op.initializer(ir.Tensor(np.ascontiguousarray(table), name=name), name=name)
        if match.captures.get("segment_row") is not None:
            segment_table, row = match.segment_row
            name = f"{value_name(position_table)}/plus_{value_name(segment_table)}_{row}"
            table = const_array(position_table) + const_array(segment_table)[row]
            position_table = op.initializer(ir.Tensor(np.ascontiguousarray(table), name=name), name=name)
        base = f"{self.name}/{match.anchor_name}"
        inputs = [
            _as_int32(op, match.input_ids, f"{base}/input_ids_int32"),
            _as_int32(op, match.segment_ids, f"{base}/segment_ids_int32"),
            match.word_table,
            position_table,
            match.segment_table,
            match.gamma,
            match.beta,
            None,  # mask: left to Attention, as in ONNX Runtime's C++ fusion
            _as_int32(op, match.position_ids, f"{base}/position_ids_int32"),
        ]
        while inputs[-1] is None:
            inputs.pop()
        # mask_index always exists: ONNX Runtime's shape inference for the op requires it.
        outputs = op.op_multi_out(
            "EmbedLayerNormalization",
            inputs,
            attributes={"epsilon": match.epsilon},
            domain=MS,
            num_outputs=3 if match.keep_sum else 2,
            name=base,
        )
        shapes = [_lookup_shape(op, match.input_ids, match.word_table, reader, f"{base}/{reader.name or 'Shape'}")
                  for reader in match.captures.get("shape_readers", [])]
        return [outputs[0], *([outputs[2]] if match.keep_sum else []), *shapes]


def _lookup_shape(op: ir.tape.Tape, input_ids: ir.Value, word_table: ir.Value, reader: ir.Node, name: str):
    """What Shape(word lookup)[start:end] read, from the ids: the lookup is the ids' shape plus the
    table's width. Not the fused output's Shape: exporters count the position ids from this very
    shape (DistilBERT's arange(seq)), and the fused op reads those ids, which would make a cycle."""
    start, end = attr(reader, "start", 0), attr(reader, "end", None)
    start = start + 3 if start < 0 else start
    end = 3 if end is None else (end + 3 if end < 0 else end)
    # start and end only where the reader had them: Shape takes them from opset 15 on.
    if end <= 2:
        return op.op("Shape", [input_ids], {"start": start, "end": end}, name=name)
    ids_part = op.op("Shape", [input_ids], {"start": start} if start else None, name=name)
    width = op.initializer(ir.Tensor(np.array([static_shape(word_table)[1]], np.int64), name=f"{name}/width"))
    return op.op("Concat", [ids_part, width], {"axis": 0}, name=f"{name}/with_width")


def _embedding_tree(ln_add: ir.Node):
    """(Adds, Gathers, folded positions or None) when `ln_add` sums two or three lookups through at
    most two Adds, word lookup first. One lookup may be a constant: positions that constant
    folding looked up already (ONNX Runtime handles that case too)."""
    adds, values = [ln_add], []
    for value in ln_add.inputs:
        node = producer(value)
        if is_op(node, "Add") and len(adds) == 1:
            adds.append(node)
            values += list(node.inputs)
        else:
            values.append(value)
    # TorchScript's GPT-2 casts the position lookup to the float it already is; those Casts go too.
    peeled = [through_noop_casts(v) for v in values]
    values = [v for v, _ in peeled]
    adds += [cast for _, casts in peeled for cast in casts]
    folded = [v for v in values if const_array(v) is not None and rank(v) == 3]
    leaves = [producer(v) for v in values if not any(v is f for f in folded)]
    if len(folded) > 1 or not all(is_op(leaf, "Gather") for leaf in leaves) or len(values) not in (2, 3):
        return None
    if len({id(leaf) for leaf in leaves}) != len(leaves) or not leaves:
        return None
    return adds, leaves, (folded[0] if folded else None)


def _split_position_segment(others: list[ir.Node]):
    """(position Gather, segment Gather or None): segment ids come from the graph, position ids are computed."""
    if len(others) == 1:
        return others[0], None
    fed = [g for g in others if g.inputs[1].is_graph_input()]
    computed = [g for g in others if not g.inputs[1].is_graph_input()]
    if len(fed) != 1 or len(computed) != 1:
        return None, None
    return computed[0], fed[0]


# Ops that move, repeat or pick from their first input without changing values: all-equal ids
# seen through them stay all equal (transformers gathers its token_type_ids buffer by position).
ID_PASSING_OPS = ("Expand", "Slice", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Cast", "Gather", "GatherElements")


def _uniform_ids(ids: ir.Value, limit: int = 6) -> int | None:
    """k when every id is k: a constant of equal elements, passed through ID_PASSING_OPS only."""
    value = ids
    for _ in range(limit):
        array = const_array(value)
        if array is not None:
            flat = array.reshape(-1)
            if flat.size and np.issubdtype(flat.dtype, np.integer) and np.all(flat == flat[0]):
                return int(flat[0])
            return None
        node = producer(value)
        if node is None or not any(is_op(node, op) for op in ID_PASSING_OPS):
            return None
        value = node.inputs[0]
    return None


def _check_ids(ids: ir.Value, role: str, gather: ir.Node):
    if rank(ids) != 2 or ids.dtype not in ID_DTYPES:
        shown = f"rank-{rank(ids)}" if rank(ids) is not None else "unknown-rank"
        dtype = ids.dtype.name.lower() if ids.dtype is not None else "unknown dtype"
        return fail("ids", f"{role} '{value_name(ids)}' of {describe(gather)} are {shown} {dtype}; "
                    "EmbedLayerNormalization takes 2-D int32/int64 (batch, seq)")
    return None


def _dims(value: ir.Value) -> list[str] | None:
    if value.shape is None:
        return None
    return [str(d) for d in value.shape]


def _is_default_positions(position_ids: ir.Value, input_ids: ir.Value) -> bool:
    """A constant 0..S-1 per row, S the static sequence length: the op's own default."""
    ids = const_array(position_ids)
    if ids is None or input_ids.shape is None or not isinstance(input_ids.shape[1], int):
        return False
    seq = input_ids.shape[1]
    return ids.shape[-1] == seq and bool(np.all(ids == np.arange(seq)))


def _is_expanded_default_positions(position_ids: ir.Value, input_ids: ir.Value) -> bool:
    """Expand(0..S-1, a 2-element shape), S the sequence length of the input ids.

    2020-era exports build positions as Unsqueeze(Range(0, Shape(input_ids)[1], 1)) expanded to
    the ids' shape; with a static sequence, folding may have turned the Range into a constant
    [1, S] 0..S-1. Every row is 0..S-1, the op's default, so the ids are dropped, as ONNX Runtime
    drops them (its EmbedLayerNormFusion formats 3 to 9).
    """
    expand = producer(position_ids)
    if is_op(expand, "Expand"):
        if _vector_length(expand.inputs[1]) != 2:
            return False
        positions = expand.inputs[0]
    else:  # one row [1, S] that the lookup's sum broadcasts over the batch (TorchScript's GPT-2)
        positions = position_ids
    if _is_default_positions(positions, input_ids):
        return True
    unsqueeze = producer(positions)
    if is_op(unsqueeze, "Unsqueeze"):
        if _axes(unsqueeze) != [0]:
            return False
        positions = unsqueeze.inputs[0]
    if is_op(producer(positions), "Cast"):  # positions counted in another integer type
        positions = producer(positions).inputs[0]
    counter = producer(positions)
    if is_op(counter, "Range"):
        return (_scalar_is(counter.inputs[0], 0) and _scalar_is(counter.inputs[2], 1)
                and _is_sequence_length(counter.inputs[1], input_ids))
    return _is_nonzero_count(positions, input_ids)


def _is_nonzero_count(positions: ir.Value, input_ids: ir.Value) -> bool:
    """Squeeze(Transpose(NonZero(ConstantOfShape([S], value != 0))), axis 1): 0..S-1.

    PyTorch's exporter writes arange this way below opset 11, which has no Range: the indices of
    the non-zero elements of S ones. With value 0 (ConstantOfShape's default) there are none and
    the positions are empty, so the value is checked.
    """
    squeeze = producer(positions)
    if not is_op(squeeze, "Squeeze") or _axes(squeeze) != [1]:
        return False
    transpose = producer(squeeze.inputs[0])
    if not is_op(transpose, "Transpose") or list(attr(transpose, "perm", None) or [1, 0]) != [1, 0]:
        return False
    nonzero = producer(transpose.inputs[0])
    fill = producer(nonzero.inputs[0]) if is_op(nonzero, "NonZero") else None
    if not is_op(fill, "ConstantOfShape"):
        return False
    value = attr(fill, "value", None)
    if value is None or not np.all(np.asarray(value) != 0):
        return False
    shape = fill.inputs[0]
    node = producer(shape)
    if is_op(node, "Unsqueeze") and _axes(node) == [0]:
        return _is_sequence_length(node.inputs[0], input_ids)
    return _vector_length(shape) == 1 and _is_sequence_length(shape, input_ids)


def _axes(node: ir.Node) -> list[int] | None:
    axes = attr(node, "axes")
    if axes is None and len(node.inputs) > 1:
        axes = const_array(node.inputs[1])
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


def _scalar_is(value: ir.Value | None, expected: int) -> bool:
    array = const_array(value)
    return array is not None and array.size == 1 and array.reshape(()) == expected


def _vector_length(value: ir.Value) -> int | None:
    """The length of a 1-D shape vector, from its own shape or from what builds it."""
    shape = static_shape(value)
    if shape is not None:
        return shape[0] if len(shape) == 1 else None
    node = producer(value)
    if is_op(node, "Shape") and rank(node.inputs[0]) is not None and not node.attributes:
        return rank(node.inputs[0])
    if is_op(node, "Concat"):
        lengths = [_vector_length(v) for v in node.inputs]
        return None if None in lengths else sum(lengths)
    return None


def _is_sequence_length(value: ir.Value, input_ids: ir.Value) -> bool:
    """`value` is dimension 1 of the input ids: Gather(Shape(input_ids), 1), maybe Cast, or that number."""
    node = producer(value)
    while is_op(node, "Cast") or is_op(node, "Squeeze"):
        value = node.inputs[0]
        node = producer(value)
    seq = input_ids.shape[1] if input_ids.shape is not None and len(input_ids.shape) == 2 else None
    if isinstance(seq, int) and _scalar_is(value, seq):
        return True
    if not is_op(node, "Gather") or not _scalar_is(node.inputs[1], 1):
        return False
    shape = producer(node.inputs[0])
    if not is_op(shape, "Shape") or shape.attributes:
        return False
    # dimension 1 of the ids, or of their lookup (Gather along rows keeps the ids' leading dims)
    lookup = producer(shape.inputs[0])
    return shape.inputs[0] is input_ids or (
        is_op(lookup, "Gather") and lookup.inputs[1] is input_ids and int(attr(lookup, "axis", 0)) == 0)


def _as_int32(op: ir.tape.Tape, ids: ir.Value | None, name: str) -> ir.Value | None:
    if ids is None or ids.dtype == ir.DataType.INT32:
        return ids
    return op.op("Cast", [ids], attributes={"to": int(ir.DataType.INT32)}, name=name)


def feeds_attention(hidden: ir.Value) -> bool:
    """Whether `hidden` is an attention block's input: read by com.microsoft.Attention, or by an
    attention op that takes projected Q/K/V within PROJECTION_DEPTH projection steps."""
    if any(is_op(user, "Attention", MS) for user in consumers(hidden)):
        return True
    frontier, seen = [hidden], set()
    for _ in range(PROJECTION_DEPTH):
        following = []
        for value in frontier:
            for user in consumers(value):
                if op_key(user) in FUSED_ATTENTION_OPS:
                    return True
                if op_key(user) in PROJECTION_OPS and id(user) not in seen:
                    seen.add(id(user))
                    following += user.outputs
        frontier = following
    return False
