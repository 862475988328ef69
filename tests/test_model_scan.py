"""tools/model_scan.py sorts a folder's models by what each engine made of them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]


def _scan_module():
    spec = importlib.util.spec_from_file_location("model_scan", REPO / "tools" / "model_scan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(path: Path, node: onnx.NodeProto, opset: int = 17) -> Path:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def test_each_model_lands_in_the_row_that_says_what_happened(tmp_path):
    scan = _scan_module()
    relu = _model(tmp_path / "relu.onnx", helper.make_node("Relu", ["x"], ["y"]))
    random = _model(tmp_path / "random.onnx", helper.make_node("RandomUniformLike", ["x"], ["y"], seed=1.0))
    nowhere = _model(tmp_path / "nowhere.onnx", helper.make_node("NoSuchOp", ["x"], ["y"], domain="nowhere"))
    assert scan.scan_one(relu, ["disabled", "all"]) == ("match", "")
    row, why = scan.scan_one(random, ["disabled"])
    assert row == "ours refuses" and "RandomUniformLike" in why
    row, why = scan.scan_one(nowhere, ["disabled"])
    assert row == "both refuse"
