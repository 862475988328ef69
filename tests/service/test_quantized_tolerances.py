"""Quantized models as users make them for the CPU (onnxruntime.quantization.quantize_dynamic): the two
engines, and onnxruntime's fused graph against its unfused one, differ by a quantization step where an
activation lands on a rounding boundary, far past float32's tolerance; the numeric check compares such
tensors at their quantized precision (service/domain/tolerances.py), integers included, and a dropped
bias still fails. Real engines on the tiny BERT fixture, quantized here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from service.adapters.engines import run_engine
from service.adapters.engines.precision import TensorTolerances, narrowest_floats, reduction_depths
from service.adapters.measure import compare_outputs, measure
from service.domain.protocol import Protocol
from service.domain.tolerances import Tolerances

PROTOCOL = Protocol(runs=1, warmup=0, threads=1, sequence_length=16)
MODELS_DIR = Path(__file__).parents[1] / "models"


@pytest.fixture(scope="module")
def quantized_bert(tmp_path_factory) -> onnx.ModelProto:
    quantization = pytest.importorskip("onnxruntime.quantization")
    path = tmp_path_factory.mktemp("quantized") / "bert_dynamic.onnx"
    quantization.quantize_dynamic(MODELS_DIR / "bert_torchscript_opset17.onnx", path,
                                  weight_type=quantization.QuantType.QInt8)
    return onnx.load(path)


def _outputs(engine: str, model: onnx.ModelProto, tmp_path, name: str) -> dict[str, np.ndarray]:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return run_engine(engine, path, "disabled", runs=1, warmup=0, threads=1, sequence_length=16).outputs


def test_quantized_activations_carry_their_precision_through_integers_to_the_outputs(quantized_bert):
    graph = ir.serde.deserialize_graph(quantized_bert.graph)
    narrow = narrowest_floats(graph)
    quantizer = next(n for n in graph if n.op_type == "DynamicQuantizeLinear")
    product = next(n for n in graph if n.op_type == "MatMulInteger")
    assert narrow[quantizer.outputs[0].name] == "uint8 quantized"
    assert narrow[product.outputs[0].name] == "uint8 quantized"  # the int32 accumulator
    assert {narrow[v.name] for v in graph.outputs} == {"uint8 quantized"}
    judged = TensorTolerances(Tolerances(), narrow, reduction_depths(graph))
    accumulator = judged.of(product.outputs[0].name, "int32")
    assert accumulator is not None and accumulator.scaled and accumulator.rtol == 4 * 2**-8 * accumulator.depth**0.5
    shape = next(n for n in graph if n.op_type == "Shape")
    assert judged.of(shape.outputs[0].name, "int64") is None  # a shape stays exact
    # A float model keeps float32's tolerance throughout.
    plain = narrowest_floats(ir.serde.deserialize_graph(onnx.load(MODELS_DIR / "bert_torchscript_opset17.onnx").graph))
    assert set(plain.values()) == {"float32"}


def test_a_quantized_model_whose_engines_differ_by_a_quantization_step_passes(quantized_bert, tmp_path):
    path = tmp_path / "bert_dynamic.onnx"
    onnx.save(quantized_bert, path)
    ours, theirs = (_outputs(engine, quantized_bert, tmp_path, engine) for engine in ("fusionwatch", "onnxruntime"))
    # The false alarm this fixes: float32's tolerance fails the engines' difference.
    assert not compare_outputs(theirs, ours, Tolerances()).ok
    measured = measure(path, "onnxruntime", "disabled", PROTOCOL)  # onnxruntime against our engine
    assert measured.numeric_ok, measured.numeric_checks
    assert measured.max_abs_error > 0
    for engine in ("fusionwatch", "onnxruntime"):  # each engine's fusions against its unfused graph
        assert measure(path, engine, "all", PROTOCOL).numeric_ok, engine


def test_a_dropped_bias_after_the_last_quantization_fails(quantized_bert, tmp_path):
    # The engines differ by 0.05 of the bound here. A bias dropped deeper in a quantized model moves the
    # outputs by 0.1-0.8 of it and passes: correct engines differ by up to 0.5 of it on a quantized
    # BERT-base (docs/numerics.md, "Quantized models"), so no bound tighter than this one is safe.
    graph = ir.serde.deserialize_graph(quantized_bert.graph)
    narrow, depths = narrowest_floats(graph), reduction_depths(graph)
    ours = _outputs("fusionwatch", quantized_bert, tmp_path, "ours")
    assert compare_outputs(_outputs("onnxruntime", quantized_bert, tmp_path, "same"), ours, PROTOCOL.tolerances(),
                           narrow, depths).ok
    planted = onnx.ModelProto()
    planted.CopyFrom(quantized_bert)
    bias = next(t for t in planted.graph.initializer if t.name.endswith("pooler.dense.bias"))
    bias.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(onnx.numpy_helper.to_array(bias)), bias.name))
    found = compare_outputs(_outputs("onnxruntime", planted, tmp_path, "dropped"), ours, PROTOCOL.tolerances(), narrow, depths)
    assert not found.ok
    [failed] = found.failed_outputs
    assert failed.startswith("output 'pooler_output' (float32, computed from uint8 quantized, ")


def test_onnxruntimes_quantization_fusions_are_counted_and_their_loss_names_the_rule(quantized_bert, tmp_path):
    from service.domain.fusion_changes import count_changes

    path = tmp_path / "bert_dynamic.onnx"
    onnx.save(quantized_bert, path)
    fused = run_engine("onnxruntime", path, "extended", runs=1, warmup=0, threads=1, sequence_length=16).fusions
    assert fused["com.microsoft.DynamicQuantizeMatMul"] > 0 and fused["com.microsoft.MatMulIntegerToFloat"] > 0
    # An onnxruntime whose DynamicQuantizeMatMulFusion stopped firing: the drop is a regression of that rule.
    without = run_engine("onnxruntime", path, "extended", runs=1, warmup=0, threads=1, sequence_length=16,
                         disabled=["DynamicQuantizeMatMulFusion"]).fusions
    drops, _rises = count_changes(fused, without)
    assert [(d["op"], d["rule"], d["after"]) for d in drops if d["op"].endswith("DynamicQuantizeMatMul")] == [
        ("com.microsoft.DynamicQuantizeMatMul", "DynamicQuantizeMatMulFusion", 0)]
    # Our optimizer makes MatMulIntegerToFloat of every product, and no DynamicQuantizeMatMul.
    ours = run_engine("fusionwatch", path, "extended", runs=1, warmup=0, threads=1, sequence_length=16).fusions
    products = sum(n.op_type == "MatMulInteger" for n in quantized_bert.graph.node)
    assert ours["com.microsoft.MatMulIntegerToFloat"] == products and "com.microsoft.DynamicQuantizeMatMul" not in ours
