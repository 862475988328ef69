"""Loading and saving models for the optimizer (onnx-ir is our in-memory representation)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir

# Protobuf cannot serialize a message above 2 GiB, so larger models keep weights outside.
PROTOBUF_LIMIT = 2 * 1024**3


class ModelLoadError(ValueError):
    """The model file could not be read; the message names the file and the problem."""


def load_model(source: str | os.PathLike | onnx.ModelProto | ir.Model) -> ir.Model:
    """Any accepted source as an onnx-ir Model. An ir.Model is returned as is (not copied)."""
    if isinstance(source, ir.Model):
        return source
    if isinstance(source, onnx.ModelProto):
        return ir.serde.deserialize_model(source)
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such model file")
    try:
        return ir.load(path)
    except Exception as error:  # protobuf raises DecodeError, RuntimeError, ValueError ...
        raise ModelLoadError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error})") from error


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
