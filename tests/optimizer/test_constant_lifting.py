"""ConstantFolding's direct path for Constant nodes (`lift_constant`) against its general path.

The direct path exists for speed only: whatever it handles, the optimized model, the report's
counts and the near misses must be the general path's, byte for byte. Each test optimizes the same
model twice, once with `lift_constant` declining every node (so the general path folds them all).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from optimizer.fusions import constant_folding

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])


def _model(nodes, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "constants", [X], outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _optimized(model: onnx.ModelProto, level: str, monkeypatch, direct: bool) -> tuple[bytes, dict, list, list, int]:
    """Serialized result, each rule's count, the near misses, the initializers marked as folded, and
    how many Constants the direct path took."""
    taken = []
    lift = constant_folding.lift_constant

    def counting(graph, node, lifted):
        handled = direct and lift(graph, node, lifted)
        taken.extend([node.name] * handled)
        return handled

    with monkeypatch.context() as patch:
        patch.setattr(constant_folding, "lift_constant", counting)
        result = optimize(model, level=level)
    report = result.report
    fired = {name: stats.fired for name, stats in report.rules.items()}
    misses = [(m.rule, m.anchor, m.step, m.reason) for m in report.near_misses]
    # The mark that lets ConstantFolding sweep its initializers once a later rule drops their readers.
    folded = sorted(v.name for v in result.model.graph.initializers.values() if v.meta.get(constant_folding.FOLDED_META_KEY))
    return ir.to_proto(result.model).SerializeToString(), fired, misses, folded, len(taken)


def _assert_same_both_ways(model: onnx.ModelProto, monkeypatch, lifted: int) -> None:
    for level in ("basic", "all"):
        direct = _optimized(model, level, monkeypatch, direct=True)
        general = _optimized(model, level, monkeypatch, direct=False)
        assert direct[4] == lifted, f"the direct path took {direct[4]} Constants at {level}, not {lifted}"
        assert general[4] == 0
        assert direct[:4] == general[:4]


def _add(name: str, constant: str) -> tuple[onnx.NodeProto, onnx.ValueInfoProto]:
    """Add(x, constant) into a graph output of its own: a reader the folder leaves in place."""
    output = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    return helper.make_node("Add", ["x", constant], [name], name=f"/add_{name}"), output


def test_every_plain_attribute_kind_gives_the_general_paths_model(monkeypatch):
    constants = {
        "tensor": dict(value=numpy_helper.from_array(np.arange(3, dtype=np.float32))),
        "scalar_tensor": dict(value=numpy_helper.from_array(np.array(2.5, dtype=np.float32))),
        "typed_data": dict(value=helper.make_tensor("t", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])),  # float_data
        "bf16": dict(value=numpy_helper.from_array(np.array([1, 2, 3], ml_dtypes.bfloat16))),
        "value_float": dict(value_float=0.5),
        "value_floats": dict(value_floats=[1.0, 2.0, 3.0]),
        "value_int": dict(value_int=4),
        "value_ints": dict(value_ints=[1, 2, 3]),
    }
    nodes, outputs = [], []
    for name, attributes in constants.items():
        nodes.append(helper.make_node("Constant", [], [f"c_{name}"], name=f"/{name}", **attributes))
        source = f"c_{name}"
        if "int" in name or name == "bf16":
            nodes.append(helper.make_node("Cast", [source], [f"f_{name}"], name=f"/cast_{name}", to=TensorProto.FLOAT))
            source = f"f_{name}"
        node, output = _add(name, source)
        nodes.append(node)
        outputs.append(output)
    # Read twice (one initializer, two readers) and not at all (removed, no initializer).
    nodes.append(helper.make_node("Mul", ["x", "c_tensor"], ["twice"], name="/mul"))
    outputs.append(helper.make_tensor_value_info("twice", TensorProto.FLOAT, None))
    nodes.append(helper.make_node("Constant", [], ["unused"], name="/unused", value_ints=[7]))
    _assert_same_both_ways(_model(nodes, outputs), monkeypatch, lifted=len(constants) + 1)


def test_constants_the_general_path_decides_are_left_to_it(monkeypatch):
    nodes = [
        # a graph output stays a computed value: not folded at all
        helper.make_node("Constant", [], ["out"], name="/out", value_floats=[1.0, 2.0, 3.0]),
        # strings are not evaluated: not folded (onnx-ir does not load a sparse_value at all)
        helper.make_node("Constant", [], ["s"], name="/strings", value_strings=["a", "b"]),
        helper.make_node("Constant", [], ["t"], name="/string", value_string="c"),
        helper.make_node("Unsqueeze", ["t", "zero"], ["t1"], name="/unsqueeze_string"),
        helper.make_node("Concat", ["s", "t1"], ["s_out"], name="/concat_strings", axis=0),
        # above the folding budget: left as a node
        helper.make_node("Constant", [], ["huge"], name="/huge", value=numpy_helper.from_array(
            np.zeros(constant_folding.MAX_FOLDED_ELEMENTS + 1, np.float32))),
        helper.make_node("ReduceSum", ["huge"], ["total"], name="/sum", keepdims=0),
        # a plain one beside them, so that the comparison covers a mixed graph
        helper.make_node("Constant", [], ["plain"], name="/plain", value_float=1.0),
        helper.make_node("Add", ["x", "plain"], ["z"], name="/add_plain"),
    ]
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, [3]),
        helper.make_tensor_value_info("s_out", TensorProto.STRING, [3]),
        helper.make_tensor_value_info("total", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
    ]
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    _assert_same_both_ways(_model(nodes, outputs, [zero]), monkeypatch, lifted=1)


def test_constant_named_like_an_initializer_fails_the_same_way(monkeypatch):
    """Two values under one name is an invalid model; both paths must end it alike."""
    nodes = [
        helper.make_node("Constant", [], ["w"], name="/w", value_float=1.0),
        helper.make_node("Add", ["x", "w"], ["y"], name="/add"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(np.ones(3, np.float32), "w")])
    outcomes = []
    for direct in (True, False):
        try:
            outcomes.append(_optimized(model, "basic", monkeypatch, direct)[:4])
        except Exception as error:  # noqa: BLE001 — compared below
            outcomes.append((type(error), str(error)))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("name", ["bert_torchscript_opset17.onnx", "gpt2_torchscript_opset14.onnx"])
def test_exported_fixtures_give_the_general_paths_model(monkeypatch, name):
    model = onnx.load(Path(__file__).parents[1] / "models" / name)
    constants = sum(node.op_type == "Constant" for node in model.graph.node)
    assert constants > 20
    _assert_same_both_ways(model, monkeypatch, lifted=constants)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8,
                                   np.uint64, np.uint32, np.uint16, np.uint8, np.bool_])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3)])
def test_raw_bytes_read_as_onnx_ir_reads_them(dtype, shape):
    array = (np.arange(int(np.prod(shape))) % 5).astype(dtype).reshape(shape)
    tensor = ir.serde.TensorProtoTensor(numpy_helper.from_array(array))
    read, read_dtype = constant_folding.plain_tensor_array(tensor)
    expected = tensor.numpy()
    assert read is not None and read_dtype == tensor.dtype
    assert read.dtype == expected.dtype and read.shape == expected.shape and read.tobytes() == expected.tobytes()


def test_typed_fields_are_left_to_onnx_ir():
    proto = helper.make_tensor("c", TensorProto.INT64, [2], [4, 5])  # int64_data, not raw bytes
    assert constant_folding.plain_tensor_array(ir.serde.TensorProtoTensor(proto)) == (None, None)
