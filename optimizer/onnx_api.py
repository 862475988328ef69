"""onnx's C++ functions (shape inference) called on our onnx-ir model, leaving the model as it was.

onnx's functions take a serialized ModelProto, and serializing a model's weights costs more than
inferring its graph (and cannot be done at all above 2 GB). So the call gets the graph with every
initializer turned into a graph input (typed and shaped, as inference needs) and the values of those
over BIG_TENSOR_BYTES left out; small ones stay, since shape arithmetic reads them. Whatever happens
(serializing can fail too: a lazily packed weight whose computation raises), the model gets its
inputs, initializers and weights back, and the error goes through.

onnx-ir's own helper for this is private, and restores nothing when serializing fails. The copy is
written for inference only (serialize_for_inference): what inference reads, at a fraction of the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import onnx
import onnx_ir as ir

_R = TypeVar("_R")

BIG_TENSOR_BYTES = 1000  # values above this are left out of the serialized copy


def call_onnx(func: Callable[[onnx.ModelProto], _R], model: ir.Model) -> _R:
    graph = model.graph
    inputs = list(graph.inputs)
    initializers = [(value, value.const_value) for value in graph.initializers.values()]
    try:
        for value, tensor in initializers:
            if tensor is not None:
                value.shape = value.shape if value.shape is not None else tensor.shape
                value.dtype = value.dtype if value.dtype is not None else tensor.dtype
            if value not in graph.inputs:
                graph.inputs.append(value)
            if tensor is None or _too_big_to_copy(tensor):
                value.const_value = None
                graph.initializers.pop(value.name)
        return func(serialize_for_inference(model))
    finally:
        for value, tensor in initializers:
            value.const_value = tensor
            if value.name not in graph.initializers:
                graph.initializers.add(value)
        graph.inputs.clear()
        graph.inputs.extend(inputs)


def _too_big_to_copy(tensor) -> bool:
    """Whether inference goes without the tensor's values: over BIG_TENSOR_BYTES, or strings, whose
    size onnx-ir cannot tell without decoding them (and whose values no shape depends on)."""
    if tensor.dtype == ir.DataType.STRING:
        return True
    return tensor.nbytes > BIG_TENSOR_BYTES


def serialize_for_inference(model: ir.Model) -> onnx.ModelProto:
    """The model as onnx's shape inference reads it: opsets, the graph's inputs, initializers,
    nodes, outputs and every typed value's value info.

    onnx-ir's serializer writes everything a saved model needs (quantization annotations, metadata,
    doc strings, device configurations) through a wrapped call per node, value and attribute: ~10 µs
    a node, most of a tiny GPT-2's first shape inference. None of that is read by inference, so the
    nodes here are written with one protobuf call each. A model with functions, which inference
    expands, goes through onnx-ir's serializer whole."""
    if model.functions:
        return ir.serde.serialize_model(model)
    proto = onnx.ModelProto(ir_version=model.ir_version)
    for domain, version in sorted(model.opset_imports.items()):
        proto.opset_import.add(domain=domain, version=version)
    graph, graph_proto = model.graph, proto.graph
    if graph.name:  # inference's errors name the graph
        graph_proto.name = graph.name
    serialize_value, serialize_attribute = ir.serde.serialize_value_into, ir.serde.serialize_attribute_into
    for value in graph.inputs:
        serialize_value(graph_proto.input.add(), value)
    input_names = {value.name for value in graph.inputs}
    for value in graph.initializers.values():
        if value.name not in input_names and _has_info(value):
            serialize_value(graph_proto.value_info.add(), value)
        if value.const_value is not None:
            value.const_value.name = value.name
            ir.serde.serialize_tensor_into(graph_proto.initializer.add(), from_=value.const_value)
    add_node, value_info = graph_proto.node.add, graph_proto.value_info
    for node in graph:
        outputs = list(node.outputs)
        while outputs and not outputs[-1].name:  # trailing unnamed outputs are not written
            outputs.pop()
        node_proto = add_node(op_type=node.op_type, input=["" if v is None else v.name for v in node.inputs],
                              output=[v.name for v in outputs])
        if node.domain:
            node_proto.domain = node.domain
        if node.name:
            node_proto.name = node.name
        for attribute in node.attributes.values():
            if attribute.is_ref():
                ir.serde.serialize_reference_attribute_into(node_proto.attribute.add(), from_=attribute)
            elif not _write_plain_attribute(node_proto.attribute, attribute):
                serialize_attribute(node_proto.attribute.add(), from_=attribute)
        for value in outputs:
            if _has_info(value) and not value.is_graph_output():
                serialize_value(value_info.add(), value)
    for value in graph.outputs:
        serialize_value(graph_proto.output.add(), from_=value)
    return proto


# The attribute kinds of nearly every node, as onnx-ir's serializer writes them (name, the value's
# field, type), each in one protobuf call instead of three wrapped ones: a tiny GPT-2's ~360
# attributes cost a third of its copy (~1 ms). Strings, graphs and lists of tensors go to serde.
_PLAIN_FIELDS = {
    ir.AttributeType.INT: ("i", onnx.AttributeProto.INT),
    ir.AttributeType.FLOAT: ("f", onnx.AttributeProto.FLOAT),
    ir.AttributeType.INTS: ("ints", onnx.AttributeProto.INTS),
    ir.AttributeType.FLOATS: ("floats", onnx.AttributeProto.FLOATS),
}


def _write_plain_attribute(attributes, attribute: ir.Attr) -> bool:
    """Append `attribute` to the node's `attributes` as serde would; False, writing nothing, for a
    kind left to serde (or one with a doc string)."""
    if attribute.doc_string:
        return False
    kind = attribute.type
    plain = _PLAIN_FIELDS.get(kind)
    if plain is not None:
        field, proto_type = plain
        attributes.add(name=attribute.name, type=proto_type, **{field: attribute.value})
        return True
    if kind == ir.AttributeType.TENSOR:
        tensor = attribute.value
        if type(tensor) is ir.TensorProtoTensor and tensor.dtype not in _SIX_BIT and not tensor.metadata_props:
            # a loaded Constant's tensor: serde copies its proto as it is, after a check for 6-bit
            # floats that this one needs not
            attributes.add(name=attribute.name, type=onnx.AttributeProto.TENSOR, t=tensor.raw)
        else:
            ir.serde.serialize_tensor_into(attributes.add(name=attribute.name, type=onnx.AttributeProto.TENSOR).t,
                                           tensor)
        return True
    return False


_SIX_BIT = frozenset({ir.DataType.FLOAT6E2M3, ir.DataType.FLOAT6E3M2})


def _has_info(value: ir.Value) -> bool:
    return bool(value.name) and (value.type is not None or value.shape is not None)
