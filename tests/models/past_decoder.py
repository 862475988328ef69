"""A one-layer decoder with a key/value past, its inputs named and shaped as Hugging Face Optimum
exports them: the shapes the service's synthesized feeds must fill (service/adapters/engines/feeds.py).

    input_ids                [batch_size, sequence_length]
    attention_mask           [batch_size, past_sequence_length + sequence_length]
    position_ids             [batch_size, sequence_length]
    past_key_values.0.key    [batch_size, heads, past_sequence_length, head]   (and .value)
    use_cache_branch         [1] bool, with merged=True (Optimum's decoder_model_merged.onnx)

The new keys and values are concatenated onto the past (the present outputs), queries see keys up to
their own position counted after the past (a causal triangle shifted by the past's length) and no
padded key. merged=True takes the past through an If: true passes it, false drops it, as the merged
decoder's two branches do. Built here so the test needs no export; random weights, no training.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCABULARY, POSITIONS, HIDDEN, HEADS = 50, 32, 8, 2
HEAD = HIDDEN // HEADS


def past_decoder(*, merged: bool = False, mask_length: str = "past_sequence_length + sequence_length") -> onnx.ModelProto:
    rng = np.random.default_rng(21)
    inits = []

    def init(name: str, array) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    for name, shape in (("wte", (VOCABULARY, HIDDEN)), ("wpe", (POSITIONS, HIDDEN)), ("w_q", (HIDDEN, HIDDEN)),
                        ("w_k", (HIDDEN, HIDDEN)), ("w_v", (HIDDEN, HIDDEN)), ("w_lm", (HIDDEN, VOCABULARY))):
        init(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))
    init("heads_shape", np.array([0, 0, HEADS, HEAD], np.int64))
    init("merge_shape", np.array([0, 0, HIDDEN], np.int64))
    init("axes_12", np.array([1, 2], np.int64))
    if merged:
        init("axis_2", np.array([2], np.int64))
        init("zero_1d", np.array([0], np.int64))
    init("scale", np.array(1 / np.sqrt(HEAD), np.float32))
    init("one_f", np.array(1.0, np.float32))
    init("fill", np.array(-10000.0, np.float32))

    nodes = [
        helper.make_node("Gather", ["wte", "input_ids"], ["tokens"]),
        helper.make_node("Gather", ["wpe", "position_ids"], ["places"]),
        helper.make_node("Add", ["tokens", "places"], ["x"]),
    ]
    for p in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w_{p}"], [f"{p}_flat"]),
            helper.make_node("Reshape", [f"{p}_flat", "heads_shape"], [f"{p}_4d"]),
            helper.make_node("Transpose", [f"{p}_4d"], [f"{p}_new"], perm=[0, 2, 1, 3]),
        ]
    past = {}
    for part in ("key", "value"):
        name = f"past_key_values.0.{part}"
        if merged:
            kept = helper.make_graph([helper.make_node("Identity", [name], [f"kept_{part}"])], f"use_{part}", [],
                                     [helper.make_tensor_value_info(f"kept_{part}", TensorProto.FLOAT, None)])
            dropped = helper.make_graph([helper.make_node("Slice", [name, "zero_1d", "zero_1d", "axis_2"], [f"dropped_{part}"])],
                                        f"drop_{part}", [],
                                        [helper.make_tensor_value_info(f"dropped_{part}", TensorProto.FLOAT, None)])
            nodes.append(helper.make_node("If", ["use_cache_branch"], [f"cache_{part}"], then_branch=kept, else_branch=dropped))
            past[part] = f"cache_{part}"
        else:
            past[part] = name
    nodes += [
        helper.make_node("Concat", [past["key"], "k_new"], ["present.0.key"], axis=2),
        helper.make_node("Concat", [past["value"], "v_new"], ["present.0.value"], axis=2),
        helper.make_node("Transpose", ["present.0.key"], ["key_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_new", "key_t"], ["scores_raw"]),
        helper.make_node("Mul", ["scores_raw", "scale"], ["scores"]),
        # Causal over past + new: query i (at past + i) sees keys 0 … past + i.
        helper.make_node("Shape", ["scores"], ["scores_shape"], start=2),
        helper.make_node("ConstantOfShape", ["scores_shape"], ["ones"], value=helper.make_tensor("", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("Shape", ["scores"], ["total"], start=3, end=4),
        helper.make_node("Shape", ["scores"], ["new"], start=2, end=3),
        helper.make_node("Sub", ["total", "new"], ["past_length_1d"]),
        helper.make_node("Squeeze", ["past_length_1d"], ["past_length"]),
        helper.make_node("Trilu", ["ones", "past_length"], ["causal"], upper=0),
        # Padding: [B, T] -> [B, 1, 1, T], times the causal [S, T].
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axes_12"], ["mask_4d"]),
        helper.make_node("Mul", ["mask_4d", "causal"], ["allowed"]),
        helper.make_node("Sub", ["one_f", "allowed"], ["blocked"]),
        helper.make_node("Mul", ["blocked", "fill"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "present.0.value"], ["context_4d"]),
        helper.make_node("Transpose", ["context_4d"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merge_shape"], ["context"]),
        helper.make_node("Add", ["x", "context"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "w_lm"], ["logits"]),
    ]
    cache = ["batch_size", HEADS, "past_sequence_length", HEAD]
    present = ["batch_size", HEADS, "past_sequence_length + sequence_length", HEAD]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", mask_length]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, cache),
    ]
    if merged:
        inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", VOCABULARY]),
        helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, present),
        helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, present),
    ]
    graph = helper.make_graph(nodes, "past_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model
