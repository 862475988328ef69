"""MatMulIntegerToFloatFusion on what quantize_dynamic writes: every quantized product becomes one
com.microsoft.MatMulIntegerToFloat, our engine's fused graph computes bit for bit what the unfused one
does, and onnxruntime's kernel for the op agrees; anything else is a near miss that says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import optimize
from runtime import InferenceSession, SessionOptions

FIXTURE = Path(__file__).parents[1] / "models" / "bert_torchscript_opset17.onnx"
RNG = np.random.default_rng(21)


def _block(cast_to: int = TensorProto.FLOAT, bias: bool = True, per_column: bool = True) -> onnx.ModelProto:
    """x -> DynamicQuantizeLinear -> MatMulInteger(W int8) -> Cast -> Mul(x_scale * w_scale) [-> Add(bias)]."""
    width = 6
    weight = RNG.integers(-128, 128, (8, width)).astype(np.int8)
    w_scale = (RNG.random(width if per_column else ()) * 0.02 + 0.001).astype(np.float32)
    w_zero = np.zeros(width if per_column else (), np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zero"]),
        helper.make_node("MatMulInteger", ["x_q", "w", "x_zero", "w_zero"], ["acc"], name="product"),
        helper.make_node("Cast", ["acc"], ["acc_f"], to=cast_to),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["scales"]),
        helper.make_node("Mul", ["acc_f", "scales"] if cast_to == TensorProto.FLOAT else ["acc_f", "scales16"],
                         ["scaled"]),
    ]
    initializers = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(w_scale, "w_scale"),
                    numpy_helper.from_array(w_zero, "w_zero")]
    if cast_to != TensorProto.FLOAT:
        nodes.insert(4, helper.make_node("Cast", ["scales"], ["scales16"], to=cast_to))
    if bias:
        nodes.append(helper.make_node("Add", ["scaled", "b"], ["y"]))
        initializers.append(numpy_helper.from_array(RNG.standard_normal(width).astype(np.float32), "b"))
    out = "y" if bias else "scaled"
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                              [helper.make_tensor_value_info(out, cast_to, [3, width])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, level: str, x: np.ndarray) -> np.ndarray:
    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level)).run(None, {"x": x})[0]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("per_column", [True, False], ids=["per_column", "per_tensor"])
def test_the_fused_product_is_the_unfused_one_bit_for_bit(bias, per_column):
    model = _block(bias=bias, per_column=per_column)
    report = optimize(model, level="extended").report
    assert report.fusions == {"com.microsoft.MatMulIntegerToFloat": 1}
    assert report.ops_after == {"DynamicQuantizeLinear": 1, "com.microsoft.MatMulIntegerToFloat": 1}
    for _ in range(3):
        x = RNG.standard_normal((3, 8)).astype(np.float32)
        np.testing.assert_array_equal(_run(model, "extended", x), _run(model, "disabled", x))


def test_onnxruntimes_kernel_for_the_fused_op_agrees():
    ort = pytest.importorskip("onnxruntime")
    model = _block()
    fused = onnx.ModelProto()
    fused.CopyFrom(onnx.load_from_string(
        __import__("onnx_ir").serde.serialize_model(optimize(model, level="extended").model).SerializeToString()))
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs = ort.InferenceSession(fused.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(model, "extended", x), theirs, rtol=1e-5, atol=1e-6)


def test_a_product_cast_to_float16_is_a_near_miss_naming_the_cast():
    report = optimize(_block(cast_to=TensorProto.FLOAT16), level="extended").report
    assert "com.microsoft.MatMulIntegerToFloat" not in report.fusions
    [miss] = [m for m in report.near_misses if m.rule == "MatMulIntegerToFloatFusion"]
    assert miss.step == "cast" and "not one Cast to float" in miss.reason


def test_every_product_of_a_quantize_dynamic_bert_fuses(tmp_path):
    quantization = pytest.importorskip("onnxruntime.quantization")  # a test-only model maker
    path = tmp_path / "bert_dynamic.onnx"
    quantization.quantize_dynamic(FIXTURE, path, weight_type=quantization.QuantType.QInt8)
    products = sum(n.op_type == "MatMulInteger" for n in onnx.load(path).graph.node)
    report = optimize(path, level="extended").report
    assert report.fusions["com.microsoft.MatMulIntegerToFloat"] == products
    assert "MatMulInteger" not in report.ops_after
