"""LayerNorm and RMSNorm as exporters decompose them, SkipLayerNorm, and BERT's embedding lookups."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.models.patterns.parts import scalar, vector

# LayerNorm / RMSNorm as exporters decompose them, a residual Add before a LayerNormalization,
# and BERT's embedding lookups. Every node of a builder is named "/ln/<Op>" (or "/emb/...") so
# near misses name a predictable anchor; inputs are float "x" (and "skip"), or int64 ids.

NORM_SHAPE = (2, 4, 16)


def _norm_model(nodes, inputs, outputs, initializers, *, opset, extra_outputs=()):
    """`inputs` maps name -> (elem_type, shape); outputs are float of unknown shape."""
    graph = helper.make_graph(
        nodes,
        "normalization",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in [*outputs, *extra_outputs]],
        list(initializers),
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


def _reduce_mean(x, out, name, axes, opset):
    """ReduceMean over `axes`: an attribute before opset 18, a constant input from 18 on."""
    if opset >= 18:
        axes_name = f"{name}/axes"
        node = helper.make_node("ReduceMean", [x, axes_name], [out], name=name)
        return [node], [numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name)]
    return [helper.make_node("ReduceMean", [x], [out], name=name, axes=list(axes))], []


def _variance_tail(x_centered, *, opset, axes, square, exponent, cast_exponent, epsilon, eps_const, divide, prefix):
    """square -> ReduceMean -> Add(eps) -> Sqrt -> Div | Reciprocal+Mul; returns (nodes, inits, normalized)."""
    nodes, inits = [], []
    if square == "mul":
        nodes.append(helper.make_node("Mul", [x_centered, x_centered], [f"{prefix}/Pow_output_0"], name=f"{prefix}/Mul_sq"))
    else:
        exponent_name = f"{prefix}/exponent"
        if cast_exponent:  # the exponent arrives as an int constant cast to float
            inits.append(numpy_helper.from_array(np.array(int(exponent), dtype=np.int64), f"{prefix}/exponent_int"))
            nodes.append(helper.make_node("Cast", [f"{prefix}/exponent_int"], [exponent_name], name=f"{prefix}/Cast_exp", to=TensorProto.FLOAT))
        else:
            inits.append(scalar(exponent_name, exponent))
        nodes.append(helper.make_node("Pow", [x_centered, exponent_name], [f"{prefix}/Pow_output_0"], name=f"{prefix}/Pow"))
    reduce_nodes, reduce_inits = _reduce_mean(f"{prefix}/Pow_output_0", f"{prefix}/ReduceMean_1_output_0", f"{prefix}/ReduceMean_1", axes, opset)
    nodes += reduce_nodes
    inits += reduce_inits
    if eps_const:
        inits.append(scalar(f"{prefix}/eps", epsilon))
    nodes += [
        helper.make_node("Add", [f"{prefix}/ReduceMean_1_output_0", f"{prefix}/eps"], [f"{prefix}/Add_output_0"], name=f"{prefix}/Add"),
        helper.make_node("Sqrt", [f"{prefix}/Add_output_0"], [f"{prefix}/Sqrt_output_0"], name=f"{prefix}/Sqrt"),
    ]
    if divide == "div":
        nodes.append(helper.make_node("Div", [x_centered, f"{prefix}/Sqrt_output_0"], [f"{prefix}/Div_output_0"], name=f"{prefix}/Div"))
    elif divide == "div_one":  # torch.rsqrt through TorchScript: Div(1, std), then Mul
        inits.append(scalar(f"{prefix}/one", 1.0))
        nodes += [
            helper.make_node("Div", [f"{prefix}/one", f"{prefix}/Sqrt_output_0"], [f"{prefix}/Reciprocal_output_0"], name=f"{prefix}/Div"),
            helper.make_node("Mul", [x_centered, f"{prefix}/Reciprocal_output_0"], [f"{prefix}/Div_output_0"], name=f"{prefix}/Mul_rsqrt"),
        ]
    else:
        nodes += [
            helper.make_node("Reciprocal", [f"{prefix}/Sqrt_output_0"], [f"{prefix}/Reciprocal_output_0"], name=f"{prefix}/Reciprocal"),
            helper.make_node("Mul", [x_centered, f"{prefix}/Reciprocal_output_0"], [f"{prefix}/Div_output_0"], name=f"{prefix}/Mul_rsqrt"),
        ]
    return nodes, inits, f"{prefix}/Div_output_0"


def layer_norm(
    *,
    opset=14,
    square="pow",
    exponent=2.0,
    cast_exponent=False,
    divide="div",
    axes=(-1,),
    epsilon=1e-5,
    eps_const=True,
    duplicate_sub=False,
    cast_after_sub=None,
    gamma_shape=(16,),
    extra_outputs=(),
    extra_consumer=None,
):
    """x -> ReduceMean -> Sub -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) -> Add(beta) -> y.

    `eps_const=False` makes the epsilon a graph input; `cast_after_sub` inserts Cast(to=...)
    between Sub and Pow; `extra_consumer` names a value that an extra Neg also reads.
    """
    p = "/ln"
    nodes, inits = _reduce_mean("x", f"{p}/ReduceMean_output_0", f"{p}/ReduceMean", axes, opset)
    nodes.append(helper.make_node("Sub", ["x", f"{p}/ReduceMean_output_0"], [f"{p}/Sub_output_0"], name=f"{p}/Sub"))
    centered = f"{p}/Sub_output_0"
    divided = centered
    if duplicate_sub:  # older PyTorch: a second Sub feeds the Div
        nodes.append(helper.make_node("Sub", ["x", f"{p}/ReduceMean_output_0"], [f"{p}/Sub_1_output_0"], name=f"{p}/Sub_1"))
        divided = f"{p}/Sub_1_output_0"
    squared = centered
    if cast_after_sub is not None:
        nodes.append(helper.make_node("Cast", [centered], [f"{p}/Cast_output_0"], name=f"{p}/Cast", to=cast_after_sub))
        squared = f"{p}/Cast_output_0"
    tail, tail_inits, normalized = _variance_tail(
        squared, opset=opset, axes=axes, square=square, exponent=exponent, cast_exponent=cast_exponent,
        epsilon=epsilon, eps_const=eps_const, divide=divide, prefix=p,
    )
    if divided != squared:  # the Div reads the other copy of x - mean
        for node in tail:
            if node.op_type in ("Div", "Mul") and node.input[0] == squared and node.input[1] != squared:
                node.input[0] = divided
    nodes += tail
    inits += tail_inits
    nodes += [
        helper.make_node("Mul", [normalized, f"{p}/gamma"], [f"{p}/Mul_output_0"], name=f"{p}/Mul"),
        helper.make_node("Add", [f"{p}/Mul_output_0", f"{p}/beta"], ["y"], name=f"{p}/Add_1"),
    ]
    inits += [vector(f"{p}/gamma", gamma_shape, seed=1), vector(f"{p}/beta", gamma_shape, seed=2)]
    outputs = ["y"]
    if extra_consumer is not None:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["extra"], name=f"{p}/Neg"))
        outputs.append("extra")
    inputs = {"x": (TensorProto.FLOAT, list(NORM_SHAPE))}
    if not eps_const:
        inputs[f"{p}/eps"] = (TensorProto.FLOAT, [])
    return _norm_model(nodes, inputs, outputs, inits, opset=opset, extra_outputs=extra_outputs)


def rms_norm(*, opset=14, square="pow", exponent=2.0, divide="reciprocal", axes=(-1,), epsilon=1e-6,
             gamma_first=True, extra_outputs=(), extra_consumer=None, cast=False):
    """Llama's RMSNorm: x -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x) -> Mul(gamma) -> y.

    cast: x.to(float32) first, a no-op Cast on float32 data (transformers' LlamaRMSNorm)."""
    p = "/ln"
    nodes = []
    source = "x"
    if cast:
        nodes.append(helper.make_node("Cast", ["x"], [f"{p}/x_f"], name=f"{p}/Cast", to=TensorProto.FLOAT))
        source = f"{p}/x_f"
    tail_nodes, inits, normalized = _variance_tail(
        source, opset=opset, axes=axes, square=square, exponent=exponent, cast_exponent=False,
        epsilon=epsilon, eps_const=True, divide=divide, prefix=p,
    )
    nodes += tail_nodes
    gamma_inputs = [f"{p}/gamma", normalized] if gamma_first else [normalized, f"{p}/gamma"]
    nodes.append(helper.make_node("Mul", gamma_inputs, ["y"], name=f"{p}/Mul"))
    inits.append(vector(f"{p}/gamma", (16,), seed=3))
    outputs = ["y"]
    if extra_consumer is not None:
        nodes.append(helper.make_node("Neg", [extra_consumer], ["extra"], name=f"{p}/Neg"))
        outputs.append("extra")
    return _norm_model(nodes, {"x": (TensorProto.FLOAT, list(NORM_SHAPE))}, outputs, inits, opset=opset,
                       extra_outputs=extra_outputs)


def skip_layer_norm(*, bias=None, sum_consumed=False, x_shape=NORM_SHAPE, skip_shape=NORM_SHAPE, axis=-1,
                    epsilon=1e-5, opset=17, extra_outputs=(), norm="LayerNormalization"):
    """x + skip [+ bias] -> LayerNormalization('/ln'): `bias` is None, "x" (Add(x, b) first) or "skip".

    norm: "LayerNormalization", or an RMS norm in either form: "SimplifiedLayerNormalization"
    (onnxruntime's, ONNX domain) or "RMSNormalization" (opset 23); those take no beta.

    `sum_consumed` adds the next residual: Add(ln_out, residual sum), as in GPT-2's pre-LN blocks.
    """
    nodes, inits = [], [vector("/ln/gamma", (16,), seed=4), vector("/ln/beta", (16,), seed=5)]
    x, skip = "x", "skip"
    if bias is not None:
        inits.append(vector("/ln/bias", (16,), seed=6))
        biased = {"x": x, "skip": skip}[bias]
        nodes.append(helper.make_node("Add", ["/ln/bias", biased], ["/ln/biased"], name="/ln/BiasAdd"))
        x, skip = ("/ln/biased", skip) if bias == "x" else (x, "/ln/biased")
    nodes += [
        helper.make_node("Add", [x, skip], ["/ln/residual"], name="/ln/ResidualAdd"),
        helper.make_node(norm, ["/ln/residual", "/ln/gamma", "/ln/beta"][:3 if norm == "LayerNormalization" else 2],
                         ["y"], name="/ln", axis=axis, epsilon=epsilon),
    ]
    outputs = ["y"]
    if sum_consumed:
        nodes.append(helper.make_node("Add", ["y", "/ln/residual"], ["next"], name="/next/ResidualAdd"))
        outputs = ["next"]
    inputs = {"x": (TensorProto.FLOAT, list(x_shape)), "skip": (TensorProto.FLOAT, list(skip_shape))}
    return _norm_model(nodes, inputs, outputs, inits, opset=opset, extra_outputs=extra_outputs)


def decomposed_skip_layer_norm(*, opset=14):
    """Residual Add -> decomposed LayerNorm (opset 14): LayerNormFusion first, then SkipLayerNormFusion."""
    model = layer_norm(opset=opset)
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == "x":
                node.input[i] = "/ln/residual"
    graph.node.insert(0, helper.make_node("Add", ["x", "skip"], ["/ln/residual"], name="/ln/ResidualAdd"))
    graph.input.append(helper.make_tensor_value_info("skip", TensorProto.FLOAT, list(NORM_SHAPE)))
    return model


EMB_BATCH, EMB_SEQ, EMB_HIDDEN, EMB_VOCAB, EMB_POSITIONS = 2, 6, 16, 30, 12


def embed_layer_norm(*, segment=True, position="slice", attention=True, sum_consumed=False, gather_axis=0,
                     opset=17, rotary=None):
    """BERT's embeddings: word + segment + position lookups -> Add -> Add -> LayerNormalization -> Attention.

    `rotary` (with attention="onnx"): None, "onnx" or "com.microsoft": Q and K pass a RotaryEmbedding.
    `segment`: True (a token_type_ids input), False (DistilBERT) or "buffer" (BERT called without
    token_type_ids: all-zero ids from a buffer, picked by position and expanded to the batch).
    `position`: "slice" (today's exporters: Slice of a [1, P] position_ids buffer to the
    sequence length of input_ids), "constant" (a [1, S] constant 0..S-1), "range" (Range(0, seq)
    expanded to the shape of input_ids, as 2020-era exports built them), "nonzero" (the same count as
    NonZero(ConstantOfShape([S], 1)), PyTorch's arange below opset 11; "nonzero_of_zeros" with
    ConstantOfShape's default 0, which counts nothing), or "input" (a third
    graph input, so position and segment ids can't be told apart). The Attention is
    com.microsoft.Attention, as AttentionFusion leaves it.
    """
    rng = np.random.default_rng(7)
    table = lambda rows, name: numpy_helper.from_array(rng.standard_normal((rows, EMB_HIDDEN)).astype(np.float32), name)  # noqa: E731
    inits = [table(EMB_VOCAB, "/emb/word"), table(EMB_POSITIONS, "/emb/position"),
             vector("/emb/ln/gamma", (EMB_HIDDEN,), seed=8), vector("/emb/ln/beta", (EMB_HIDDEN,), seed=9)]
    ids_type = (TensorProto.INT64, ["batch", "seq"])
    inputs = {"input_ids": ids_type}
    nodes = [helper.make_node("Gather", ["/emb/word", "input_ids"], ["/emb/word_out"], name="/emb/word/Gather", axis=gather_axis)]
    if position == "slice":
        inits += [
            numpy_helper.from_array(np.arange(EMB_POSITIONS, dtype=np.int64).reshape(1, -1), "/emb/position_ids"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "/emb/zero"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "/emb/one"),
        ]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["/emb/shape"], name="/emb/Shape", start=1, end=2),
            helper.make_node("Slice", ["/emb/position_ids", "/emb/zero", "/emb/shape", "/emb/one"], ["/emb/pos_ids"], name="/emb/Slice"),
        ]
        position_ids = "/emb/pos_ids"
    elif position == "range":  # 2020-era exports: Range(0, seq) expanded to the ids' shape
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("/emb/r_start", 0), ("/emb/r_step", 1), ("/emb/r_one", 1))]
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "/emb/r_axes"))
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["/emb/ids_shape_r"], name="/emb/r/Shape"),
            helper.make_node("Gather", ["/emb/ids_shape_r", "/emb/r_one"], ["/emb/seq_len"], name="/emb/r/Gather", axis=0),
            helper.make_node("Range", ["/emb/r_start", "/emb/seq_len", "/emb/r_step"], ["/emb/range"], name="/emb/r/Range"),
            helper.make_node("Unsqueeze", ["/emb/range", "/emb/r_axes"], ["/emb/range_row"], name="/emb/r/Unsqueeze"),
            helper.make_node("Expand", ["/emb/range_row", "/emb/ids_shape_r"], ["/emb/pos_ids"], name="/emb/r/Expand"),
        ]
        position_ids = "/emb/pos_ids"
    elif position in ("nonzero", "nonzero_of_zeros"):  # PyTorch's arange below opset 11: NonZero of S ones
        fill = numpy_helper.from_array(np.array([1 if position == "nonzero" else 0], np.int64), "value")
        inits += [numpy_helper.from_array(np.array(1, np.int64), "/emb/n_one"),
                  numpy_helper.from_array(np.array([0], np.int64), "/emb/n_axes0"),
                  numpy_helper.from_array(np.array([1], np.int64), "/emb/n_axes1")]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["/emb/ids_shape_n"], name="/emb/n/Shape"),
            helper.make_node("Gather", ["/emb/ids_shape_n", "/emb/n_one"], ["/emb/n_seq"], name="/emb/n/Gather", axis=0),
            helper.make_node("Unsqueeze", ["/emb/n_seq", "/emb/n_axes0"], ["/emb/n_seq_1d"], name="/emb/n/Unsqueeze"),
            helper.make_node("ConstantOfShape", ["/emb/n_seq_1d"], ["/emb/n_ones"], name="/emb/n/ConstantOfShape",
                             value=fill),
            helper.make_node("NonZero", ["/emb/n_ones"], ["/emb/n_nonzero"], name="/emb/n/NonZero"),
            helper.make_node("Transpose", ["/emb/n_nonzero"], ["/emb/n_t"], name="/emb/n/Transpose", perm=[1, 0]),
            helper.make_node("Squeeze", ["/emb/n_t", "/emb/n_axes1"], ["/emb/n_range"], name="/emb/n/Squeeze"),
            helper.make_node("Unsqueeze", ["/emb/n_range", "/emb/n_axes0"], ["/emb/n_row"], name="/emb/n/Unsqueeze_1"),
            helper.make_node("Expand", ["/emb/n_row", "/emb/ids_shape_n"], ["/emb/pos_ids"], name="/emb/n/Expand"),
        ]
        position_ids = "/emb/pos_ids"
    elif position == "constant":
        inits.append(numpy_helper.from_array(np.arange(EMB_SEQ, dtype=np.int64).reshape(1, -1), "/emb/pos_ids"))
        inputs["input_ids"] = (TensorProto.INT64, [EMB_BATCH, EMB_SEQ])
        ids_type = (TensorProto.INT64, [EMB_BATCH, EMB_SEQ])
        position_ids = "/emb/pos_ids"
    else:
        inputs["position_ids"] = (TensorProto.INT64, [1, "seq"])
        position_ids = "position_ids"
    nodes.append(helper.make_node("Gather", ["/emb/position", position_ids], ["/emb/pos_out"], name="/emb/position/Gather"))
    first_sum = "/emb/word_out"
    if segment:
        inits.append(table(2, "/emb/segment"))
        segment_ids = "token_type_ids"
        if segment == "buffer":  # called without token_type_ids: a zeros buffer expanded to the batch
            inits.append(numpy_helper.from_array(np.zeros((1, EMB_POSITIONS), np.int64), "/emb/token_type_buffer"))
            nodes += [
                helper.make_node("Shape", ["input_ids"], ["/emb/ids_shape"], name="/emb/ids/Shape"),
                helper.make_node("GatherElements", ["/emb/token_type_buffer", position_ids], ["/emb/type_row"],
                                 name="/emb/type/GatherElements", axis=1),
                helper.make_node("Expand", ["/emb/type_row", "/emb/ids_shape"], ["/emb/type_ids"], name="/emb/type/Expand"),
            ]
            segment_ids = "/emb/type_ids"
        else:
            inputs["token_type_ids"] = ids_type
        nodes += [
            helper.make_node("Gather", ["/emb/segment", segment_ids], ["/emb/seg_out"], name="/emb/segment/Gather"),
            helper.make_node("Add", ["/emb/word_out", "/emb/seg_out"], ["/emb/Add_output_0"], name="/emb/Add"),
        ]
        first_sum = "/emb/Add_output_0"
    nodes += [
        helper.make_node("Add", [first_sum, "/emb/pos_out"], ["/emb/Add_1_output_0"], name="/emb/Add_1"),
        helper.make_node("LayerNormalization", ["/emb/Add_1_output_0", "/emb/ln/gamma", "/emb/ln/beta"], ["/emb/ln_out"],
                         name="/emb/LayerNorm", axis=-1, epsilon=1e-12),
    ]
    outputs = ["/emb/ln_out"]
    if attention == "onnx":  # the standard Attention of opset 23 on 3-D projections of the LayerNorm output
        for p in "qkv":
            inits.append(numpy_helper.from_array(rng.standard_normal((EMB_HIDDEN, EMB_HIDDEN)).astype(np.float32) * 0.2,
                                                 f"/attn/{p}_weight"))
            nodes.append(helper.make_node("MatMul", ["/emb/ln_out", f"/attn/{p}_weight"], [f"/attn/{p}"], name=f"/attn/{p}/MatMul"))
        q = k = None
        if rotary:  # Q and K rotated by RoPE in either form: ONNX's (opset 23) or com.microsoft's
            angles = np.arange(EMB_POSITIONS)[:, None] * (1.0 / 10000 ** (np.arange(0, 8, 2) / 8))[None, :]
            inits += [numpy_helper.from_array(np.cos(angles).astype(np.float32), "/rope/cos"),
                      numpy_helper.from_array(np.sin(angles).astype(np.float32), "/rope/sin")]
            inputs["position_ids"] = (TensorProto.INT64, ["batch", "seq"])
            for p in "qk":
                if rotary == "onnx":
                    rope_inputs, domain = [f"/attn/{p}", "/rope/cos", "/rope/sin", "position_ids"], ""
                else:
                    rope_inputs, domain = [f"/attn/{p}", "position_ids", "/rope/cos", "/rope/sin"], "com.microsoft"
                nodes.append(helper.make_node("RotaryEmbedding", rope_inputs, [f"/attn/{p}_rot"], name=f"/attn/{p}/Rotary",
                                              domain=domain, num_heads=2))
            q, k = "/attn/q_rot", "/attn/k_rot"
        nodes.append(helper.make_node("Attention", [q or "/attn/q", k or "/attn/k", "/attn/v"], ["attn_out"],
                                      name="/attn/Attention", q_num_heads=2, kv_num_heads=2))
        outputs = ["attn_out"]
    elif attention:
        inits += [
            numpy_helper.from_array(rng.standard_normal((EMB_HIDDEN, 3 * EMB_HIDDEN)).astype(np.float32) * 0.2, "/attn/qkv_weight"),
            numpy_helper.from_array(rng.standard_normal(3 * EMB_HIDDEN).astype(np.float32) * 0.2, "/attn/qkv_bias"),
        ]
        nodes.append(helper.make_node("Attention", ["/emb/ln_out", "/attn/qkv_weight", "/attn/qkv_bias"], ["attn_out"],
                                      name="/attn/Attention", domain="com.microsoft", num_heads=2))
        outputs = ["attn_out"]
    if sum_consumed:
        nodes.append(helper.make_node("Add", [outputs[0], "/emb/Add_1_output_0"], ["residual_out"], name="/next/ResidualAdd"))
        outputs = ["residual_out"]
    return _norm_model(nodes, inputs, outputs, inits, opset=opset)
