"""A model quantized as users quantize for the CPU (onnxruntime.quantization.quantize_dynamic) loses the
fusions that read float MatMuls and embedding Gathers; their near misses name the quantized product or
the dequantized lookup they found, so the alert says the quantization is why."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer import optimize

FIXTURE = Path(__file__).parents[1] / "models" / "bert_torchscript_opset17.onnx"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    quantization = pytest.importorskip("onnxruntime.quantization")  # a test-only model maker
    path = tmp_path_factory.mktemp("quantized") / "bert_dynamic.onnx"
    quantization.quantize_dynamic(FIXTURE, path, weight_type=quantization.QuantType.QInt8)
    return path


def test_near_misses_name_the_quantized_product_and_lookup(quantized):
    report = optimize(quantized, level="extended").report
    assert "com.microsoft.Attention" not in report.fusions and "com.microsoft.EmbedLayerNormalization" not in report.fusions
    reasons = {m.rule: m.reason for m in report.near_misses}
    # The product as MatMulIntegerToFloatFusion leaves it (fused from MatMulInteger, Cast, Mul, Add).
    assert "(found com.microsoft.MatMulIntegerToFloat '" in reasons["AttentionFusion"]
    assert "' (quantized; the fusions match float MatMul" in reasons["AttentionFusion"]
    assert "not quantized ones" in reasons["AttentionFusion"]
    assert "(quantized: it comes from DequantizeLinear '" in reasons["EmbedLayerNormFusion"]


def test_a_float_model_says_nothing_of_quantization():
    report = optimize(FIXTURE, level="extended").report
    assert not any("quantized" in m.reason for m in report.near_misses)
