"""A fingerprint of an optimized graph's structure: ops, attributes and wiring, not weights.

Two commits that fuse the same way hash the same even when weights or value names change,
so the service can tell "the optimizer did something different" from "the model changed".
"""

from __future__ import annotations

import hashlib

import onnx_ir as ir

from optimizer.match import op_key


def _attribute_text(attribute: ir.Attr) -> str:
    if attribute.type == ir.AttributeType.TENSOR:
        # The value itself, not as_tensor(): that checks it against onnx-ir's runtime Protocol,
        # which cost most of an unoptimized tiny model's hash (~0.7 ms a Constant node).
        tensor = attribute.value
        # Small tensors (shapes, axes) are structure; large ones are weights.
        if tensor.size <= 16:
            return f"{attribute.name}=T{tensor.dtype}{list(tensor.numpy().reshape(-1).tolist())}"
        return f"{attribute.name}=T{tensor.dtype}{tuple(tensor.shape)}"
    if attribute.type == ir.AttributeType.GRAPH:
        return f"{attribute.name}=G{graph_hash(attribute.as_graph())}"
    if attribute.type == ir.AttributeType.GRAPHS:
        return f"{attribute.name}=Gs{[graph_hash(g) for g in attribute.as_graphs()]}"
    return f"{attribute.name}={attribute.value!r}"


def graph_hash(graph: ir.Graph) -> str:
    """The graph's lines hashed at once (the digest of their concatenation is the digest of each in
    turn): one update per node, and a second lookup per value, cost a fifth of the hash."""
    ids: dict[int, str] = {}

    def ref(value: ir.Value | None) -> str:
        if value is None:
            return "-"
        text = ids.get(id(value))
        if text is None:
            const = value.const_value
            text = f"c{len(ids)}:{value.dtype}{tuple(const.shape)}" if const is not None else f"v{len(ids)}"
            ids[id(value)] = text
        return text

    lines = [f"in {ref(value)} {value.dtype}\n" for value in graph.inputs]
    for node in graph:
        attributes = node.attributes
        attrs = ",".join(_attribute_text(a) for _, a in sorted(attributes.items())) if attributes else ""
        ins = ",".join([ref(v) for v in node.inputs])
        outs = ",".join([ref(v) for v in node.outputs])
        lines.append(f"{op_key(node)}({ins})->{outs}[{attrs}]\n")
    lines += [f"out {ref(value)}\n" for value in graph.outputs]
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]
