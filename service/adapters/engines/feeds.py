"""Deterministic inputs for a model's graph inputs, the same arrays for every engine.

Read from the graph: the dtype is the input's; a symbolic dimension is sized by its name
(dimensions.py): 1 for the batch, `sequence_length` for the new positions, a few cached positions
for a key/value past ("past_sequence_length") and their sum for a mask over both
("past_sequence_length + sequence_length", "total_sequence_length"). Integer inputs by name:
"mask" → ones, "type"/"segment" → zeros, "position" → as transformers' generate() makes them
from the attention mask over past and new positions (cumsum - 1, 1 on padding; 0, 1, 2, … for a
model without a past or a mask), anything else token ids below the vocabulary size read from the
embedding table it indexes (1000 where none can be found); floats (the past included) are seeded
standard normal; a bool named like "use_cache" (Optimum's merged decoders choose their branch
with `use_cache_branch`) is true exactly when the past fed is longer than 0, the branch that reads
it. An input none of these rules covers is a FeedError naming it and its type, not a guess.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx

from service.adapters.engines.dimensions import PAST_SEQUENCE_LENGTH, Dimensions, FeedError, names_past

DEFAULT_VOCABULARY = 1000  # token ids stay below this when no embedding table says otherwise
SEED = 0
# Ops that pass token ids through unchanged on their way to an embedding Gather
# (GPT-2's exports flatten input_ids with a Reshape first).
_ID_PASSTHROUGH = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Identity"})


@dataclass(frozen=True)
class Padding:
    """Zeros in one row of the attention mask: `count` positions (None: a quarter of them, at least
    one) at the start ("left", as batched generation pads) or the end ("right")."""

    side: Literal["left", "right"]
    row: int
    count: int | None = None


def make_feeds(
    model: onnx.ModelProto,
    sequence_length: int = 128,
    seed: int = SEED,
    batch: int = 1,
    *,
    past_length: int = PAST_SEQUENCE_LENGTH,
    encoder_length: int | None = None,
    padding: Padding | None = None,
) -> dict[str, np.ndarray]:
    """One array per graph input (initializers that are also inputs keep their stored values).

    `past_length` cached positions where the graph has a past (dimensions.py); `encoder_length` for
    dimensions named like the encoder's (None: `sequence_length`); `padding` zeros part of the
    attention mask, and the position ids follow it."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [value for value in graph.input if value.name not in initializers]
    dimensions = Dimensions(inputs, batch, sequence_length, past_length, encoder_length)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    positions: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for value in inputs:
        dtype, shape = _dtype_and_shape(value, dimensions)
        if _is_position(value.name, dtype):
            positions[value.name] = dtype, shape  # from the mask once it is padded; they draw nothing
        else:
            feeds[value.name] = _feed(value.name, dtype, shape, rng, graph, dimensions.past)
    if padding is not None:
        _pad(feeds, _attention_mask(model), padding)
    masks = [array for name, array in feeds.items() if "mask" in name.lower() and array.ndim == 2]
    for name, (dtype, shape) in positions.items():
        feeds[name] = _positions(dtype, shape, dimensions.past, masks)
    return {value.name: feeds[value.name] for value in inputs}  # graph order: the digest reads it so


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
    if _attention_mask(model) is None:
        return sets
    # With a past the mask covers past and new positions, so a left-padded row's padding starts in the
    # cache, and the position ids count only the positions the mask keeps.
    for name, padding in ((LEFT_PADDED, Padding("left", 0)), (RIGHT_PADDED, Padding("right", 1))):
        sets[name] = make_feeds(model, sequence_length, batch=2, padding=padding)
    return sets


def _pad(feeds: dict[str, np.ndarray], mask: str | None, padding: Padding) -> None:
    if mask is None:
        raise FeedError("padding asked for, but the model has no [batch, positions] attention mask with a free batch")
    positions = feeds[mask].shape[-1]
    count = max(1, positions // 4) if padding.count is None else padding.count
    columns = slice(0, count) if padding.side == "left" else slice(positions - count, positions)
    feeds[mask][padding.row, columns] = 0


def _is_position(name: str, dtype: np.dtype) -> bool:
    """An integer input the position rule covers: named like "position" and by none of the rules
    _feed applies before it (mask, token type, segment)."""
    lowered = name.lower()
    return (
        np.issubdtype(dtype, np.integer)
        and "position" in lowered
        and not any(word in lowered for word in ("mask", "type", "segment"))
    )


def _positions(dtype: np.dtype, shape: tuple[int, ...], past: int, masks: list[np.ndarray]) -> np.ndarray:
    """Position ids as transformers' generate() makes them: the mask's cumulative sum - 1, 1 where it
    is 0, the last `new` columns; so a left-padded row starts at 0 at its first real token. Without a
    [batch, past + new] mask: past, past + 1, … (what an unpadded mask gives)."""
    new = shape[-1] if shape else 1
    mask = next((m for m in masks if len(shape) == 2 and m.shape == (shape[0], past + new)), None)
    if mask is None:
        return np.broadcast_to(np.arange(past, past + new, dtype=dtype), shape).copy()
    counted = np.cumsum(mask, axis=-1, dtype=np.int64) - 1
    counted[mask == 0] = 1  # generate()'s position_ids.masked_fill_(attention_mask == 0, 1)
    return counted[:, -new:].astype(dtype) if new else counted[:, :0].astype(dtype)


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
    fixed = dim.HasField("dim_value") and dim.dim_value > 0
    return not fixed and not (axis == 0 or "batch" in dim.dim_param.lower() or names_past(dim.dim_param))


def _dtype_and_shape(value: onnx.ValueInfoProto, dimensions: Dimensions) -> tuple[np.dtype, tuple[int, ...]]:
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
    return dtype, dimensions.shape(value)


def _numpy_dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):  # undefined, or a type numpy lacks (bfloat16, float8)
        return None


def _feed(
    name: str, dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, graph: onnx.GraphProto, past: int
) -> np.ndarray:
    lowered = name.lower()
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if "mask" in lowered:
        return np.ones(shape, dtype)
    if dtype == np.bool_ and "use_cache" in lowered:
        # Optimum's merged decoder: true runs the branch that concatenates onto the past fed; false would
        # ignore it while the mask still covers it.
        return np.full(shape, past > 0, np.bool_)
    if dtype == np.bool_:
        raise FeedError(f"input '{name}' has type tensor(bool) and is not a mask; no feed rule covers it")
    if "type" in lowered or "segment" in lowered:
        return np.zeros(shape, dtype)
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
