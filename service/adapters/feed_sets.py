"""A project's own feed sets: named .npz files of inputs for one model, checked like the synthesized ones.

Users know which inputs break a fusion (their tokenizer's padding, their real masks); a feed set
brings them. It is validated against the model's graph inputs before it is stored, and again before a
job uses it (the model may have changed since): every problem names the input and what is wrong.
The archive's size is bounded before it is read, and each array's before it is decompressed (an .npz
is a zip; a member's declared size is checked, and numpy reads no pickles).

    <data_dir>/feed_sets/<sha256>.npz
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx

from service.adapters.engines.feeds import vocabulary_size
from service.adapters.storage import ModelStore
from service.errors import Invalid

MAX_FEED_SET_BYTES = 64 * 2**20  # the archive as uploaded, and its arrays once decompressed
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# The synthesized sets' names (service/adapters/engines/feeds.py) are not a user's to take.
RESERVED_PREFIX = "synthesized"


def check_name(name: str) -> str:
    if not NAME.match(name) or name.startswith(RESERVED_PREFIX):
        raise Invalid(
            f"feed set name {name[:60]!r} is not allowed: letters, digits, '.', '_', '-' only, at most 100 "
            f"characters, not starting with '{RESERVED_PREFIX}'"
        )
    return name


def read_npz(name: str, data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an uploaded .npz, or Invalid saying what is wrong with the file."""
    if len(data) > MAX_FEED_SET_BYTES:
        raise Invalid(f"feed set '{name}' is {len(data)} bytes, over the limit of {MAX_FEED_SET_BYTES}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as error:
        raise Invalid(f"feed set '{name}' is not an .npz file (numpy.savez): {error}") from error
    declared = sum(member.file_size for member in members)
    if declared > MAX_FEED_SET_BYTES:
        raise Invalid(f"feed set '{name}' holds {declared} bytes of arrays, over the limit of {MAX_FEED_SET_BYTES}")
    arrays = {}
    for member in members:
        if not member.filename.endswith(".npy"):
            raise Invalid(f"feed set '{name}': member '{member.filename[:100]}' is not an array (.npy)")
        input_name = member.filename[: -len(".npy")]
        try:
            with archive.open(member) as handle:
                arrays[input_name] = np.lib.format.read_array(handle, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
            raise Invalid(f"feed set '{name}': input '{input_name[:100]}' cannot be read: {error}") from error
    if not arrays:
        raise Invalid(f"feed set '{name}' holds no arrays")
    return arrays


def validate(name: str, arrays: dict[str, np.ndarray], model: onnx.ModelProto) -> dict[str, str]:
    """Check `arrays` against the model's graph inputs; {input: "int64[2, 16]"}, or Invalid naming
    the input and the problem."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in initializers]
    expected = [v.name for v in inputs]
    unknown = sorted(set(arrays) - set(expected) - initializers)
    if unknown:
        raise Invalid(f"feed set '{name}': input '{unknown[0][:100]}' is not an input of the model (its inputs: {', '.join(expected)[:300]})")
    for value in inputs:
        where = f"feed set '{name}': input '{value.name}'"
        if value.name not in arrays:
            raise Invalid(f"{where} is missing (the model's inputs: {', '.join(expected)[:300]})")
        array = arrays[value.name]
        tensor = value.type.tensor_type
        want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if array.dtype != want:
            raise Invalid(f"{where} has dtype {array.dtype}, the model takes {want}")
        if tensor.HasField("shape"):
            dims = tensor.shape.dim
            if array.ndim != len(dims):
                raise Invalid(f"{where} has rank {array.ndim} (shape {list(array.shape)}), the model takes rank {len(dims)}")
            for axis, dim in enumerate(dims):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != array.shape[axis]:
                    raise Invalid(
                        f"{where} has {array.shape[axis]} in dimension {axis} (shape {list(array.shape)}), "
                        f"the model fixes it at {dim.dim_value}"
                    )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise Invalid(f"{where} holds {int((~np.isfinite(array)).sum())} NaN or inf values")
        if array.dtype.kind in "iu" and array.size:
            rows = vocabulary_size(value.name, graph)
            if rows is not None and (array.min() < 0 or array.max() >= rows):
                raise Invalid(
                    f"{where} holds ids from {int(array.min())} to {int(array.max())}; the embedding table it "
                    f"indexes has {rows} rows"
                )
    return {n: f"{arrays[n].dtype.name}{list(arrays[n].shape)}" for n in expected}


class FeedSetStore:
    """Validated feed sets, content-addressed: a file is written under a temporary name and renamed."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "feed_sets"

    @classmethod
    def beside(cls, models: ModelStore) -> FeedSetStore:
        """The store in the data directory a model store lives in."""
        return cls(models.root.parent)

    def path(self, sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"not a sha256 digest: {sha256[:80]!r}")
        return self.root / f"{sha256}.npz"

    def put(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        final = self.path(sha256)
        if not final.is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            handle, staging = tempfile.mkstemp(prefix=".incoming-", dir=self.root)
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(staging, final)
        return sha256

    def load(self, name: str, sha256: str) -> dict[str, np.ndarray]:
        return read_npz(name, self.path(sha256).read_bytes())
