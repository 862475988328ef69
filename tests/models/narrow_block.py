"""A float16 block as a transformer's head ends: MatMul + bias, LayerNormalization, Softmax, with the
normalized output also cast up to float32 and an ArgMax, for the numeric check's per-type tolerances
(tests/service/test_narrow_tolerances.py). Our executor and onnxruntime differ on it by an ulp or two."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 64
SEQUENCE = 16


def narrow_block(dtype: type = np.float16, *, bias_scale: float = 1.0) -> onnx.ModelProto:
    """`bias_scale` multiplies the MatMul's bias: 0 drops it, the error a planted-bug test wants."""
    rng = np.random.default_rng(7)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weight = (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN) * 4).astype(dtype)
    bias = (rng.standard_normal(HIDDEN) * bias_scale).astype(dtype)
    gamma = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(dtype)
    beta = (0.1 * rng.standard_normal(HIDDEN)).astype(dtype)
    nodes = [
        helper.make_node("MatMul", ["x", "weight"], ["projected"]),
        helper.make_node("Add", ["projected", "bias"], ["biased"]),
        helper.make_node("LayerNormalization", ["biased", "gamma", "beta"], ["logits"], axis=-1, epsilon=1e-5),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Cast", ["logits"], ["logits_fp32"], to=TensorProto.FLOAT),
        helper.make_node("ArgMax", ["biased"], ["top"], axis=-1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "narrow_block",
        [helper.make_tensor_value_info("x", elem, [1, SEQUENCE, HIDDEN])],
        [
            helper.make_tensor_value_info("logits", elem, [1, SEQUENCE, HIDDEN]),
            helper.make_tensor_value_info("probs", elem, [1, SEQUENCE, HIDDEN]),
            helper.make_tensor_value_info("logits_fp32", TensorProto.FLOAT, [1, SEQUENCE, HIDDEN]),
            helper.make_tensor_value_info("top", TensorProto.INT64, [1, SEQUENCE]),
        ],
        [numpy_helper.from_array(a, n) for a, n in ((weight, "weight"), (bias, "bias"), (gamma, "gamma"), (beta, "beta"))],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
