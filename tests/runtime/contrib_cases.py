"""What the contrib kernels' tests share: one-node models of an onnxruntime contrib op, run by
onnxruntime (the oracle, optimizations off) and by our kernel found through the registry, and
the inputs the attention and embedding cases build. fp32 tolerances rtol 1e-3, atol 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper

from runtime.kernels.registry import find_kernel

MS = "com.microsoft"
ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-3, 1e-4
OPSETS = {"": 17, MS: 1}
F, I32 = TensorProto.FLOAT, TensorProto.INT32
SKIP_OUTPUTS = [("Y", F), ("mean", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]
NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}


def one_node_model(op_type, inputs, outputs, domain=MS, **attrs):
    """A model of one node; `inputs` maps name -> array or None (omitted optional input, name "")."""
    input_names = [name if value is not None else "" for name, value in inputs.items()]
    while input_names and input_names[-1] == "":
        input_names.pop()
    node = helper.make_node(op_type, input_names, [name or "" for name, _ in outputs], domain=domain, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(name, NP_TO_ONNX[value.dtype], value.shape)
        for name, value in inputs.items()
        if value is not None
    ]
    graph_outputs = [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs if name]
    graph = helper.make_graph([node], "one_node", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid(d, v) for d, v in OPSETS.items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_ort(model, inputs):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {name: value for name, value in inputs.items() if value is not None}
    return session.run(None, feeds)


def run_ours(model, inputs):
    node = ir.from_proto(model).graph[0]
    kernel_class = find_kernel(node.domain, node.op_type, OPSETS[node.domain])
    assert kernel_class is not None, f"no kernel registered for {node.domain}.{node.op_type}"
    kernel = kernel_class(node, OPSETS[node.domain])
    args = [inputs[value.name] if value is not None and value.name else None for value in node.inputs]
    results = kernel.run(*args)
    return [result for result, value in zip(results, node.outputs, strict=False) if value.name]


def check(op_type, inputs, outputs=(("Y", TensorProto.FLOAT),), domain=MS, rtol=RTOL, atol=ATOL, **attrs):
    """Run both and compare every requested output; returns ours for extra assertions."""
    model = one_node_model(op_type, inputs, list(outputs), domain=domain, **attrs)
    expected = run_ort(model, inputs)
    ours = run_ours(model, inputs)
    assert len(ours) == len(expected)
    for name, want, got in zip([n for n, _ in outputs if n], expected, ours, strict=True):
        got = np.asarray(got)
        assert got.dtype == want.dtype, f"{op_type} output {name}: dtype {got.dtype}, ORT {want.dtype}"
        assert got.shape == want.shape, f"{op_type} output {name}: shape {got.shape}, ORT {want.shape}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{op_type} output {name}")
    return ours


def rand(*shape, scale=1.0, seed=0):
    return (np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale).astype(np.float32)



def embed_inputs(mask=True, segment=True, position_ids_shape=None, batch=2, seq=5, hidden=8, vocab=20):
    rng = np.random.default_rng(7)
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
        "segment_ids": rng.integers(0, 2, (batch, seq)).astype(np.int32) if segment else None,
        "word_embedding": rand(vocab, hidden),
        "position_embedding": rand(16, hidden, seed=1),
        "segment_embedding": rand(2, hidden, seed=2) if segment else None,
        "gamma": rand(hidden, seed=3),
        "beta": rand(hidden, seed=4),
        "mask": np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.int32) if mask else None,
        "position_ids": (
            rng.integers(0, 16, position_ids_shape).astype(np.int32) if position_ids_shape else None
        ),
    }



BATCH, SEQ, HIDDEN, HEADS = 2, 6, 16, 4


def masks(batch=BATCH, seq=SEQ, past=0):
    """Every mask_index format ORT's CPU Attention takes, keyed by a readable name."""
    total = past + seq
    lengths = np.array([total - 2, total], np.int32)
    raw = (np.arange(total)[None, :] < lengths[:, None]).astype(np.int32)
    raw[1, 1] = 0  # a hole, which key lengths can't express
    three_d = np.repeat(raw[:, None, :], seq, axis=1)
    three_d[0, 0, :] = 0
    three_d[0, 0, 0] = 1
    return {
        "none": None,
        "1d_lengths": lengths,
        "1d_end_start": np.array([total - 1, total, 1, 2], np.int32),
        "2d_raw": raw,
        "2d_dummy": np.ones((batch, 1), np.int32),
        "3d": three_d.astype(np.int32),
    }



KV_SEQ = 5


def mha_inputs(layout, with_bias=True, mask=None, attention_bias=False, past=False):
    head = HIDDEN // HEADS
    query = rand(BATCH, SEQ, HIDDEN)
    if layout == "3d":
        key, value = rand(BATCH, KV_SEQ, HIDDEN, seed=1), rand(BATCH, KV_SEQ, HIDDEN, seed=2)
    elif layout == "bnsh":
        key, value = rand(BATCH, HEADS, KV_SEQ, head, seed=1), rand(BATCH, HEADS, KV_SEQ, head, seed=2)
    else:  # packed KV
        key, value = rand(BATCH, KV_SEQ, HEADS, 2, head, seed=1), None
    total = KV_SEQ + (3 if past else 0)
    return {
        "query": query,
        "key": key,
        "value": value,
        "bias": rand(3 * HIDDEN, seed=3) if with_bias else None,
        "key_padding_mask": mask,
        "attention_bias": rand(BATCH, HEADS, SEQ, total, seed=4) if attention_bias else None,
        "past_key": rand(BATCH, HEADS, 3, head, seed=5) if past else None,
        "past_value": rand(BATCH, HEADS, 3, head, seed=6) if past else None,
    }


# Attention's cases for the paths that read heads in place (MKL's and oneDNN's).
ATTENTION_PATH_CASES = {
    "2d_mask": dict(mask="2d_raw"),
    "1d_lengths_causal": dict(mask="1d_lengths", unidirectional=1),
    "3d_mask": dict(mask="3d"),
    "no_bias": dict(mask="2d_raw", bias=False),
    "qkv_hidden_sizes": dict(mask="2d_raw", dv=8),
    "scale": dict(mask="none", scale=0.3),
    "bias_per_head": dict(mask="none", attention_bias=(1, HEADS, SEQ, SEQ)),
    "bias_per_batch_and_mask": dict(mask="2d_raw", attention_bias=(BATCH, 1, SEQ, SEQ)),
    "bias_full_and_causal": dict(
        mask="1d_lengths", attention_bias=(BATCH, HEADS, SEQ, SEQ), unidirectional=1
    ),
}
