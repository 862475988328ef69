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
    ids: dict[int, str] = {}

    def ref(value: ir.Value | None) -> str:
        if value is None:
            return "-"
        key = id(value)
        if key not in ids:
            if value.const_value is not None:
                ids[key] = f"c{len(ids)}:{value.dtype}{tuple(value.const_value.shape)}"
            else:
                ids[key] = f"v{len(ids)}"
        return ids[key]

    digest = hashlib.sha256()
    for value in graph.inputs:
        digest.update(f"in {ref(value)} {value.dtype}\n".encode())
    for node in graph:
        attrs = ",".join(_attribute_text(a) for _, a in sorted(node.attributes.items()))
        ins = ",".join(ref(v) for v in node.inputs)
        outs = ",".join(ref(v) for v in node.outputs)
        digest.update(f"{op_key(node)}({ins})->{outs}[{attrs}]\n".encode())
    for value in graph.outputs:
        digest.update(f"out {ref(value)}\n".encode())
    return digest.hexdigest()[:16]
