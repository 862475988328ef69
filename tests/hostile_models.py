"""Models an attacker would upload, built by the tests themselves (issue: external-data escapes).

Every external-data trick points at a planted secret file beside the model's directory; a test
then checks that no reply, stored row, log line or output tensor ever contains the secret.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

# 16 bytes: two int64 values, so a tensor of shape [2] can claim the whole file.
SECRET = b"root:x:FWSECRET!"
SECRET_VALUES = np.frombuffer(SECRET, dtype=np.int64)


def plant_secret(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "secret.txt"
    path.write_bytes(SECRET)
    return path


def leaks_secret(text: str | bytes) -> bool:
    """Whether `text` carries the secret, as bytes, as text, or as the int64 values a tensor shows."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if SECRET.decode() in text or "FWSECRET" in text:
        return True
    return any(str(int(v)) in text for v in SECRET_VALUES) or "114, 111, 111, 116" in text


def model_reading(location: str, *, offset: int | None = None, length: int | None = None) -> onnx.ModelProto:
    """Identity and Unsqueeze of an int64[2] initializer stored as external data at `location`.

    Identity would return the bytes as its output; Unsqueeze uses them as axes, which the optimizer
    used to quote in its near-miss text.
    """
    weight = TensorProto()
    weight.name = "stolen"
    weight.data_type = TensorProto.INT64
    weight.dims.append(2)
    weight.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    if offset is not None:
        entries["offset"] = str(offset)
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    data = helper.make_tensor("data", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    nodes = [
        helper.make_node("Identity", ["stolen"], ["copied"], name="copy"),
        helper.make_node("Unsqueeze", ["data", "stolen"], ["unsqueezed"], name="unsqueeze"),
    ]
    graph = helper.make_graph(
        nodes,
        "hostile",
        [],
        [
            helper.make_tensor_value_info("copied", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("unsqueezed", TensorProto.FLOAT, None),
        ],
        initializer=[weight, data],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@dataclass
class HostileCase:
    name: str
    model_path: Path  # the .onnx inside its own directory
    expected: str  # a fragment the refusal message must contain


def external_data_cases(root: Path) -> list[HostileCase]:
    """Each escape, as a model file in its own directory under `root`, beside `root/secret.txt`."""
    secret = plant_secret(root)
    cases: list[HostileCase] = []

    def case(name: str, model: onnx.ModelProto, expected: str, setup=None) -> None:
        folder = root / name
        folder.mkdir()
        if setup is not None:
            setup(folder)
        path = folder / "model.onnx"
        path.write_bytes(model.SerializeToString())
        cases.append(HostileCase(name, path, expected))

    case("dotdot", model_reading("../" * 12 + str(secret).lstrip("/")), "'..'")
    case("relative_dotdot", model_reading("../secret.txt"), "'..'")
    case("absolute", model_reading(str(secret)), "absolute")
    case("symlink", model_reading("weights.bin"), "outside the model's directory",
         lambda folder: os.symlink(secret, folder / "weights.bin"))
    case("offset_past_end", model_reading("weights.bin", offset=64, length=16), "past the file's end",
         lambda folder: (folder / "weights.bin").write_bytes(b"\0" * 16))
    case("directory", model_reading("sub"), "directory", lambda folder: (folder / "sub").mkdir())
    # A FIFO: opening it for reading would block the loader forever.
    case("fifo", model_reading("pipe"), "not a regular file", lambda folder: os.mkfifo(folder / "pipe"))
    case("device_symlink", model_reading("null"), "outside the model's directory",
         lambda folder: os.symlink("/dev/zero", folder / "null"))
    case("wrong_length", model_reading("weights.bin", length=8), "needs 16",
         lambda folder: (folder / "weights.bin").write_bytes(b"\0" * 16))
    return cases


def raw_data_of_wrong_size() -> onnx.ModelProto:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [3], np.zeros(3, np.float32).tobytes(), raw=True)
    weight.dims[0] = 4  # onnx's helper checks the size; an attacker writes the proto directly
    node = helper.make_node("Identity", ["w"], ["y"], name="copy")
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def duplicate_graph_outputs() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y, y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _with_output(nodes, initializers, output: str, opset: int = 17) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["x_copy"], name="passthrough"), *nodes],
        "g",
        [x],
        [helper.make_tensor_value_info("x_copy", TensorProto.FLOAT, [2]), helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def unsqueeze_axes_out_of_range() -> onnx.ModelProto:
    """Unsqueeze with axes=[5] on a rank-1 constant, consumed by a Neg so folding is tried."""
    data = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [5])
    nodes = [
        helper.make_node("Unsqueeze", ["c", "axes"], ["u"], name="bad_unsqueeze"),
        helper.make_node("Neg", ["u"], ["out"], name="neg"),
    ]
    return _with_output(nodes, [data, axes], "out")


def transpose_perm_is_string() -> onnx.ModelProto:
    data = helper.make_tensor("c", TensorProto.FLOAT, [2, 3], np.arange(6, dtype=np.float32))
    transpose = helper.make_node("Transpose", ["c"], ["t"], name="bad_transpose")
    transpose.attribute.append(helper.make_attribute("perm", "1,0"))
    return _with_output([transpose, helper.make_node("Neg", ["t"], ["out"], name="neg")], [data], "out")


def huge_range() -> onnx.ModelProto:
    """Range(0, 2e9, 1): 2e9 int64 elements (16 GB) if folding evaluated it."""
    start = helper.make_tensor("start", TensorProto.INT64, [], [0])
    limit = helper.make_tensor("limit", TensorProto.INT64, [], [2_000_000_000])
    delta = helper.make_tensor("delta", TensorProto.INT64, [], [1])
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="huge_range"),
        helper.make_node("Cast", ["r"], ["out"], to=TensorProto.FLOAT, name="cast"),
    ]
    return _with_output(nodes, [start, limit, delta], "out")


def lying_broadcast() -> onnx.ModelProto:
    """(100000, 1) + (1, 100000) float32: 37 GiB if folding evaluated it."""
    column = helper.make_tensor("col", TensorProto.FLOAT, [100_000, 1], np.zeros(100_000, np.float32).tobytes(), raw=True)
    row = helper.make_tensor("row", TensorProto.FLOAT, [1, 100_000], np.zeros(100_000, np.float32).tobytes(), raw=True)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [100_000, 100_000])
    nodes = [
        helper.make_node("Add", ["col", "row"], ["sum"], name="broadcast_add"),
        helper.make_node("Expand", ["col", "shape"], ["expanded"], name="broadcast_expand"),
        helper.make_node("Add", ["sum", "expanded"], ["out"], name="both"),
    ]
    return _with_output(nodes, [column, row, shape], "out")


def long_names(chars: int = 10_000_000) -> onnx.ModelProto:
    """A node name and a doc string of `chars` characters each, on a model that does not fuse."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    unsqueeze = helper.make_node("Unsqueeze", ["x", "axes"], ["u"], name="n" * chars, doc_string="d" * chars)
    expand_shape = helper.make_tensor("shape", TensorProto.INT64, [2], [4, 3])
    expand = helper.make_node("Expand", ["u", "shape"], ["y"], name="expand")
    graph = helper.make_graph([unsqueeze, expand], "g", [x], [y], [axes, expand_shape], doc_string="d" * chars)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def many_nodes(count: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Relu", [f"v{i}" if i else "x"], [f"v{i + 1}"]) for i in range(count)]
    y = helper.make_tensor_value_info(f"v{count}", TensorProto.FLOAT, [2])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
