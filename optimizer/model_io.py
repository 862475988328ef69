"""The one way a model comes in: every entry point (HTTP upload, worker, CLI, runtime sessions from a
path, bytes or a ModelProto) loads through `load_model`, so the rules below live in one place.

A model is hostile until checked. Before any weight is read:
  - external data must sit inside the model's own directory: a location that is absolute,
    contains `..`, is not a regular file (a directory, a device, a FIFO) or resolves outside the
    directory after following symlinks is refused, naming the tensor and the location — this is
    the class of onnx's CVE-2024-27318/27319;
  - a ModelProto or bytes with external data needs the directory to be given (`base_dir`);
  - every tensor's bytes must match its declared shape and type (raw data, typed fields, and
    external offset/length against the file's size);
  - node counts, declared tensor sizes and name lengths are bounded by `LoadLimits`, the node count
    as it will be once the model's local functions are inlined (nested calls multiply).
onnx-ir then reads external weights lazily (memory-mapped) from the checked files, and the calls of
the model's local functions are replaced by their bodies, as onnxruntime does when it loads a model
(exporters built on onnxscript write them).
"""

from __future__ import annotations

import math
import os
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
import onnx_ir as ir
from onnx_ir import external_data as ir_external_data
from onnx_ir.passes.common import InlinePass

from optimizer.text import shorten

# Protobuf cannot serialize a message above 2 GiB, so larger models keep weights outside.
PROTOBUF_LIMIT = 2 * 1024**3


class ModelLoadError(ValueError):
    """The model could not be loaded; the message names the file and the problem."""


class UnsafeModelError(ModelLoadError):
    """The model asks for something outside what it may touch (files outside its directory, ...)."""


# One node limit for every way in: the service's uploads and workers, `fusionwatch optimize` and runtime
# sessions all read it from here (the service's settings take the same variable), so a model the upload
# refuses is refused by the CLI too, quickly, instead of a minute of optimizing 200,000 nodes.
MAX_NODES_VARIABLE = "FUSIONWATCH_MAX_NODES"
MAX_NODES = int(os.environ.get(MAX_NODES_VARIABLE, "50000"))


@dataclass(frozen=True)
class LoadLimits:
    """Bounds on what a model may declare. The defaults admit any real export we know of (a 70B-parameter
    LLM has ~10k nodes and 1-2 GiB tensors); the service tightens the tensor size by setting."""

    max_nodes: int = MAX_NODES  # across the main graph, subgraphs and functions
    max_tensor_bytes: int = 32 * 1024**3  # one tensor's declared size
    max_op_chars: int = 256  # op_type and domain: no real op name comes near this


DEFAULT_LIMITS = LoadLimits()

# Which typed field holds each type's values when raw_data is not used, and how many entries
# one element takes there (complex numbers take two).
_TYPED_FIELD = {
    onnx.TensorProto.FLOAT: ("float_data", 1),
    onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.DOUBLE: ("double_data", 1),
    onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.INT64: ("int64_data", 1),
    onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1),
    onnx.TensorProto.STRING: ("string_data", 1),
    **{
        t: ("int32_data", 1)
        for t in (
            onnx.TensorProto.INT32,
            onnx.TensorProto.INT16,
            onnx.TensorProto.INT8,
            onnx.TensorProto.UINT16,
            onnx.TensorProto.UINT8,
            onnx.TensorProto.BOOL,
            onnx.TensorProto.FLOAT16,
            onnx.TensorProto.BFLOAT16,
        )
    },
}


def load_model(
    source: str | os.PathLike | bytes | onnx.ModelProto | ir.Model,
    *,
    base_dir: str | os.PathLike | None = None,
    limits: LoadLimits = DEFAULT_LIMITS,
) -> ir.Model:
    """Any accepted source as a checked onnx-ir Model.

    A path's external data is looked up beside it (its own directory). Bytes and a ModelProto
    have no directory of their own: `base_dir` names it, and without one any external data is
    refused. An ir.Model is returned as is (not copied) once its external tensors are checked.
    """
    if isinstance(source, ir.Model):
        graphs = [source.graph, *source.graph.subgraphs()]  # one walk: it visits every node
        nodes = sum(graph.num_nodes() for graph in graphs)
        if nodes > limits.max_nodes:
            raise ModelLoadError(f"<ir.Model>: {nodes} nodes is over the limit of {limits.max_nodes} "
                                 f"({MAX_NODES_VARIABLE})")
        _check_ir_external_tensors(graphs)
        return source
    if isinstance(source, bytes):
        proto, label = parse_model_bytes(source, "<bytes>"), "<bytes>"
    elif isinstance(source, onnx.ModelProto):
        proto, label = source, "<ModelProto>"
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        proto, label = read_model_proto(path), str(path)
        base_dir = path.parent
    else:
        raise TypeError(f"a model is a path, bytes, onnx.ModelProto or ir.Model, not {type(source).__name__}")
    check_model_proto(proto, label, base_dir=base_dir, limits=limits)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as error:  # onnx-ir's SerdeError and the errors behind it
        raise ModelLoadError(f"{label}: malformed model ({type(error).__name__}: {shorten(str(error), 300)})") from error
    if base_dir is not None:
        ir_external_data.set_base_dir(model.graph, os.fspath(base_dir))
    _default_domain_as_empty(model)
    if model.functions:
        try:
            InlinePass()(model)
        except Exception as error:  # onnx-ir's pass errors (a call cycle, a malformed body) and those behind them
            raise ModelLoadError(f"{label}: its local functions cannot be inlined ({type(error).__name__}: "
                                 f"{shorten(str(error), 300)})") from error
    _negative_dims_unknown(model)
    return model


def _default_domain_as_empty(model: ir.Model) -> None:
    """ONNX's own domain imported as "ai.onnx" is imported as "" (its other name): rules and kernels
    look it up by "", and a rule adding an ONNX node would otherwise import "" a second time at 1."""
    for imports in (model.opset_imports, *(function.opset_imports for function in model.functions.values())):
        if "ai.onnx" in imports:
            version = imports.pop("ai.onnx")
            imports[""] = max(version, imports.get("", version))


def _negative_dims_unknown(model: ir.Model) -> None:
    """A declared dimension below zero (some exporters write -1 for "any") is unknown, as onnxruntime
    reads it: left as a number, a feed of any size was refused and a rule could take it for a size."""
    for graph in (model.graph, *model.graph.subgraphs()):
        values = [*graph.inputs, *graph.outputs, *(v for node in graph for v in node.outputs)]
        for value in values:
            shape = value.shape
            if shape is not None and any(isinstance(d, int) and d < 0 for d in shape):
                value.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d for d in shape])


def read_model_proto(path: str | os.PathLike) -> onnx.ModelProto:
    """The model file's proto, weights left where they are (external data is not read)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such model file")
    return parse_model_bytes(path.read_bytes(), str(path))


def parse_model_bytes(data: bytes, label: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as error:  # protobuf raises DecodeError, RuntimeError, ValueError ...
        raise ModelLoadError(f"{label}: not a readable ONNX model ({type(error).__name__}: {shorten(str(error), 200)})") from error
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{label}: not an ONNX model (no graph)")
    return proto


def check_model_file(path: str | os.PathLike, limits: LoadLimits = DEFAULT_LIMITS) -> onnx.ModelProto:
    """Check a model file for handing to another engine (onnxruntime reads it itself); its proto.

    The same checks as `load_model`, so onnxruntime is only ever given files whose external
    data stays inside their own directory.
    """
    proto = read_model_proto(path)
    check_model_proto(proto, str(path), base_dir=Path(path).parent, limits=limits)
    return proto


def check_model_proto(
    proto: onnx.ModelProto,
    label: str,
    *,
    base_dir: str | os.PathLike | None,
    limits: LoadLimits = DEFAULT_LIMITS,
) -> None:
    """Raise ModelLoadError (UnsafeModelError for escapes) for anything `load_model` refuses."""
    graphs = list(_graphs(proto))
    nodes = sum(len(nodes) for _, nodes in graphs)
    if nodes > limits.max_nodes:
        raise ModelLoadError(f"{label}: {nodes} nodes is over the limit of {limits.max_nodes} ({MAX_NODES_VARIABLE})")
    inlined = _inlined_node_count(proto, label, limits.max_nodes)
    if inlined > limits.max_nodes:
        raise ModelLoadError(f"{label}: {inlined} nodes once its local functions are inlined, over the limit "
                             f"of {limits.max_nodes} ({MAX_NODES_VARIABLE})")
    _check_graph_texts(proto, label)
    for where, node_list in graphs:
        for index, node in enumerate(node_list):
            if not all(isinstance(t, str) for t in (node.name, node.op_type, node.domain, *node.input, *node.output)):
                raise ModelLoadError(f"{label}: node #{index} of {where} has a name that is not UTF-8 text")
            for field in ("op_type", "domain"):
                text = getattr(node, field)
                if len(text) > limits.max_op_chars:
                    raise ModelLoadError(
                        f"{label}: node #{index} of {where} has a {field} of {len(text)} characters "
                        f"(at most {limits.max_op_chars})"
                    )
            _check_attributes(node, f"node #{index} '{shorten(node.name)}' ({shorten(node.op_type, 60)}) of {where}", label)
    _check_no_sparse_initializers(proto, label)
    _check_graph_outputs(proto.graph, label)
    for where, node_list in graphs:
        _check_acyclic(node_list, where, label)
    _check_inputs_defined(proto.graph, "the main graph", label, set())
    base = None if base_dir is None else Path(base_dir)
    for tensor in _tensors(proto):
        _check_tensor(tensor, label, base, limits)


# An attribute's single-message types and the field that must carry its value.
_MESSAGE_FIELD = {onnx.AttributeProto.TENSOR: "t", onnx.AttributeProto.GRAPH: "g",
                  onnx.AttributeProto.SPARSE_TENSOR: "sparse_tensor", onnx.AttributeProto.TYPE_PROTO: "tp"}


def _check_attributes(node: onnx.NodeProto, which: str, label: str) -> None:
    """Every attribute says its type (ONNX requires it from IR version 2), and a tensor or graph
    attribute carries one: onnx-ir reads an untyped attribute as no value at all, which the rules and
    kernels would meet as a crash rather than a reason."""
    for attribute in node.attribute:
        name = shorten(attribute.name, 60)
        if attribute.type == onnx.AttributeProto.UNDEFINED:
            raise ModelLoadError(f"{label}: {which} has attribute '{name}' without a type")
        field = _MESSAGE_FIELD.get(attribute.type)
        if field is not None and not attribute.ref_attr_name and not attribute.HasField(field):
            kind = onnx.AttributeProto.AttributeType.Name(attribute.type)
            raise ModelLoadError(f"{label}: {which} has attribute '{name}' of type {kind} without its value")
        if attribute.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
            # onnx-ir cannot read them yet; its error quotes the whole attribute, values and all.
            raise ModelLoadError(f"{label}: {which} has attribute '{name}', a sparse tensor, which fusionwatch "
                                 f"cannot read yet: write it dense (a Constant's 'value')")


MAX_FUNCTION_DEPTH = 64  # calls within calls; a chain of thousands would exhaust Python's stack


def _inlined_node_count(proto: onnx.ModelProto, label: str, limit: int) -> int:
    """The main graph's nodes (its subgraphs' too) with every call of a local function counted as
    its body: a hostile model nesting calls two by two would otherwise inline to 2**depth nodes.
    Stops counting past `limit`; a function that calls itself, directly or not, is refused."""
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    counted: dict[tuple[str, str, str], int] = {}
    calling: set[tuple[str, str, str]] = set()

    def count(nodes) -> int:
        total = 0
        for node in nodes:
            key = (node.domain, node.op_type, node.overload)
            if key in functions:
                if key in calling:
                    raise ModelLoadError(f"{label}: local function {shorten(node.domain)}.{shorten(node.op_type)} "
                                         "calls itself; its calls cannot be inlined")
                if len(calling) >= MAX_FUNCTION_DEPTH:
                    raise ModelLoadError(f"{label}: local functions call each other more than "
                                         f"{MAX_FUNCTION_DEPTH} deep")
                if key not in counted:
                    calling.add(key)
                    counted[key] = count(functions[key].node)
                    calling.discard(key)
                total += counted[key]
            else:
                total += 1
            for attribute in node.attribute:
                for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    total += count(graph.node)
            if total > limit:
                return total
        return total

    return count(proto.graph.node) if functions else 0


def _check_graph_outputs(graph: onnx.GraphProto, label: str) -> None:
    seen: set[str] = set()
    for output in graph.output:
        if output.name in seen:
            raise ModelLoadError(f"{label}: graph output '{shorten(output.name)}' is listed twice")
        seen.add(output.name)


def _check_graph_texts(proto: onnx.ModelProto, label: str) -> None:
    """Protobuf hands back bytes for a string field that is not UTF-8; every name must be text."""
    fields = [proto.producer_name, proto.producer_version, proto.domain, proto.graph.name]
    fields += [entry.domain for entry in proto.opset_import]
    fields += [v.name for v in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info)]
    fields += [t.name for t in proto.graph.initializer]
    if not all(isinstance(text, str) for text in fields):
        raise ModelLoadError(f"{label}: a name or field of the model is not UTF-8 text")


def _check_inputs_defined(graph: onnx.GraphProto, where: str, label: str, outer: set[str]) -> None:
    """Every value a node reads is a graph input, an initializer, another node's output, or (in a
    subgraph) a value of an enclosing graph."""
    known = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    known |= {s.values.name for s in graph.sparse_initializer}
    known |= {out for node in graph.node for out in node.output}
    for index, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in known:
                raise ModelLoadError(
                    f"{label}: node #{index} '{shorten(node.name)}' ({shorten(node.op_type, 60)}) of {where} reads "
                    f"'{shorten(name)}', which no graph input, initializer or node provides"
                )
        for attribute in node.attribute:
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _check_inputs_defined(subgraph, f"a subgraph of node '{shorten(node.name)}'", label, known)


def _check_acyclic(nodes: list[onnx.NodeProto], where: str, label: str) -> None:
    """Kahn's algorithm over the values the nodes produce: a node left over sits on a cycle."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    waiting = [0] * len(nodes)
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in set(node.input):
            j = producer.get(name)
            if j is not None:
                waiting[i] += 1
                readers.setdefault(j, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        j = ready.pop()
        done += 1
        for i in readers.get(j, ()):
            waiting[i] -= 1
            if waiting[i] == 0:
                ready.append(i)
    if done < len(nodes):
        stuck = next(i for i, count in enumerate(waiting) if count > 0)
        node = nodes[stuck]
        raise ModelLoadError(
            f"{label}: {where} has a cycle through node '{shorten(node.name)}' ({shorten(node.op_type, 60)}); "
            "an ONNX graph must be acyclic"
        )


def _check_no_sparse_initializers(proto: onnx.ModelProto, label: str) -> None:
    """onnx-ir drops a graph's sparse initializers without a word (it warns, and makes each name a
    new graph input), so the model would fail later as reading a value nothing defines."""
    pending: list[tuple[str, onnx.GraphProto]] = [("the main graph", proto.graph)]
    while pending:
        where, graph = pending.pop()
        if graph.sparse_initializer:
            names = [shorten(sparse.values.name, 60) for sparse in graph.sparse_initializer[:3]]
            raise ModelLoadError(f"{label}: {where} has sparse initializer(s) {names}, which fusionwatch cannot read "
                                 "yet: write them dense")
        pending.extend(_subgraphs(graph.node))


def _graphs(proto: onnx.ModelProto) -> Iterator[tuple[str, list[onnx.NodeProto]]]:
    """Every node list in the model: the main graph, subgraphs at any depth, and functions."""
    pending: list[tuple[str, onnx.GraphProto]] = [("the main graph", proto.graph)]
    for function in proto.functions:
        yield f"function {shorten(function.name)}", list(function.node)
        pending.extend(_subgraphs(function.node))
    while pending:
        where, graph = pending.pop()
        yield where, list(graph.node)
        pending.extend(_subgraphs(graph.node))


def _subgraphs(nodes) -> Iterator[tuple[str, onnx.GraphProto]]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield f"subgraph {shorten(attribute.name)} of node '{shorten(node.name)}'", attribute.g
            for graph in attribute.graphs:
                yield f"subgraph {shorten(attribute.name)} of node '{shorten(node.name)}'", graph


def _tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the model carries: initializers, sparse initializers and attribute tensors."""
    graphs = [proto.graph]
    node_lists = [f.node for f in proto.functions]
    while graphs or node_lists:
        if graphs:
            graph = graphs.pop()
            yield from graph.initializer
            for sparse in graph.sparse_initializer:
                yield sparse.values
                yield sparse.indices
            node_lists.append(graph.node)
            continue
        for node in node_lists.pop():
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                if attribute.HasField("sparse_tensor"):
                    yield attribute.sparse_tensor.values
                    yield attribute.sparse_tensor.indices
                for sparse in attribute.sparse_tensors:
                    yield sparse.values
                    yield sparse.indices
                if attribute.HasField("g"):
                    graphs.append(attribute.g)
                graphs.extend(attribute.graphs)


def _declared_bytes(tensor: onnx.TensorProto, label: str, limits: LoadLimits) -> tuple[int, int | None]:
    """(elements, bytes) the tensor's dims and type declare; bytes is None for strings."""
    name = shorten(tensor.name)
    if any(d < 0 for d in tensor.dims):
        raise ModelLoadError(f"{label}: tensor '{name}' has a negative dimension {list(tensor.dims)[:8]}")
    elements = math.prod(tensor.dims)
    if tensor.data_type == onnx.TensorProto.STRING:
        return elements, None
    try:
        itemsize_bits = ir.DataType(tensor.data_type).bitwidth
    except (ValueError, TypeError) as error:  # not a type at all, or UNDEFINED
        raise ModelLoadError(f"{label}: tensor '{name}' has unknown data type {tensor.data_type}") from error
    nbytes = (elements * itemsize_bits + 7) // 8  # sub-byte types (int4, float4) pack several per byte
    if nbytes > limits.max_tensor_bytes:
        raise ModelLoadError(
            f"{label}: tensor '{name}' declares {nbytes} bytes (shape {list(tensor.dims)[:8]}), over the "
            f"limit of {limits.max_tensor_bytes}"
        )
    return elements, nbytes


def _check_tensor(tensor: onnx.TensorProto, label: str, base_dir: Path | None, limits: LoadLimits) -> None:
    elements, nbytes = _declared_bytes(tensor, label, limits)
    name = shorten(tensor.name)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        _check_external(tensor, label, base_dir, nbytes)
        return
    if tensor.HasField("raw_data"):
        if nbytes is not None and len(tensor.raw_data) != nbytes:
            raise ModelLoadError(
                f"{label}: tensor '{name}' declares shape {list(tensor.dims)[:8]} "
                f"({nbytes} bytes) but its raw_data holds {len(tensor.raw_data)} bytes"
            )
        return
    field, per_element = _TYPED_FIELD.get(tensor.data_type, (None, 1))
    if field is None:
        return
    held = len(getattr(tensor, field))
    if held != elements * per_element and held + elements > 0:
        raise ModelLoadError(
            f"{label}: tensor '{name}' declares shape {list(tensor.dims)[:8]} ({elements} elements) "
            f"but its {field} holds {held // per_element}"
        )


def _check_external(tensor: onnx.TensorProto, label: str, base_dir: Path | None, nbytes: int | None) -> None:
    name = shorten(tensor.name)
    keys = Counter(entry.key for entry in tensor.external_data)
    if repeated := sorted(key for key, count in keys.items() if count > 1):
        # Which one counts is up to the reader (onnxruntime refuses the file), so the model is refused now.
        raise ModelLoadError(f"{label}: tensor '{name}' lists the external-data key '{shorten(repeated[0], 60)}' "
                             f"{keys[repeated[0]]} times")
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    shown = shorten(location, 120)

    def refuse(why: str) -> UnsafeModelError:
        return UnsafeModelError(f"{label}: tensor '{name}' has external data at {shown!r}: {why}")

    if not location:
        raise refuse("no location given")
    if "\x00" in location:
        raise refuse("the location contains a NUL character")
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() or PureWindowsPath(location).drive:
        raise refuse("an absolute location; external data must be a file inside the model's own directory")
    if ".." in PurePosixPath(location.replace("\\", "/")).parts:
        raise refuse("the location contains '..'; external data must be a file inside the model's own directory")
    if base_dir is None:
        raise refuse("the model came without a directory, so external data cannot be read (load it from its file or give base_dir)")
    if nbytes is None:
        raise refuse("string tensors cannot be stored as external data")
    root = os.path.realpath(base_dir)
    resolved = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, resolved]) != root:
        raise refuse("it resolves outside the model's directory (a symbolic link?)")
    try:
        info = os.stat(resolved)
    except FileNotFoundError:
        raise refuse("no such file in the model's directory") from None
    if stat.S_ISDIR(info.st_mode):
        raise refuse("it is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise refuse("it is not a regular file (a device, FIFO or socket?)")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else info.st_size - offset
    except ValueError:
        raise refuse("its offset or length is not an integer") from None
    if offset < 0 or length < 0:
        raise refuse(f"negative offset {offset} or length {length}")
    if offset + length > info.st_size:
        raise refuse(f"bytes {offset}..{offset + length} run past the file's end ({info.st_size} bytes)")
    if length != nbytes:
        raise refuse(f"it holds {length} bytes but shape {list(tensor.dims)[:8]} of this type needs {nbytes}")


def _check_ir_external_tensors(graphs: list[ir.Graph]) -> None:
    """An in-memory model built by our caller (its graph and subgraphs): its external tensors must
    still stay in their directories."""
    for graph in graphs:
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            location, base = tensor.location, tensor.base_dir
            if os.path.isabs(location) or ".." in PurePosixPath(location.replace("\\", "/")).parts or not base:
                raise UnsafeModelError(
                    f"<ir.Model>: tensor '{shorten(value.name or '')}' has external data at "
                    f"{shorten(location, 120)!r} outside a model directory"
                )
            root = os.path.realpath(base)
            if os.path.commonpath([root, os.path.realpath(os.path.join(root, location))]) != root:
                raise UnsafeModelError(
                    f"<ir.Model>: tensor '{shorten(value.name or '')}' has external data at "
                    f"{shorten(location, 120)!r} resolving outside {base}"
                )


def _weight_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def save_model(model: ir.Model, path: str | os.PathLike) -> Path:
    """Write `model` to `path`; weights go to `<name>.data` beside it when the file would pass 2 GiB."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if _weight_bytes(model) >= PROTOBUF_LIMIT:
        ir.save(model, path, external_data=path.name + ".data")
    else:
        ir.save(model, path)
    return path
