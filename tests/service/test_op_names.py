"""service/domain/op_names.py: fused ops' names in tables."""

from __future__ import annotations

from service.domain.op_names import short_names


def test_domains_are_dropped_unless_two_ops_would_share_a_name():
    names = short_names(["com.microsoft.Attention", "Attention", "com.microsoft.BiasGelu", "LayerNormalization",
                         "com.microsoft.Gelu"])
    assert names == {"com.microsoft.Attention": "com.microsoft.Attention", "Attention": "ai.onnx.Attention",
                     "com.microsoft.BiasGelu": "BiasGelu", "LayerNormalization": "LayerNormalization",
                     "com.microsoft.Gelu": "Gelu"}
    assert short_names(["Gelu", "com.microsoft.Gelu"]) == {"Gelu": "ai.onnx.Gelu", "com.microsoft.Gelu": "com.microsoft.Gelu"}
    assert short_names(["ai.onnx.contrib.Passthrough"]) == {"ai.onnx.contrib.Passthrough": "ai.onnx.contrib.Passthrough"}
    assert short_names([]) == {}
