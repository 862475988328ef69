"""LayerNormFusion, SimplifiedLayerNormFusion, SkipLayerNormFusion and EmbedLayerNormFusion.

Each rule: positives with exact counts and onnxruntime numerics (original vs optimized, both with
ONNX Runtime's own graph optimizations off), and negatives whose near miss must read for a user.
The fixture tests pin the counts on the exported BERT and GPT-2 models at level extended.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto

from optimizer import optimize
from tests.models import patterns
from tests.oracle import MODELS, assert_same_outputs, fixture_feeds

# The embedding patterns' tables hold EMB_VOCAB words and EMB_POSITIONS positions: feeds must fit.
EMBED_FEEDS = dict(batch=patterns.EMB_BATCH, seq=patterns.EMB_SEQ, vocab=patterns.EMB_VOCAB)


def _optimize(model: onnx.ModelProto):
    result = optimize(model, level="extended")
    return ir.serde.serialize_model(result.model), result.report


def _messages(report, rule: str) -> list[str]:
    return [m.message for m in report.explain(rule)]


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == op_type]
    return node


# --- LayerNormFusion ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    [
        dict(opset=14),
        dict(opset=17),
        dict(opset=18),  # axes as a constant input
        dict(opset=14, square="mul"),
        dict(opset=14, divide="reciprocal"),
        dict(opset=14, duplicate_sub=True),
        dict(opset=14, cast_after_sub=TensorProto.FLOAT),
        dict(opset=14, cast_exponent=True),
        dict(opset=14, axes=(2,)),  # the last axis, counted from the front
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v),
)
def test_layer_norm_fuses(variant):
    model = patterns.layer_norm(epsilon=1e-3, **variant)
    optimized, report = _optimize(model)
    assert report.rules["LayerNormFusion"].fired == 1
    assert report.ops_after == {"LayerNormalization": 1}
    node = _node(optimized, "LayerNormalization")
    assert node.domain == ""
    assert list(node.input) == ["x", "/ln/gamma", "/ln/beta"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["axis"] == -1 and attrs["epsilon"] == pytest.approx(1e-3)
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(eps_const=False), "LayerNormFusion at /ln/ReduceMean: epsilon input '/ln/eps' of Add '/ln/Add' is not a constant"),
        (dict(exponent=3.0), "LayerNormFusion at /ln/ReduceMean: Pow '/ln/Pow' raises to 3.0, not 2"),
        (dict(axes=(1,)), "LayerNormFusion at /ln/ReduceMean: ReduceMean '/ln/ReduceMean' reduces axes [1] of 'x' (rank 3); "
         "the fused op normalizes a block of trailing axes only"),
        (dict(extra_outputs=("/ln/Div_output_0",)), "LayerNormFusion at /ln/ReduceMean: intermediate value '/ln/Div_output_0' is a graph output"),
        (dict(extra_consumer="/ln/Sqrt_output_0"), "LayerNormFusion at /ln/ReduceMean: intermediate value '/ln/Sqrt_output_0' also feeds Neg '/ln/Neg'"),
        (dict(gamma_shape=(1,)), "LayerNormFusion at /ln/ReduceMean: gamma '/ln/gamma' has 1 elements but 'x' has last dimension 16"),
    ],
    ids=["epsilon-input", "cube", "wrong-axes", "graph-output", "two-consumers", "gamma-size"],
)
def test_layer_norm_near_misses(kwargs, message):
    model = patterns.layer_norm(**kwargs)
    optimized, report = _optimize(model)
    assert report.rules["LayerNormFusion"].fired == 0
    assert report.ops_after.get("LayerNormalization", 0) == 0
    assert report.ops_after.get("SimplifiedLayerNormalization", 0) == 0
    assert report.ops_after["ReduceMean"] == 2
    # Every anchor answers: the mean's ReduceMean says why, the variance's points there.
    misses = report.explain("LayerNormFusion")
    assert [m.message for m in misses if m.step != "variance"] == [message]
    assert [m.anchor for m in misses if m.step == "variance"] == ["/ln/ReduceMean_1"]
    assert [m.step for m in report.explain("SimplifiedLayerNormFusion")] == ["square", "square"]
    assert_same_outputs(model, optimized)


# --- mixed precision: float16 data normalized in float32 (Apex O2, float16 exports) ------------


def _float16_inputs(model: onnx.ModelProto, names=("x",), cast=True) -> onnx.ModelProto:
    """The graph inputs `names` become float16; with `cast`, each is Cast to float before its readers."""
    for value in model.graph.input:
        if value.name in names:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    if cast:
        for node in model.graph.node:
            for i, name in enumerate(node.input):
                if name in names:
                    node.input[i] = f"{name}/float"
        nodes = [onnx.helper.make_node("Cast", [n], [f"{n}/float"], name=f"/cast/{n}", to=TensorProto.FLOAT) for n in names]
        nodes += list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return model


def _grid_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Multiples of 1/64 in +-4: float16 sums of them are exact, so float16 and float32 agree."""
    feeds = fixture_feeds(model, seed=seed)
    return {k: (np.round(v.astype(np.float32) * 16) / 64).astype(v.dtype) for k, v in feeds.items()}


def test_layer_norm_absorbs_the_cast_of_float16_data_below_opset_17():
    # ONNX Runtime's since-1 LayerNormalization takes float16 X with float32 gamma and beta and
    # gives float32, computed in float32 as the chain behind the Cast computes it: fp32 tolerance.
    model = _float16_inputs(patterns.layer_norm(opset=14))
    optimized, report = _optimize(model)
    assert report.ops_after == {"LayerNormalization": 1}
    assert list(_node(optimized, "LayerNormalization").input) == ["x", "/ln/gamma", "/ln/beta"]
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(
    "model, step, message",
    [
        (lambda: _float16_inputs(patterns.layer_norm(opset=17)), "dtype",
         "LayerNormFusion at /ln/ReduceMean: input 'x' is float16 but gamma '/ln/gamma' is float; "
         "LayerNormalization takes one type throughout from opset 17 (this model imports 17)"),
        # The fused op computes in float32: a chain that squares in double would lose precision.
        (lambda: patterns.layer_norm(opset=14, cast_after_sub=TensorProto.DOUBLE), "cast",
         "LayerNormFusion at /ln/ReduceMean: Cast '/ln/Cast' inside the pattern changes dtype from float to double; "
         "only Casts between float16 and float are absorbed, since the fused op computes in float"),
    ],
    ids=["float16-x-float-gamma-opset-17", "cast-to-double"],
)
def test_layer_norm_mixed_precision_near_misses(model, step, message):
    _, report = _optimize(model())
    assert report.ops_after.get("LayerNormalization", 0) == 0
    assert [m.message for m in report.explain("LayerNormFusion") if m.step == step] == [message]


def test_skip_layer_norm_casts_a_float16_residual_stream_up_to_float_gamma():
    # float16 x and skip, LayerNormalization (since 1) with float32 gamma: SkipLayerNormalization
    # takes one type, so x and skip are cast to float32 in front of it, as ONNX Runtime's fusion does.
    model = _float16_inputs(patterns.skip_layer_norm(opset=14), names=("x", "skip"), cast=False)
    optimized, report = _optimize(model)
    assert report.ops_after == {"Cast": 2, "com.microsoft.SkipLayerNormalization": 1}
    node = _node(optimized, "SkipLayerNormalization")
    casts = {n.output[0]: n.input[0] for n in optimized.graph.node if n.op_type == "Cast"}
    assert [casts.get(name, name) for name in node.input] == ["x", "skip", "/ln/gamma", "/ln/beta"]
    # The chain rounds x + skip to float16, the fused op adds in float32: on grid inputs both exact.
    assert_same_outputs(model, optimized, _grid_feeds(model))


def test_skip_layer_norm_of_a_float16_sum_read_elsewhere_is_a_near_miss():
    model = _float16_inputs(patterns.skip_layer_norm(opset=14, extra_outputs=("/ln/residual",)),
                            names=("x", "skip"), cast=False)
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.FLOAT16
    _, report = _optimize(model)
    assert report.ops_after == {"Add": 1, "LayerNormalization": 1}
    assert [m.message for m in report.explain("SkipLayerNormFusion")] == [
        "SkipLayerNormFusion at /ln: the float16 residual sum '/ln/residual' of Add '/ln/ResidualAdd' has other "
        "readers, but SkipLayerNormalization on float32 gamma would give it as float32"
    ]


# --- SimplifiedLayerNormFusion ----------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    [
        dict(opset=14),
        dict(opset=20),
        dict(opset=14, divide="div"),
        dict(opset=14, square="mul"),
        dict(opset=14, gamma_first=False),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v),
)
def test_rms_norm_fuses(variant):
    model = patterns.rms_norm(**variant)
    optimized, report = _optimize(model)
    assert report.rules["SimplifiedLayerNormFusion"].fired == 1
    assert report.ops_after == {"SimplifiedLayerNormalization": 1}
    node = _node(optimized, "SimplifiedLayerNormalization")
    assert node.domain == "" and list(node.input) == ["x", "/ln/gamma"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["epsilon"] == pytest.approx(1e-6) and attrs["axis"] == -1
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(exponent=3.0), "SimplifiedLayerNormFusion at /ln/ReduceMean_1: Pow '/ln/Pow' raises to 3.0, not 2"),
        (dict(axes=(0,)), "SimplifiedLayerNormFusion at /ln/ReduceMean_1: ReduceMean '/ln/ReduceMean_1' reduces axes [0] of 'x' "
         "(rank 3); the fused op normalizes a block of trailing axes only"),
        (dict(extra_outputs=("/ln/Reciprocal_output_0",)),
         "SimplifiedLayerNormFusion at /ln/ReduceMean_1: intermediate value '/ln/Reciprocal_output_0' is a graph output"),
        (dict(extra_consumer="/ln/Add_output_0"),
         "SimplifiedLayerNormFusion at /ln/ReduceMean_1: intermediate value '/ln/Add_output_0' also feeds Neg '/ln/Neg'"),
    ],
    ids=["cube", "wrong-axes", "graph-output", "two-consumers"],
)
def test_rms_norm_near_misses(kwargs, message):
    model = patterns.rms_norm(**kwargs)
    optimized, report = _optimize(model)
    assert report.ops_after.get("SimplifiedLayerNormalization", 0) == 0
    assert report.ops_after["ReduceMean"] == 1
    assert _messages(report, "SimplifiedLayerNormFusion") == [message]
    assert_same_outputs(model, optimized)


# --- SkipLayerNormFusion ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias, expected_inputs",
    [
        (None, ["x", "skip", "/ln/gamma", "/ln/beta"]),
        ("x", ["x", "skip", "/ln/gamma", "/ln/beta", "/ln/bias"]),
        ("skip", ["x", "skip", "/ln/gamma", "/ln/beta", "/ln/bias"]),
    ],
)
def test_skip_layer_norm_fuses(bias, expected_inputs):
    model = patterns.skip_layer_norm(bias=bias, epsilon=1e-6)
    optimized, report = _optimize(model)
    assert report.ops_after == {"com.microsoft.SkipLayerNormalization": 1}
    node = _node(optimized, "SkipLayerNormalization")
    assert node.domain == "com.microsoft" and list(node.input) == expected_inputs
    assert list(node.output) == ["y"]
    assert onnx.helper.get_attribute_value(node.attribute[0]) == pytest.approx(1e-6)
    assert_same_outputs(model, optimized)


def test_skip_layer_norm_keeps_the_residual_sum_read_by_the_next_block():
    """GPT-2's pre-LN residual: the sum feeds the next Add too, so it becomes output 3 (input_skip_bias_sum)."""
    model = patterns.skip_layer_norm(bias="x", sum_consumed=True)
    optimized, report = _optimize(model)
    assert report.ops_after == {"Add": 1, "com.microsoft.SkipLayerNormalization": 1}
    node = _node(optimized, "SkipLayerNormalization")
    assert list(node.output) == ["y", "", "", "/ln/residual"]
    assert list(_node(optimized, "Add").input) == ["y", "/ln/residual"]
    assert_same_outputs(model, optimized)


def test_skip_layer_norm_residual_sum_as_graph_output():
    model = patterns.skip_layer_norm(extra_outputs=("/ln/residual",))
    optimized, report = _optimize(model)
    assert report.ops_after == {"com.microsoft.SkipLayerNormalization": 1}
    assert list(_node(optimized, "SkipLayerNormalization").output) == ["y", "", "", "/ln/residual"]
    assert_same_outputs(model, optimized)


def test_skip_layer_norm_leaves_a_bias_add_that_is_read_elsewhere():
    model = patterns.skip_layer_norm(bias="x", extra_outputs=("/ln/biased",))
    optimized, report = _optimize(model)
    assert report.ops_after == {"Add": 1, "com.microsoft.SkipLayerNormalization": 1}
    assert list(_node(optimized, "SkipLayerNormalization").input) == ["/ln/biased", "skip", "/ln/gamma", "/ln/beta"]
    assert_same_outputs(model, optimized)


def test_decomposed_layer_norm_becomes_skip_layer_norm():
    model = patterns.decomposed_skip_layer_norm(opset=14)
    optimized, report = _optimize(model)
    assert report.rules["LayerNormFusion"].fired == 1
    assert report.rules["SkipLayerNormFusion"].fired == 1
    assert report.ops_after == {"com.microsoft.SkipLayerNormalization": 1}
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(x_shape=(4, 16), skip_shape=(4, 16)),
         "SkipLayerNormFusion at /ln: residual Add '/ln/ResidualAdd' has rank-2 input 'x'; "
         "SkipLayerNormalization needs rank 3 (batch, sequence, hidden)"),
        (dict(skip_shape=(1, 4, 16)),
         "SkipLayerNormFusion at /ln: inputs of residual Add '/ln/ResidualAdd' have shapes [2, 4, 16] and [1, 4, 16]; "
         "SkipLayerNormalization does not broadcast"),
        (dict(axis=1), "SkipLayerNormFusion at /ln: LayerNormalization '/ln' normalizes from axis 1; "
         "SkipLayerNormalization normalizes the last axis only"),
    ],
    ids=["rank-2", "broadcast", "axis-1"],
)
def test_skip_layer_norm_near_misses(kwargs, message):
    if kwargs.get("axis") == 1:  # gamma/beta must then cover (4, 16); build the weights to match
        model = patterns.skip_layer_norm(**kwargs)
        for init in model.graph.initializer:
            if init.name in ("/ln/gamma", "/ln/beta"):
                init.CopyFrom(onnx.numpy_helper.from_array(np.full((4, 16), 0.5, np.float32), init.name))
    else:
        model = patterns.skip_layer_norm(**kwargs)
    optimized, report = _optimize(model)
    assert report.ops_after == {"Add": 1, "LayerNormalization": 1}
    assert _messages(report, "SkipLayerNormFusion") == [message]
    assert_same_outputs(model, optimized)


# --- EmbedLayerNormFusion ---------------------------------------------------------------------


def test_embed_layer_norm_fuses_sliced_position_ids():
    """Today's exporters slice a position_ids buffer: those ids become the op's position_ids input."""
    model = patterns.embed_layer_norm(position="slice")
    optimized, report = _optimize(model)
    assert report.rules["EmbedLayerNormFusion"].fired == 1
    assert report.ops_after == {
        "Cast": 3, "Shape": 1, "Slice": 1,
        "com.microsoft.Attention": 1, "com.microsoft.EmbedLayerNormalization": 1,
    }
    node = _node(optimized, "EmbedLayerNormalization")
    assert list(node.input)[2:8] == ["/emb/word", "/emb/position", "/emb/segment", "/emb/ln/gamma", "/emb/ln/beta", ""]
    assert len(node.input) == 9 and len(node.output) == 2
    assert onnx.helper.get_attribute_value(node.attribute[0]) == pytest.approx(1e-12)
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


def test_embed_layer_norm_of_a_float16_gamma_is_a_near_miss():
    # A LayerNorm with float16 gamma returns float16 (LayerNormFusion's mixed-precision form);
    # EmbedLayerNormalization returns float.
    model = patterns.embed_layer_norm(position="constant")
    for init in model.graph.initializer:
        if init.name == "/emb/ln/gamma":
            init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype(np.float16), init.name))
    _, report = _optimize(model)
    assert report.ops_after.get("com.microsoft.EmbedLayerNormalization", 0) == 0
    assert _messages(report, "EmbedLayerNormFusion") == [
        "EmbedLayerNormFusion at /emb/LayerNorm: gamma '/emb/ln/gamma' of LayerNormalization '/emb/LayerNorm' "
        "is float16; the fusion handles float"
    ]


def test_embed_layer_norm_drops_constant_default_positions():
    model = patterns.embed_layer_norm(position="constant")
    optimized, report = _optimize(model)
    assert report.ops_after == {"Cast": 2, "com.microsoft.Attention": 1, "com.microsoft.EmbedLayerNormalization": 1}
    assert len(_node(optimized, "EmbedLayerNormalization").input) == 7
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


@pytest.mark.parametrize("rotary", [None, "onnx", "com.microsoft"])
def test_embed_layer_norm_in_front_of_onnx_attention_23(rotary):
    # Attention in its other form: the standard op of opset 23 reads the LayerNorm output through
    # its Q/K/V projections (the dynamo exporter's BERT at opset 23), Q and K maybe through a
    # RotaryEmbedding in either of its forms.
    model = patterns.embed_layer_norm(attention="onnx", opset=23, rotary=rotary)
    optimized, report = _optimize(model)
    assert report.fusions == {"com.microsoft.EmbedLayerNormalization": 1}
    assert report.ops_after["Attention"] == 1
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


def test_embed_layer_norm_folds_a_constant_segment_row_into_the_position_table():
    # BERT/RoBERTa called without token_type_ids: the segment lookup reads all-zero ids from a
    # buffer, so it adds segment row 0 to every token, which the position table can carry.
    model = patterns.embed_layer_norm(segment="buffer")
    optimized, report = _optimize(model)
    assert report.fusions == {"com.microsoft.EmbedLayerNormalization": 1}
    node = _node(optimized, "EmbedLayerNormalization")
    assert node.input[1] == "" and node.input[4] == ""  # no segment ids, no segment table
    tables = {t.name: onnx.numpy_helper.to_array(t) for t in optimized.graph.initializer}
    original = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_allclose(tables[node.input[3]], original["/emb/position"] + original["/emb/segment"][0])
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


@pytest.mark.parametrize("position", ["range", "nonzero"])
def test_embed_layer_norm_drops_counted_positions_as_the_ops_default(position):
    # ONNX Runtime's formats 3-9: Range(0, Shape(input_ids)[1]) expanded to the ids' shape is
    # 0..S-1 on every row, what the op computes without position ids; formats 2 and 4 count with
    # NonZero(ConstantOfShape([S], 1)), PyTorch's arange below opset 11.
    model = patterns.embed_layer_norm(position=position)
    optimized, report = _optimize(model)
    assert report.fusions == {"com.microsoft.EmbedLayerNormalization": 1}
    assert report.ops_after == {"Cast": 2, "com.microsoft.Attention": 1, "com.microsoft.EmbedLayerNormalization": 1}
    assert len(_node(optimized, "EmbedLayerNormalization").input) == 7
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


def test_embed_layer_norm_keeps_nonzero_of_zeros_as_position_ids():
    # ConstantOfShape's default value is 0: NonZero finds no index, these are not 0..S-1.
    optimized, report = _optimize(patterns.embed_layer_norm(position="nonzero_of_zeros"))
    assert report.ops_after["NonZero"] == 1
    assert len(_node(optimized, "EmbedLayerNormalization").input) == 9


def test_embed_layer_norm_without_segment_embedding():
    """DistilBERT: word + position only; the segment inputs stay empty."""
    model = patterns.embed_layer_norm(segment=False)
    optimized, report = _optimize(model)
    assert report.ops_after["com.microsoft.EmbedLayerNormalization"] == 1
    node = _node(optimized, "EmbedLayerNormalization")
    assert node.input[1] == "" and node.input[4] == ""
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


def test_embed_layer_norm_keeps_the_sum_read_by_the_first_residual():
    model = patterns.embed_layer_norm(sum_consumed=True)
    optimized, report = _optimize(model)
    assert report.ops_after["com.microsoft.EmbedLayerNormalization"] == 1
    node = _node(optimized, "EmbedLayerNormalization")
    assert len(node.output) == 3 and node.output[2] == "/emb/Add_1_output_0"
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(attention=False), "EmbedLayerNormFusion at /emb/LayerNorm: LayerNormalization '/emb/LayerNorm' feeds no "
         "attention (com.microsoft.Attention, or ONNX Attention through its projections); like ONNX Runtime, the "
         "embedding is fused only in front of a fused attention"),
        (dict(position="input"), "EmbedLayerNormFusion at /emb/LayerNorm: cannot tell the position lookup from the segment "
         "lookup: ids 'token_type_ids', 'position_ids' are both graph inputs or both computed"),
    ],
    ids=["no-attention", "ambiguous-ids"],
)
def test_embed_layer_norm_near_misses(kwargs, message):
    model = patterns.embed_layer_norm(**kwargs)
    optimized, report = _optimize(model)
    assert report.ops_after.get("com.microsoft.EmbedLayerNormalization", 0) == 0
    assert report.ops_after["Gather"] == 3 and report.ops_after["LayerNormalization"] == 1
    assert _messages(report, "EmbedLayerNormFusion") == [message]
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


def test_embed_layer_norm_two_consumers_of_a_lookup():
    model = patterns.embed_layer_norm()
    model.graph.node.append(onnx.helper.make_node("Neg", ["/emb/seg_out"], ["extra"], name="/emb/Neg"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    optimized, report = _optimize(model)
    assert report.ops_after.get("com.microsoft.EmbedLayerNormalization", 0) == 0
    assert _messages(report, "EmbedLayerNormFusion") == [
        "EmbedLayerNormFusion at /emb/LayerNorm: intermediate value '/emb/seg_out' also feeds Neg '/emb/Neg'"
    ]
    assert_same_outputs(model, optimized, fixture_feeds(model, **EMBED_FEEDS))


# --- exported fixtures ------------------------------------------------------------------------

# Measured at level extended with AttentionFusion in the level (EmbedLayerNormFusion needs it).
# GPT-2 TorchScript: its wpe lookup passes through a Cast and input_ids through a Reshape, so no
# EmbedLayerNormalization; two residual Adds join dims that shape inference names differently.
FIXTURE_COUNTS = {
    "bert_torchscript_opset14": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    "bert_eager_torchscript_opset14": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    "bert_dynamo_opset20": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    "gpt2_torchscript_opset14": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    "gpt2_dynamo_opset20": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    # Batch 1, sequence 16. The pinned file's residual Adds join [1, 16, 64] with a batch that
    # shape inference first names unk__0; folding its shape arithmetic proves it is 1.
    "bert_static_torchscript_opset14": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    "bert_static_dynamo_opset20": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
    "bert_pinned_dynamo_opset20": {"LayerNormalization": 0, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1},
}


@pytest.mark.parametrize("fixture", sorted(FIXTURE_COUNTS))
def test_fixture_normalization_counts_and_numerics(fixture):
    model = onnx.load(MODELS / f"{fixture}.onnx")
    optimized, report = _optimize(model)
    ops = report.ops_after
    counts = {
        "LayerNormalization": ops.get("LayerNormalization", 0),
        "SkipLayerNormalization": ops.get("com.microsoft.SkipLayerNormalization", 0),
        "EmbedLayerNormalization": ops.get("com.microsoft.EmbedLayerNormalization", 0),
    }
    assert counts == FIXTURE_COUNTS[fixture]
    assert "ReduceMean" not in ops  # every exported LayerNorm was recognised
    assert_same_outputs(model, optimized, fixture_feeds(model, batch=2, seq=16))


def test_layer_norm_over_the_last_two_axes():
    # ONNX Runtime's layer_norm_with_cast.onnx: ReduceMean over axes [-2, -1], gamma and beta of
    # their shape: LayerNormalization(axis=-2).
    model = patterns.layer_norm(axes=(-2, -1), gamma_shape=(4, 16))
    optimized, report = _optimize(model)
    assert report.ops_after == {"LayerNormalization": 1}
    [node] = [n for n in optimized.graph.node if n.op_type == "LayerNormalization"]
    assert onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "axis")) == -2
    assert_same_outputs(model, optimized)


def test_layer_norm_over_two_axes_with_a_one_axis_gamma_is_a_near_miss():
    _, report = _optimize(patterns.layer_norm(axes=(-2, -1), gamma_shape=(16,)))
    assert [m.reason for m in report.explain("LayerNormFusion") if m.step == "gamma"] == [
        "gamma '/ln/gamma' of Mul '/ln/Mul' has shape [16], not the normalized axes' [4, 16]"
    ]


def _layer_norm_with_scale_inputs(scale_dim: str):
    """x [batch, 'hidden'] normalized over 'hidden', gamma and beta graph inputs [scale_dim]
    (ORT's layer_norm.onnx: the scale's length is a symbol, not a number)."""
    h = onnx.helper
    nodes = [
        h.make_node("ReduceMean", ["x"], ["mean"], name="/ln/ReduceMean", axes=[-1]),
        h.make_node("Sub", ["x", "mean"], ["centered"], name="/ln/Sub"),
        h.make_node("Pow", ["centered", "two"], ["squared"], name="/ln/Pow"),
        h.make_node("ReduceMean", ["squared"], ["variance"], name="/ln/ReduceMean_1", axes=[-1]),
        h.make_node("Add", ["variance", "eps"], ["var_eps"], name="/ln/Add"),
        h.make_node("Sqrt", ["var_eps"], ["std"], name="/ln/Sqrt"),
        h.make_node("Div", ["centered", "std"], ["normalized"], name="/ln/Div"),
        h.make_node("Mul", ["gamma", "normalized"], ["scaled"], name="/ln/Mul"),
        h.make_node("Add", ["scaled", "beta"], ["y"], name="/ln/Add_1"),
    ]
    inputs = [h.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "hidden"]),
              h.make_tensor_value_info("gamma", TensorProto.FLOAT, [scale_dim]),
              h.make_tensor_value_info("beta", TensorProto.FLOAT, [scale_dim])]
    inits = [onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "eps")]
    graph = h.make_graph(nodes, "ln", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "hidden"])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


def test_layer_norm_scale_of_the_same_symbolic_length_fuses():
    model = _layer_norm_with_scale_inputs("hidden")
    optimized, report = _optimize(model)
    assert report.ops_after == {"LayerNormalization": 1}
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32),
             "gamma": rng.standard_normal(8).astype(np.float32), "beta": rng.standard_normal(8).astype(np.float32)}
    assert_same_outputs(model, optimized, feeds)


def test_layer_norm_scale_of_another_symbolic_length_is_a_near_miss():
    _, report = _optimize(_layer_norm_with_scale_inputs("other"))
    assert "LayerNormalization" not in report.ops_after
    assert [m.message for m in report.explain("LayerNormFusion") if m.step != "variance"] == [
        "LayerNormFusion at /ln/ReduceMean: gamma 'gamma' of Mul '/ln/Mul' has length 'other', which is not "
        "known to equal the last dimension 'hidden' of 'x'"
    ]


# --- the RMS norm's two forms after a residual Add ----------------------------------------


@pytest.mark.parametrize(("norm", "opset"), [("SimplifiedLayerNormalization", 17), ("RMSNormalization", 23)])
@pytest.mark.parametrize("sum_consumed", [False, True])
def test_residual_add_then_rms_norm_in_either_form_becomes_skip_simplified(norm, opset, sum_consumed):
    # onnxruntime's SimplifiedLayerNormalization and the standard RMSNormalization-23 (the dynamo
    # exporter's, for Llama) are one op in two forms: both must meet SkipLayerNormFusion.
    model = patterns.skip_layer_norm(norm=norm, opset=opset, sum_consumed=sum_consumed)
    optimized, report = _optimize(model)
    expected = {"com.microsoft.SkipSimplifiedLayerNormalization": 1}
    assert report.ops_after == ({**expected, "Add": 1} if sum_consumed else expected)
    assert report.fusions == expected
    assert_same_outputs(model, optimized)


@pytest.mark.parametrize(("norm", "opset"), [("SimplifiedLayerNormalization", 17), ("RMSNormalization", 23)])
def test_rms_norm_without_a_residual_add_is_a_near_miss_naming_its_input(norm, opset):
    model = patterns.rms_norm(opset=opset) if norm == "SimplifiedLayerNormalization" else None
    if model is None:  # the opset-23 op itself, fed by a graph input
        model = patterns.skip_layer_norm(norm=norm, opset=opset)
        model.graph.node[0].op_type = "Mul"  # x * skip: no residual Add in front of the norm
    _, report = _optimize(model)
    [miss] = report.explain("SkipLayerNormFusion")
    assert miss.step == "residual" and "not a residual Add" in miss.reason


@pytest.mark.parametrize("divide", ["reciprocal", "div", "div_one"])
@pytest.mark.parametrize("cast", [False, True])
def test_llama_rms_norm_forms_fuse(divide, cast):
    # TorchScript writes torch.rsqrt as Div(1, std) and LlamaRMSNorm's .to(float32) as a Cast.
    model = patterns.rms_norm(divide=divide, cast=cast)
    optimized, report = _optimize(model)
    assert report.ops_after == {"SimplifiedLayerNormalization": 1}
    [norm] = [n for n in optimized.graph.node if n.op_type == "SimplifiedLayerNormalization"]
    assert norm.input[0] == "x"
    assert_same_outputs(model, optimized)


def test_skip_layer_norm_after_a_custom_op_names_the_op_where_the_shape_was_lost():
    # A custom op's output shape is unknown to inference (and to us), so the residual's rank is
    # not proven; the near miss names the op, as a fusion barrier, instead of "unknown rank" alone.
    model = patterns.skip_layer_norm()
    graph = model.graph
    graph.node.insert(0, onnx.helper.make_node("Scale", ["skip"], ["skip_scaled"], name="/custom/Scale", domain="my.ops"))
    graph.node[1].input[1] = "skip_scaled"
    model.opset_import.append(onnx.helper.make_opsetid("my.ops", 1))
    _, report = _optimize(model)
    assert "com.microsoft.SkipLayerNormalization" not in report.ops_after
    [miss] = report.explain("SkipLayerNormFusion")
    assert miss.barrier == "my.ops.Scale"
    assert miss.reason == (
        "residual Add '/ln/ResidualAdd' has unknown rank input 'skip_scaled' (shapes are lost at custom op "
        "my.ops.Scale '/custom/Scale' (custom op, a fusion barrier), which shape inference cannot see through; "
        "the model's value_info can declare its output's shape); SkipLayerNormalization needs rank 3 "
        "(batch, sequence, hidden)")
    # the evidence it asks for: the custom op's output shape, declared
    graph.value_info.append(onnx.helper.make_tensor_value_info("skip_scaled", onnx.TensorProto.FLOAT, patterns.NORM_SHAPE))
    assert _optimize(model)[1].fusions == {"com.microsoft.SkipLayerNormalization": 1}


def test_skip_layer_norm_where_an_export_names_one_batch_twice():
    # TorchScript's GPT-2: the attention output's batch and the embeddings' are differently named
    # unk__ dimensions; inferred with the inputs pinned to two sets of sizes they are one number.
    report = optimize(str(MODELS / "gpt2_torchscript_opset14.onnx"), "extended").report
    assert report.fusions["com.microsoft.SkipLayerNormalization"] == 4
    assert report.explain("SkipLayerNormFusion") == []
