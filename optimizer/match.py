"""Small questions rules ask about a graph while matching.

Each helper answers one question and returns `None` when the answer is "no", so a rule
reads top to bottom and writes its own near-miss reason at each step.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

MS = "com.microsoft"
# Domains whose ops we understand; anything else is a custom op and a fusion barrier.
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", MS})


def op_key(node: ir.Node) -> str:
    """'Op' for the ONNX domain, 'domain.Op' otherwise — how ONNX Runtime's tests count ops."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    return f"{domain}.{node.op_type}" if domain else node.op_type


def is_op(node: ir.Node | None, op_type: str, domain: str = "") -> bool:
    if node is None or node.op_type != op_type:
        return False
    return (node.domain or "") in ((domain,) if domain else ("", "ai.onnx"))


def is_custom(node: ir.Node) -> bool:
    return node.domain not in KNOWN_DOMAINS


def describe(node: ir.Node | None) -> str:
    """How a node is named in a near-miss message."""
    if node is None:
        return "a graph input or initializer"
    text = f"{op_key(node)} '{node.name}'" if node.name else op_key(node)
    if is_custom(node):
        text += " (custom op, a fusion barrier)"
    return text


def value_name(value: ir.Value | None) -> str:
    return "<missing>" if value is None else (value.name or "<unnamed>")


def opset(graph: ir.Graph, domain: str = "") -> int:
    imports = graph.opset_imports
    if domain == "":
        return imports.get("", imports.get("ai.onnx", 1))
    return imports.get(domain, 1)


def input_at(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def producer(value: ir.Value | None) -> ir.Node | None:
    return None if value is None else value.producer()


def consumers(value: ir.Value) -> list[ir.Node]:
    """Distinct consuming nodes (a node that reads a value twice is listed once)."""
    seen: dict[int, ir.Node] = {}
    for node, _ in value.uses():
        seen.setdefault(id(node), node)
    return list(seen.values())


def sole_consumer(value: ir.Value) -> ir.Node | None:
    """The one node reading `value`, or None if zero or several read it or it is a graph output."""
    users = consumers(value)
    if len(users) != 1 or value.is_graph_output():
        return None
    return users[0]


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant content (initializer or Constant node output), or None."""
    if value is None:
        return None
    if value.const_value is not None and not value.is_graph_input():
        return _materialized(value)
    node = value.producer()
    if node is not None and is_op(node, "Constant") and "value" in node.attributes:
        return _attribute_tensor(node.attributes["value"]).numpy()
    return None


def const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """The tensor `const_array` would decode, left undecoded."""
    if value.const_value is not None:
        return None if value.is_graph_input() else value.const_value
    node = value.producer()
    if node is not None and is_op(node, "Constant") and "value" in node.attributes:
        return _attribute_tensor(node.attributes["value"])
    return None


def is_const(value: ir.Value | None) -> bool:
    """Whether `value` is a constant, without decoding its data (cheap for big weights)."""
    if value is None:
        return False
    if value.const_value is not None:
        return not value.is_graph_input()
    node = value.producer()
    return node is not None and is_op(node, "Constant") and "value" in node.attributes


def _materialized(value: ir.Value) -> np.ndarray:
    """The initializer's array, decoded from its protobuf once.

    A TensorProtoTensor copies its bytes out of the protobuf on every `.numpy()` (about
    100 ms for BERT-base's word embeddings); rules ask for the same weights many times, so
    the first answer replaces the tensor (same name, dtype and data; no copy of the array).
    """
    tensor = value.const_value
    array = tensor.numpy()
    if isinstance(tensor, ir.TensorProtoTensor):
        value.const_value = ir.Tensor(array, name=tensor.name, doc_string=tensor.doc_string)
    return array


def const_scalar(value: ir.Value | None) -> float | None:
    """A constant holding exactly one element, as a float; None otherwise."""
    array = const_array(value)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(()))


def is_const_close(value: ir.Value | None, expected: float, rtol: float = 1e-3) -> bool:
    scalar = const_scalar(value)
    return scalar is not None and bool(np.isclose(scalar, expected, rtol=rtol, atol=1e-6))


def rank(value: ir.Value | None) -> int | None:
    if value is None:
        return None
    if value.shape is not None:
        return len(value.shape)
    array = const_array(value)
    return None if array is None else array.ndim


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The shape when every dimension is a known integer."""
    if value is None:
        return None
    tensor = const_tensor(value)
    if tensor is not None:  # its shape, without decoding the data (BERT's embeddings are 94 MB)
        return tuple(int(d) for d in tensor.shape)
    if value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return tuple(value.shape)


def attr(node: ir.Node, name: str, default=None):
    """A node attribute as a plain Python value (int, float, str, list, numpy array)."""
    attribute = node.attributes.get(name)
    if attribute is None:
        return default
    if attribute.type == ir.AttributeType.TENSOR:
        return _attribute_tensor(attribute).numpy()
    return attribute.value


def _attribute_tensor(attribute: ir.Attr) -> ir.TensorProtocol:
    """A TENSOR attribute's tensor. `Attr.as_tensor()` re-checks the value against the
    TensorProtocol, a runtime-checkable Protocol whose isinstance costs ~0.1 ms; folding
    reads a thousand Constants on GPT-2. onnx-ir only ever stores a tensor there."""
    return attribute.value


def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """For a binary node fed by `value`, its other input."""
    a, b = input_at(node, 0), input_at(node, 1)
    if a is value:
        return b
    if b is value:
        return a
    return None


def consumer_of(value: ir.Value, op_type: str, domain: str = "") -> ir.Node | None:
    """The first node of `op_type` reading `value`, however many other readers it has.

    Rules follow a pattern with this and leave extra readers (and graph outputs) to the
    driver's boundary check, whose near miss names the reader that blocked the fusion.
    """
    return next((node for node in consumers(value) if is_op(node, op_type, domain)), None)


def split_scalar(node: ir.Node) -> tuple[ir.Value, float] | None:
    """For a binary node with one single-element constant input: (the other input, the constant)."""
    for const_side, data_side in ((1, 0), (0, 1)):
        scalar = const_scalar(input_at(node, const_side))
        if scalar is not None and input_at(node, data_side) is not None:
            return node.inputs[data_side], scalar
    return None


def stand_in_blocker(value: ir.Value) -> str | None:
    """Why `value` cannot replace the output of a node that is removed (None when it can).

    The driver gives a replacement value the replaced output's name, so the output keeps
    its name when it is a graph output. Renaming a graph input or another graph output
    would change the model's interface, so such a value cannot stand in.
    """
    if value.is_graph_input():
        return f"its input '{value_name(value)}' is a graph input"
    if value.is_graph_output():
        return f"its input '{value_name(value)}' is a graph output"
    return None


# While the driver runs anchored rules it keeps the taken names here, up to date across its
# rewrites: collecting them walks every node, and ReshapeFusion asks once per match.
TAKEN_NAMES_META_KEY = "fusionwatch.taken_names"


def unique_name(graph: ir.Graph, base: str) -> str:
    """`base`, or `base_1`, `base_2`... — the first name no value of `graph` already has."""
    taken = graph.meta.get(TAKEN_NAMES_META_KEY)
    if taken is None:
        taken = set(graph.initializers) | {v.name for v in graph.inputs}
        taken |= {v.name for node in graph for v in node.outputs}
    name, suffix = base, 0
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    return name


def per_channel_vector(array: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """`array` as a [channels] vector when it broadcasts along the channel axis (axis 1) of a
    rank-`rank` NCHW tensor only — [C,1,1], [1,C,1,1], a scalar — without growing that tensor."""
    if array.ndim > rank:
        return None
    shape = (1,) * (rank - array.ndim) + array.shape
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(array.reshape(-1), (channels,)).copy()


# Our own ops (the layout level's channels-last pools) live here; they are known, not custom.
FUSIONWATCH = "com.fusionwatch"
KNOWN_DOMAINS = KNOWN_DOMAINS | {FUSIONWATCH}


def producer_and_other(node: ir.Node, op_type: str) -> tuple[ir.Node | None, ir.Value | None]:
    """For a binary node, the `op_type` node feeding one of its inputs and the other input."""
    for index in (0, 1):
        source = producer(input_at(node, index))
        if is_op(source, op_type):
            return source, input_at(node, 1 - index)
    return None, None


def is_noop_cast(node: ir.Node | None) -> bool:
    """A Cast to the type its input already has (mixed-precision exports leave them around)."""
    if not is_op(node, "Cast"):
        return False
    source = input_at(node, 0)
    return source is not None and source.dtype is not None and int(source.dtype) == attr(node, "to")


def through_noop_casts(value: ir.Value | None) -> tuple[ir.Value | None, list[ir.Node]]:
    """`value` with no-op Casts in front of it peeled off, and those Casts (nearest first)."""
    casts = []
    while is_noop_cast(producer(value)):
        casts.append(value.producer())
        value = value.producer().inputs[0]
    return value, casts


def same_value(a: ir.Value | None, b: ir.Value | None) -> bool:
    """Whether `a` and `b` are one value, up to no-op Casts on either side."""
    return a is not None and through_noop_casts(a)[0] is through_noop_casts(b)[0]


def ancestor(value: ir.Value, wanted, limit: int = 64) -> ir.Node | None:
    """The first of the nodes computing `value` (up to `limit` of them) for which `wanted` holds."""
    seen: set[int] = set()
    stack = [producer(value)]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if wanted(node):
            return node
        stack.extend(producer(v) for v in node.inputs)
    return None


def custom_ancestor(value: ir.Value) -> ir.Node | None:
    """A custom op among the nodes computing `value`: where shapes and patterns stop."""
    return ancestor(value, is_custom)


# Where a quantized model's products and lookups come from: the integer op itself, or the
# DequantizeLinear that turns an integer table or QDQ tensor back into floats; failing those, the
# quantizer of the activation (its scale reaches the product's dequantizing Mul).
QUANTIZED_PRODUCTS = frozenset({"MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                                "ConvInteger", "QLinearConv", "QGemm", "DequantizeLinear"})
QUANTIZERS = frozenset({"DynamicQuantizeLinear", "QuantizeLinear"})
# A dequantized product reaches the float graph through its Cast, scale Mul and bias Add.
DEQUANTIZE_STEPS = 6


def quantized_note(node: ir.Node | None) -> str:
    """" (quantized: …)" where `node` is, or is a few steps after, a quantized product or a dequantized
    tensor, else "": a near miss on a model quantize_dynamic or a QDQ export rewrote names the
    quantization, not the node found, as what the fusion does not read."""
    product = quantizer = None
    frontier, seen = [node], set()
    while frontier and len(seen) < DEQUANTIZE_STEPS:  # nearest first: the product, not a scale's source
        current = frontier.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if product is None and current.op_type in QUANTIZED_PRODUCTS:
            product = current
        elif quantizer is None and current.op_type in QUANTIZERS:
            quantizer = current
        frontier.extend(producer(v) for v in current.inputs)
    found = product or quantizer
    if found is None:
        return ""
    source = "" if found is node else f": it comes from {describe(found)}"
    return f" (quantized{source}; the fusions match float MatMul, Gemm and Gather, not quantized ones)"
