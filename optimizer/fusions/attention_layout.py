"""The layout probe AttentionFusion proves head splits and merges with, and the block's bookkeeping.

Exporters reach [B, N, S, H] through different Reshape/Transpose orders (TorchScript folds K's two
transposes into perm (0,2,3,1); the dynamo exporter's SDPA decomposition transposes K through a 3-D
reshape), and the reshape targets are computed from Shape ops. The probe runs each Reshape/
Transpose/Split/Slice chain on a small numbered array (batch 2, sequence 3, or the model's static
sizes), evaluating the shape subgraphs for those sizes, and reads off from the numbers where each
element went. That proves the chain is the head split (or merge) it must be, yields the number of
heads and head size, and tells which projection columns feed Q, K and V.

Also here: the Shape/Constant arithmetic that dies with a matched block (`dead_helpers`), and
naming the initializers a rewrite adds.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from optimizer import constant_eval
from optimizer.match import (
    attr,
    const_array,
    consumers,
    describe,
    input_at,
    is_custom,
    is_op,
    opset,
    producer,
    rank,
)
from optimizer.shape_probe import evaluated_shapes, pinned_shapes
from optimizer.text import preview
from optimizer.value_probe import PROBE_ERRORS, evaluate_on_probe

RULE_NAME = "AttentionFusion"
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


class LayoutProbe:
    """Runs layout chains on numbered arrays for a small batch and sequence length."""

    def __init__(self, graph: ir.Graph, x: ir.Value):
        self.graph = graph
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
    def scores_ints(cls, graph: ir.Graph, score_values: list[ir.Value]):
        """ints(value, queries, keys) with the attention scores [batch, heads, queries, keys]: the
        causal mask's slice bounds are computed from their shape."""

        def ints(value: ir.Value, queries: int, keys: int):
            probe = cls.__new__(cls)
            probe.batch, probe.seq, probe.symbols, probe.x, probe.pinned = PROBE_BATCH, queries, {}, None, {}
            probe.graph = graph
            probe.shapes = {id(v): (PROBE_BATCH, PROBE_HEADS, queries, keys) for v in score_values}
            return probe.ints(value)

        return ints

    @classmethod
    def for_heads(cls, graph: ir.Graph, q4: ir.Value, num_heads: int, head_size: int) -> LayoutProbe:
        """A probe whose batch and sequence are those of Q in heads, [B, N, S, H].

        Where Q's batch or sequence is symbolic, the probe takes the sizes of the graph inferred
        with its inputs pinned (shape_probe), and reads any other shape it needs from there too.
        """
        dims = list(q4.shape)
        probe = cls.__new__(cls)
        probe.graph = graph
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

    def head_columns(self, path, key_layout: bool):
        """(num_heads, head_size, projection columns per head) or a reason string, for `path`, an
        attention_packed.Projection (not imported: that module imports this one)."""
        weight_in = path.weight.shape[0]
        self.shapes[id(path.x)] = (self.batch, self.seq, weight_in)
        out_features = path.weight.shape[1]
        rows = self.batch * self.seq
        numbered = np.arange(rows * out_features, dtype=np.int64).reshape(self.batch, self.seq, out_features)
        if path.flat_linear:
            flatten = path.linear_nodes[0]
            target = self.ints(flatten.inputs[1])
            if target is None or tuple(reshape_dims((self.batch, self.seq, weight_in), target, flatten)) != (rows, weight_in):
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
        if key_layout:
            array = array.swapaxes(-2, -1)
        if array.ndim == 3 and array.shape[0] % self.batch == 0:  # [B*N, S, H]: head n of batch b at row b*N + n
            array = array.reshape(self.batch, array.shape[0] // self.batch, *array.shape[1:])
        if array.ndim != 4:
            return f"reaches the MatMul with rank {array.ndim}, not [batch, heads, ...] or [batch*heads, ...]"
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
        """`array` moved through the chain's Transpose/Reshape/Slice (constant_eval, the evaluator
        value_probe uses, with their shape inputs evaluated for the probe sizes) and Split (the
        output the chain follows, `picks`); a Concat onto an empty cache passes it on as it is."""
        for node in chain:
            if is_op(node, "Split"):
                array = self._split(node, array, (picks or {}).get(id(node), 0))
                if isinstance(array, str):
                    return array
                continue  # _split records the shape of the output it followed
            if not is_op(node, "Concat"):
                operands = [self.ints(v) if v is not None else None for v in node.inputs[1:]]
                if any(a is None for a, v in zip(operands, node.inputs[1:], strict=True) if v is not None):
                    what = "target shape" if is_op(node, "Reshape") else "bounds"
                    return f"the {what} of {describe(node)} cannot be evaluated"
                try:
                    array = constant_eval.evaluate(node, [array, *operands], opset(self.graph))[0]
                except PROBE_ERRORS:
                    shown = f" target {preview(operands[0])}" if is_op(node, "Reshape") else ""
                    return f"{describe(node)}{shown} does not fit probe shape {list(array.shape)}"
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

    def ints(self, value: ir.Value | None) -> np.ndarray | None:
        """Evaluate a small integer tensor (a reshape target) for the probe sizes; None if we can't
        (an op the evaluator lacks, a Shape of a value with no probe shape, numbers that do not fit)."""
        if value is None:
            return None
        try:
            array = evaluate_on_probe(self.graph, value, {}, shape_of=self._shape_of)
        except PROBE_ERRORS:
            return None
        return np.asarray(array).astype(np.int64)

    def _shape_of(self, value: ir.Value) -> tuple[int, ...] | None:
        if id(value) in self.shapes:
            return self.shapes[id(value)]
        if value.name in self.pinned:  # consistent with batch and seq (for_heads)
            return self.pinned[value.name]
        if self.pinned:  # the same sizes, where inference named none (V after a partial rotary's slices)
            evaluated = evaluated_shapes(self.graph, value)
            if evaluated is not None:
                return evaluated[0]
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


def reshape_dims(shape, target: np.ndarray, node: ir.Node) -> list[int] | None:
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


def trace_output(value: ir.Value, probe: LayoutProbe, num_heads: int, head_size: int, batched_heads: bool = False):
    """Follow Transpose/Reshape after probs@V ([B, N, S, H], or [B*N, S, H] when `batched_heads`)
    until [B, S, hidden] (or [B*S, hidden])."""
    batch, seq, hidden = probe.batch, probe.seq, num_heads * head_size
    numbered = np.arange(batch * num_heads * seq * head_size, dtype=np.int64).reshape(batch, num_heads, seq, head_size)
    merged = numbered.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    array = numbered.reshape(batch * num_heads, seq, head_size) if batched_heads else numbered
    probe.shapes[id(value)] = array.shape
    nodes: list[ir.Node] = []
    while len(nodes) < MAX_CHAIN:
        user = data_consumer(value)
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
    found = describe(data_consumer(value)) if data_consumer(value) is not None else "several consumers"
    return f"the heads are not merged back to [batch, sequence, {hidden}] by Transpose/Reshape (stopped at {found})"


def batched_heads_fails(probe: LayoutProbe, sdpa_nodes: list[ir.Node], scores_reshape: ir.Node, probs_reshape: ir.Node,
                        num_heads: int) -> str | None:
    """Why the 3-D form's reshapes are not [B*N, S, T] -> [B, N, S, T] and back, or None. A row-major
    reshape between exactly those shapes keeps head n of batch b at row b*N + n, as the Q, K and V
    chains were proven to put it."""
    batch, seq = probe.batch, probe.seq
    flat, heads = (batch * num_heads, seq, seq), (batch, num_heads, seq, seq)
    for node in sdpa_nodes:  # the Shape ops computing the targets read these
        for output in node.outputs:
            if rank(output) in (3, 4):
                probe.shapes.setdefault(id(output), heads if rank(output) == 4 else flat)
    for node, source, target in ((scores_reshape, flat, heads), (probs_reshape, heads, flat)):
        probe.shapes[id(node.inputs[0])], probe.shapes[id(node.outputs[0])] = source, target
        wanted = probe.ints(node.inputs[1])
        found = None if wanted is None else reshape_dims(source, wanted, node)
        if found is None or tuple(found) != target:
            return (f"{describe(node)} does not reshape {'[batch*heads, S, T]' if len(source) == 3 else '[batch, heads, S, T]'}"
                    f" scores to {'[batch, heads, S, T]' if len(target) == 4 else '[batch*heads, S, T]'}")
    return None


def data_consumer(value: ir.Value) -> ir.Node | None:
    """The one node reading `value` other than Shape ops (which only read its dimensions).

    A graph output still has its one reader: the driver's boundary check then names it.
    """
    users = [u for u in consumers(value) if not is_op(u, "Shape")]
    return users[0] if len(users) == 1 else None


def dead_helpers(core: list[ir.Node], kept: list[ir.Value | None] = ()) -> list[ir.Node]:
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
    # A candidate read from outside the block and its helpers stays, and then so do the helpers
    # feeding it: each is looked at again only when a reader of its own left the set, not in
    # another sweep over every candidate.
    keep = inside | set(candidates)
    pending = list(candidates.values())
    while pending:
        node = pending.pop()
        if id(node) in candidates and any(
            v.is_graph_output() or any(id(u) not in keep for u in consumers(v)) for v in node.outputs
        ):
            del candidates[id(node)]
            keep.discard(id(node))
            pending += [p for p in (producer(v) for v in node.inputs) if p is not None and id(p) in candidates]
    return list(candidates.values())


def _is_float(value: ir.Value) -> bool:
    dtype = getattr(value.type, "dtype", None)
    return dtype is not None and dtype.is_floating_point()


def in_graph_order(graph: ir.Graph, nodes: list[ir.Node]) -> list[ir.Node]:
    wanted = {id(n) for n in nodes}
    return [n for n in graph if id(n) in wanted]


def unique_initializer(op: ir.tape.Tape, graph: ir.Graph, data: np.ndarray | ir.TensorProtocol, stem: str) -> ir.Value:
    taken = set(graph.initializers) | {v.name for v in op.initializers}
    index = 0
    while f"{stem}_{index}" in taken:
        index += 1
    name = f"{stem}_{index}"
    tensor = ir.Tensor(data) if isinstance(data, np.ndarray) else data
    tensor.name = name
    return op.initializer(tensor, name=name)


