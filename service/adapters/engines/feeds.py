"""Deterministic inputs for a model's graph inputs, the same arrays for every engine.

Read from the graph: the dtype is the input's; a symbolic dimension is 1 for the batch (the
first axis, or one named like "batch") and `sequence_length` for any other. Integer inputs by
name: "mask" → ones, "type"/"segment" → zeros, "position" → 0, 1, 2, … along the last axis,
anything else token ids below the vocabulary size read from the embedding table it indexes
(1000 where none can be found); floats are seeded standard normal. An input none of these
rules covers is a FeedError naming it and its type, not a guess.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import onnx

DEFAULT_VOCABULARY = 1000  # token ids stay below this when no embedding table says otherwise
SEED = 0
# Ops that pass token ids through unchanged on their way to an embedding Gather
# (GPT-2's exports flatten input_ids with a Reshape first).
_ID_PASSTHROUGH = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Identity"})


class FeedError(ValueError):
    """A graph input no feed rule covers; the message names the input and its type."""


def make_feeds(
    model: onnx.ModelProto, sequence_length: int = 128, seed: int = SEED, batch: int = 1
) -> dict[str, np.ndarray]:
    """One array per graph input (initializers that are also inputs keep their stored values)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.input:
        if value.name in initializers:
            continue
        dtype, shape = _dtype_and_shape(value, sequence_length, batch)
        feeds[value.name] = _feed(value.name, dtype, shape, rng, graph)
    return feeds


SYNTHESIZED = "synthesized"  # the feed set every result is timed on
LEFT_PADDED = "synthesized-left-padded"
RIGHT_PADDED = "synthesized-right-padded"


def synthesized_feed_sets(model: onnx.ModelProto, sequence_length: int = 128) -> dict[str, dict[str, np.ndarray]]:
    """The feed sets the numeric check runs on without a user's own: the timed feeds and, for a model
    with an attention mask and a free batch, a batch of 2 padded on the left (row 0's first quarter
    masked: batched generation pads so, and under a causal mask its first queries then see nothing
    but padding) and one padded on the right (row 1's last quarter), the inputs that decide whether
    an attention fusion handles masking as its subgraph does."""
    sets = {SYNTHESIZED: make_feeds(model, sequence_length)}
    mask = _attention_mask(model)
    if mask is None:
        return sets
    for name, row, padded in ((LEFT_PADDED, 0, "left"), (RIGHT_PADDED, 1, "right")):
        feeds = make_feeds(model, sequence_length, batch=2)
        positions = feeds[mask].shape[-1]
        pad = max(1, positions // 4)
        feeds[mask][row, slice(0, pad) if padded == "left" else slice(positions - pad, positions)] = 0
        sets[name] = feeds
    return sets


def _attention_mask(model: onnx.ModelProto) -> str | None:
    """The [batch, positions] integer or bool input named like a mask, when its batch is free."""
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers or "mask" not in value.name.lower():
            continue
        tensor = value.type.tensor_type
        if value.type.WhichOneof("value") != "tensor_type" or len(tensor.shape.dim) != 2:
            continue
        dtype = _numpy_dtype(tensor.elem_type)
        batch = tensor.shape.dim[0]
        if dtype is not None and (np.issubdtype(dtype, np.integer) or dtype == np.bool_) and not batch.HasField("dim_value"):
            return value.name
    return None


def describe_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, str]:
    """{"input_ids": "int64[1, 128]"}, for a result to say what it was timed on."""
    return {name: f"{array.dtype.name}{list(array.shape)}" for name, array in feeds.items()}


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and bytes: two runs with equal digests saw equal inputs."""
    digest = hashlib.sha256()
    for name, array in feeds.items():
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def sequence_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs with a dimension `make_feeds` sets to the sequence length (symbolic, not
    the batch), in graph order."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [
        value.name
        for value in model.graph.input
        if value.name not in initializers
        and value.type.WhichOneof("value") == "tensor_type"
        and any(_is_sequence_dim(axis, dim) for axis, dim in enumerate(value.type.tensor_type.shape.dim))
    ]


def _is_sequence_dim(axis: int, dim) -> bool:
    return not (dim.HasField("dim_value") and dim.dim_value > 0) and not (axis == 0 or "batch" in dim.dim_param.lower())


def _dtype_and_shape(
    value: onnx.ValueInfoProto, sequence_length: int, batch: int = 1
) -> tuple[np.dtype, tuple[int, ...]]:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise FeedError(
            f"input '{value.name}' is a {kind or 'value of unknown type'}; feeds are made for tensors only"
        )
    tensor = value.type.tensor_type
    type_name = onnx.TensorProto.DataType.Name(tensor.elem_type)
    dtype = _numpy_dtype(tensor.elem_type)
    if dtype is None or not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
        raise FeedError(
            f"input '{value.name}' has type tensor({type_name.lower()}); feeds are made for float, "
            "integer and bool tensors only"
        )
    if not tensor.HasField("shape"):
        raise FeedError(
            f"input '{value.name}' (tensor({type_name.lower()})) has no shape, so its rank is unknown"
        )
    shape = []
    for axis, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(dim.dim_value)
        elif _is_sequence_dim(axis, dim):
            shape.append(sequence_length)
        else:
            shape.append(batch)
    return dtype, tuple(shape)


def _numpy_dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):  # undefined, or a type numpy lacks (bfloat16, float8)
        return None


def _feed(
    name: str, dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, graph: onnx.GraphProto
) -> np.ndarray:
    lowered = name.lower()
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if "mask" in lowered:
        return np.ones(shape, dtype)
    if dtype == np.bool_:
        raise FeedError(f"input '{name}' has type tensor(bool) and is not a mask; no feed rule covers it")
    if "type" in lowered or "segment" in lowered:
        return np.zeros(shape, dtype)
    if "position" in lowered:
        # Random positions would be valid indices, but no model is ever fed them.
        return np.broadcast_to(np.arange(shape[-1] if shape else 1, dtype=dtype), shape).copy()
    vocabulary = vocabulary_size(name, graph) or DEFAULT_VOCABULARY
    high = min(vocabulary, int(np.iinfo(dtype).max) + 1)
    return rng.integers(0, high, shape).astype(dtype)


def vocabulary_size(name: str, graph: onnx.GraphProto) -> int | None:
    """Rows of the smallest embedding table (an initializer Gathered on axis 0) that `name` indexes."""
    tables = {t.name: list(t.dims) for t in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for input_name in node.input:
            consumers.setdefault(input_name, []).append(node)
    sizes = []
    pending, seen = [name], {name}
    while pending:
        value = pending.pop()
        for node in consumers.get(value, []):
            if (
                node.op_type == "Gather"
                and node.domain in ("", "ai.onnx")
                and len(node.input) > 1
                and node.input[1] == value
            ):
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                dims = tables.get(node.input[0])
                if axis == 0 and dims:
                    sizes.append(dims[0])
            elif node.op_type in _ID_PASSTHROUGH and node.input[0] == value:
                for output in node.output:
                    if output not in seen:
                        seen.add(output)
                        pending.append(output)
    return min(sizes) if sizes else None
