"""NhwcTransformer: run connected convolution chains channels-last (NHWC) on our CPU kernels.

Named after ONNX Runtime's CPU layout transformer (onnxruntime/core/optimizer/nhwc_transformer.cc),
which does the same job for its kernels at the `layout` level: it rewrites convolutions and
pools whose NHWC kernel is faster into their NHWC form, pushes the layout through
elementwise ops, and leaves one Transpose at each edge of the region. Sharing the name lets
a user's `disabled_optimizers=["NhwcTransformer"]` carry over.

Why channels-last pays for *our* kernels: in NHWC a convolution's im2col matrix is a
(positions, k*k*C) reshape of a window view and one GEMM writes the NHWC output directly;
a depthwise tap is a multiply-add over long contiguous rows; and a fused residual sum and
activation are applied in place (runtime/kernels/conv_nhwc.py). Measured numbers are in
bench/layout.py's docstring.

What is converted, region by region (a region is a connected set of the ops below, joined
by the 4-D tensors they pass each other):
  Conv, com.microsoft.FusedConv (group 1 or depthwise, 2-D)   ->  com.microsoft.NhwcFusedConv
  MaxPool (no Indices output), AveragePool, GlobalAveragePool  ->  com.fusionwatch.Nhwc<Pool>
  Relu and friends, Add/Sub/Mul/Div                            ->  the same op, on NHWC data
      (a constant operand is rewritten once as a transposed initializer; a 4-D operand from
      outside the region gets a Transpose)
  Conv -> Add(residual of the same shape) [-> Relu...]         ->  one NhwcFusedConv with Z,
      the residual sum of ONNX Runtime's FusedConv/NhwcFusedConv, added before the activation.
Transpose(perm [0,2,3,1]) is inserted where NCHW data enters a region and Transpose(perm
[0,3,1,2]) where a region's value is read outside it or is a graph output; an existing
transpose back-to-back with one of these cancels against it instead.

Domains: NhwcFusedConv is ONNX Runtime's op (X, Y, Z channels-last; W in Conv's
(M, C/g, kH, kW) order; Conv's attributes plus activation/activation_params), so a model
optimized here still loads in ONNX Runtime, which runs it where it has the kernel (fp16
builds with MLAS's NHWC convolutions, KleidiAI float builds). ONNX Runtime has no float NHWC
pool in a public domain (com.microsoft.NhwcMaxPool is int8/uint8 only; float NHWC pools
live in its internal com.ms.internal.nhwc domain, which a saved model cannot use), so the
pools are ours, in `com.fusionwatch`.

When it does not pay it stays off the graph: grouped (non-depthwise) convolutions stay NCHW
(our NHWC grouped path needs an extra output copy and measured slower), and a region is only
converted with at least MIN_CONVOLUTIONS convolutions, so a lone Conv never pays for two
transposes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from optimizer.match import (
    FUSIONWATCH,
    MS,
    attr,
    const_array,
    consumers,
    input_at,
    is_op,
    rank,
    sole_consumer,
)
from optimizer.rule import Fail, Rule, mark_created

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

# Measured with bench/layout.py: see its docstring. Below two convolutions the two edge
# transposes cost more than one NHWC convolution saves.
MIN_CONVOLUTIONS = 2

POOLS = {
    "MaxPool": "NhwcMaxPool",
    "AveragePool": "NhwcAveragePool",
    "GlobalAveragePool": "NhwcGlobalAveragePool",
}
# Elementwise ops whose non-data inputs (Clip's bounds, say) are scalars: layout-agnostic.
UNARY = frozenset(
    {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Clip", "Elu", "Softplus"}
)
BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
# FusedConv activations our NHWC kernel applies, with their attributes as activation_params.
FUSABLE_ACTIVATIONS = {
    "Relu": (),
    "Sigmoid": (),
    "Tanh": (),
    "LeakyRelu": (("alpha", 0.01),),
    "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)),
}
CONV_ACTIVATIONS = frozenset({"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip"})


class NhwcTransformer(Rule):
    name = "NhwcTransformer"
    anchors = ()  # a whole-graph pass: a region is only worth converting as a whole
    # The report counts these; the edge Transposes and elementwise ops rebuilt on NHWC data are helpers.
    emits = (
        "com.microsoft.NhwcFusedConv",
        "com.fusionwatch.NhwcMaxPool",
        "com.fusionwatch.NhwcAveragePool",
        "com.fusionwatch.NhwcGlobalAveragePool",
    )

    def run_on_graph(self, graph: ir.Graph, near_misses: list[tuple[ir.Node, Fail]]) -> int:
        converted = 0
        for region in _regions(graph):
            if sum(1 for node in region if _role(node) == "conv") >= MIN_CONVOLUTIONS:
                _Conversion(self, graph, region).run()
                converted += 1
        return converted


# --- which nodes can run channels-last, and which of their inputs carry the layout --------
def _role(node: ir.Node) -> str | None:
    """'conv', 'pool' or 'elementwise' for a node that has an NHWC form here; None otherwise."""
    if not node.outputs or rank(node.outputs[0]) != 4:
        return None
    if is_op(node, "Conv") or is_op(node, "FusedConv", MS):
        return "conv" if _convertible_conv(node) else None
    if node.op_type in POOLS and is_op(node, node.op_type):
        if rank(node.inputs[0]) != 4:
            return None
        if node.op_type == "MaxPool" and any(
            v.name and (v.uses() or v.is_graph_output()) for v in node.outputs[1:]
        ):
            return None  # Indices are NCHW positions: keep the op as it is
        return "pool"
    if node.op_type in UNARY and is_op(node, node.op_type):
        others = [v for v in node.inputs[1:] if v is not None]
        return "elementwise" if rank(node.inputs[0]) == 4 and all(rank(v) == 0 for v in others) else None
    if node.op_type in BINARY and is_op(node, node.op_type):
        for value in node.inputs:
            if rank(value) == 4 or rank(value) == 0:
                continue
            array = const_array(value)
            if array is None or array.ndim > 4:
                return None  # a lower-rank run-time operand broadcasts along W, not C
        return "elementwise"
    return None


def _convertible_conv(node: ir.Node) -> bool:
    weight = input_at(node, 1)
    if rank(node.inputs[0]) != 4 or weight is None or weight.shape is None or len(weight.shape) != 4:
        return False
    if is_op(node, "FusedConv", MS) and attr(node, "activation") not in (None, *CONV_ACTIVATIONS):
        return False
    group = attr(node, "group", 1)
    if group == 1:
        return True
    # Depthwise (one input and one output channel per group) has a fast NHWC path; other
    # grouped convolutions need an extra copy of the output and stay NCHW.
    out_channels, per_group = weight.shape[0], weight.shape[1]
    return per_group == 1 and out_channels == group


def _data_inputs(node: ir.Node) -> list[int]:
    """Positions of the inputs that are NHWC in the converted node."""
    role = _role(node)
    if role == "conv":
        return [0] + ([3] if input_at(node, 3) is not None else [])
    if role == "pool" or (role == "elementwise" and node.op_type in UNARY):
        return [0]
    return [i for i, v in enumerate(node.inputs) if rank(v) == 4 and const_array(v) is None]


def _regions(graph: ir.Graph) -> Iterator[list[ir.Node]]:
    """Connected sets of convertible nodes, each in graph (topological) order."""
    nodes = [node for node in graph if _role(node) is not None]
    index = {id(node): i for i, node in enumerate(nodes)}
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, node in enumerate(nodes):
        for position in _data_inputs(node):
            source = node.inputs[position].producer()
            if source is not None and id(source) in index:
                parent[find(i)] = find(index[id(source)])
    groups: dict[int, list[ir.Node]] = {}
    for i, node in enumerate(nodes):
        groups.setdefault(find(i), []).append(node)
    yield from groups.values()


# --- rewriting one region -------------------------------------------------------------------
class _Conversion:
    def __init__(self, rule: NhwcTransformer, graph: ir.Graph, region: list[ir.Node]) -> None:
        self.rule = rule
        self.graph = graph
        self.region = region
        self.inside = {id(node) for node in region}
        self.nhwc: dict[int, ir.Value] = {}  # id(NCHW value) -> its NHWC twin
        self.constants: dict[int, ir.Value] = {}
        self.taken = set(graph.initializers) | {v.name for v in graph.inputs}
        self.taken |= {v.name for node in graph for v in node.outputs}
        self.residual_units = _residual_units(region, self.inside)

    def run(self) -> None:
        absorbed = {id(n) for conv, add, act in self.residual_units.values() for n in (conv, add, act)}
        for node in self.region:
            unit = self.residual_units.get(id(node))
            if unit is not None:
                self._fuse_residual(node, *unit)
            elif id(node) not in absorbed:
                self._convert(node)
        cancelled = self._restore_nchw_outputs()
        for domain in (MS, FUSIONWATCH):
            self.graph.opset_imports.setdefault(domain, 1)
        self.graph.remove(self.region + cancelled, safe=True)

    # names, values, placement
    def _name(self, base: str) -> str:
        name, suffix = base, 0
        while name in self.taken:
            suffix += 1
            name = f"{base}_{suffix}"
        self.taken.add(name)
        return name

    def _add_node(
        self,
        anchor: ir.Node,
        domain: str,
        op_type: str,
        inputs,
        attributes,
        like: ir.Value,
        perm,
        after=False,
    ):
        """A new node placed before (or after) `anchor`, its one output shaped as `like` permuted by `perm`."""
        shape = None if like.shape is None else ir.Shape([like.shape[i] for i in perm])
        output = ir.Value(
            name=self._name(f"{like.name}_{'nhwc' if perm == TO_NHWC else 'nchw'}"),
            shape=shape,
            type=like.type,
        )
        node = ir.Node(
            domain, op_type, inputs, attributes, outputs=[output], name=self._node_name(like, op_type)
        )
        mark_created(node, self.rule)
        if after:
            self.graph.insert_after(anchor, node)
        else:
            self.graph.insert_before(anchor, node)
        return output

    def _node_name(self, like: ir.Value, op_type: str) -> str:
        """'NhwcTransformer/<the replaced node's name>', '.../Transpose' for an edge transpose."""
        origin = like.producer() if like.producer() is not None else None
        base = origin.name if origin is not None and origin.name else like.name
        base = base.removeprefix(f"{NhwcTransformer.name}/").lstrip("/")
        suffix = "/Transpose" if op_type == "Transpose" else ""
        return self._name(f"{NhwcTransformer.name}/{base}{suffix}")

    def _input(self, value: ir.Value, consumer: ir.Node) -> ir.Value:
        """The NHWC form of a data input: the region's own value, or a Transpose of an outside one."""
        twin = self.nhwc.get(id(value))
        if twin is not None:
            return twin
        source = value.producer()
        if is_op(source, "Transpose") and tuple(attr(source, "perm", ())) == TO_NCHW:
            twin = source.inputs[0]  # NHWC -> NCHW -> NHWC: the two transposes cancel
        else:
            twin = self._add_node(
                consumer, "", "Transpose", [value], [ir.AttrInt64s("perm", TO_NHWC)], value, TO_NHWC
            )
        self.nhwc[id(value)] = twin
        return twin

    def _constant(self, value: ir.Value) -> ir.Value:
        """An elementwise op's constant operand, transposed once to broadcast over NHWC data."""
        array = const_array(value)
        if array.size == 1:
            return value  # a scalar broadcasts the same in any layout
        cached = self.constants.get(id(value))
        if cached is None:
            full = array.reshape((1,) * (4 - array.ndim) + array.shape)
            tensor = ir.Tensor(
                np.ascontiguousarray(full.transpose(TO_NHWC)), name=self._name(f"{value.name}_nhwc")
            )
            cached = ir.Value(
                name=tensor.name,
                shape=ir.Shape(tensor.shape),
                type=ir.TensorType(tensor.dtype),
                const_value=tensor,
            )
            self.graph.register_initializer(cached)
            self.constants[id(value)] = cached
        return cached

    # the conversions
    def _convert(self, node: ir.Node) -> None:
        role = _role(node)
        positions = set(_data_inputs(node))
        inputs = []
        for i, value in enumerate(node.inputs):
            if value is None:
                inputs.append(None)
            elif i in positions:
                inputs.append(self._input(value, node))
            elif node.op_type in BINARY and const_array(value) is not None:
                inputs.append(self._constant(value))
            else:
                inputs.append(value)  # a weight, a bias, a scalar
        attributes = [
            a
            for a in node.attributes.values()
            if not (node.op_type == "MaxPool" and a.name == "storage_order")
        ]
        if role == "conv":
            domain, op_type = MS, "NhwcFusedConv"
        elif role == "pool":
            domain, op_type = FUSIONWATCH, POOLS[node.op_type]
            inputs = inputs[:1]
        else:
            domain, op_type = node.domain, node.op_type
        self.nhwc[id(node.outputs[0])] = self._add_node(
            node, domain, op_type, inputs, attributes, node.outputs[0], TO_NHWC
        )

    def _fuse_residual(self, last: ir.Node, conv: ir.Node, add: ir.Node, activation: ir.Node | None) -> None:
        """Conv -> Add(residual) [-> activation] as one NhwcFusedConv with Z, placed at the last node."""
        residual = add.inputs[1] if add.inputs[0] is conv.outputs[0] else add.inputs[0]
        inputs = [
            self._input(conv.inputs[0], last),
            input_at(conv, 1),
            input_at(conv, 2),
            self._input(residual, last),
        ]
        attributes = [
            a for a in conv.attributes.values() if a.name not in ("activation", "activation_params")
        ]
        if activation is not None:
            attributes.append(ir.AttrString("activation", activation.op_type))
            params = [
                float(attr(activation, name, default))
                for name, default in FUSABLE_ACTIVATIONS[activation.op_type]
            ]
            if params:
                attributes.append(ir.AttrFloat32s("activation_params", params))
        self.nhwc[id(last.outputs[0])] = self._add_node(
            last, MS, "NhwcFusedConv", inputs, attributes, last.outputs[0], TO_NHWC
        )

    def _restore_nchw_outputs(self) -> list[ir.Node]:
        """Transpose back every region value read outside the region or that is a graph output.

        Returns the transposes that cancelled against ours; they are dead and leave with the region.
        """
        cancelled: list[ir.Node] = []
        for node in self.region:
            old = node.outputs[0]
            twin = self.nhwc.get(id(old))
            if twin is None:
                continue  # absorbed into a residual unit: read only inside it
            needed = old.is_graph_output()
            for user in consumers(old):
                if id(user) in self.inside:
                    continue
                # NCHW -> NHWC right after the region: that transpose and ours cancel.
                if (
                    is_op(user, "Transpose")
                    and tuple(attr(user, "perm", ())) == TO_NHWC
                    and not user.outputs[0].is_graph_output()
                ):
                    ir.convenience.replace_all_uses_with(user.outputs[0], twin)
                    cancelled.append(user)
                else:
                    needed = True
            if not needed:
                continue
            nchw = self._add_node(
                twin.producer(),
                "",
                "Transpose",
                [twin],
                [ir.AttrInt64s("perm", TO_NCHW)],
                twin,
                TO_NCHW,
                after=True,
            )
            is_output, name = old.is_graph_output(), old.name
            ir.convenience.replace_all_uses_with(old, nchw, replace_graph_outputs=True)
            if is_output:  # a graph output keeps its name
                old.name = self._name(f"{name}_nchw_replaced")
                nchw.name = name
            # The region's own readers still read `old`; they leave with the region.
        return cancelled


def _residual_units(region: list[ir.Node], inside: set[int]) -> dict[int, tuple]:
    """Conv -> Add(residual) [-> activation] chains to fuse, keyed by the chain's last node.

    The conv must have no activation yet (the residual is added before it) and read nothing
    but the Add; the residual must have exactly the output's shape (Z does not broadcast).
    """
    units: dict[int, tuple] = {}
    taken: set[int] = set()
    for conv in region:
        if _role(conv) != "conv" or attr(conv, "activation") is not None or input_at(conv, 3) is not None:
            continue
        add = sole_consumer(conv.outputs[0])
        if add is None or id(add) not in inside or id(add) in taken or not is_op(add, "Add"):
            continue
        residual = add.inputs[1] if add.inputs[0] is conv.outputs[0] else add.inputs[0]
        if (
            residual is conv.outputs[0]
            or const_array(residual) is not None
            or not _same_shape(residual, conv.outputs[0])
        ):
            continue
        activation = sole_consumer(add.outputs[0])
        if (
            activation is None
            or id(activation) not in inside
            or not any(is_op(activation, op) for op in FUSABLE_ACTIVATIONS)
        ):
            activation = None
        taken.add(id(add))
        last = activation or add
        units[id(last)] = (conv, add, activation)
    return units


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    # An unknown dimension (SymbolicDim(None)) equals another unknown one but proves nothing.
    return all(
        x == y and (isinstance(x, int) or x.value is not None) for x, y in zip(a.shape, b.shape, strict=True)
    )
