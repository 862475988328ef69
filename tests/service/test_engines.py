"""service.adapters.engines: both engines at every level, their counts, timings, feeds and errors.

Runs are short (2 timed after 1 warm-up) on the tiny fixtures in tests/models; nothing here
asserts a speed, only that the timings are well-formed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer import LEVEL_NAMES, optimize
from optimizer.fused_ops import fused_op_keys
from service.adapters.engines import ENGINES, EngineError, run_engine
from service.adapters.engines import onnxruntime as ort_engine
from service.adapters.engines.feeds import FeedError, feeds_digest, make_feeds
from tests.oracle import MODELS

BERT_STATIC = MODELS / "bert_static_dynamo_opset20.onnx"
RESNET = MODELS / "resnet_tiny_opset17.onnx"
QUICK = {"runs": 2, "warmup": 1}


@pytest.fixture(scope="module")
def bert_results():
    """Every engine at every level on the static BERT fixture, run once for the module."""
    return {
        (engine, level): run_engine(engine, BERT_STATIC, level, **QUICK)
        for level in LEVEL_NAMES
        for engine in ENGINES
    }


def test_engines_are_ours_then_the_reference():
    assert list(ENGINES) == ["fusionwatch", "onnxruntime"]


@pytest.mark.parametrize("level", LEVEL_NAMES)
@pytest.mark.parametrize("engine", list(ENGINES))
def test_each_engine_produces_a_result_at_each_level(bert_results, engine, level):
    result = bert_results[engine, level]
    assert (result.engine, result.level, result.runs, result.threads) == (engine, level, 2, 0)
    assert result.engine_version
    assert result.graph_error is None
    assert result.nodes_after == sum(result.ops_after.values()) > 0
    assert result.inputs == {
        name: "int64[1, 16]" for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    data = json.loads(json.dumps(result.to_dict()))
    assert data["execute_ms"]["median"] == result.execute_ms.median
    assert data["fusions"] == result.fusions


@pytest.mark.parametrize("level", LEVEL_NAMES)
def test_our_counts_are_our_optimizers_report(bert_results, level):
    result = bert_results["fusionwatch", level]
    report = optimize(BERT_STATIC, level=level).report
    assert result.ops_after == report.ops_after
    # What the graph runs, whoever wrote it: this dynamo export's own Gelu, LayerNormalization and
    # Gemm count at level disabled too.
    assert result.fusions == {op: n for op, n in report.ops_after.items() if op in fused_op_keys()}
    if level == "disabled":
        assert result.fusions == {"Gelu": 2, "Gemm": 1, "LayerNormalization": 5} and report.fusions == {}
    assert result.nodes_after == report.nodes_after
    assert result.engine_level == level


@pytest.mark.parametrize("name", ["bert_static_torchscript_opset14.onnx", "bert_static_dynamo_opset20.onnx"])
def test_our_extended_level_fuses_the_static_bert_fixtures(name):
    # The counts tests/optimizer/test_static_shapes.py pins: 2 layers, each with one Attention,
    # one BiasGelu and two SkipLayerNormalizations; the pooler's Gemm+Tanh is the FusedGemm.
    result = run_engine("fusionwatch", MODELS / name, "extended", **QUICK)
    assert result.fusions == {
        "com.microsoft.Attention": 2,
        "com.microsoft.BiasGelu": 2,
        "com.microsoft.EmbedLayerNormalization": 1,
        "com.microsoft.FusedGemm": 1,
        "com.microsoft.SkipLayerNormalization": 4,
    }


def test_onnxruntime_extended_level_counts_on_static_bert(bert_results):
    # Computed once with onnxruntime 1.32 and pinned: its MatMulAddFusion still runs before the
    # fusions that anchor on the projection Adds (the 1.31 regression, see
    # tests/optimizer/test_static_shapes.py), so all 12 become Gemm and neither Attention nor
    # BiasGelu forms; 4 of its 5 SkipLayerNormalizations are the residual Adds, the fifth the
    # embeddings' Add+LayerNorm; its 2 FusedMatMuls are the scaled Q·Kᵀ products. A new
    # onnxruntime that changes these is what fusionwatch exists to report: re-pin deliberately.
    result = bert_results["onnxruntime", "extended"]
    assert result.engine_level == "ORT_ENABLE_EXTENDED"
    assert result.fusions == {
        "Gelu": 2,  # the exporter's: they run as one op each, without the bias BiasGelu would take
        "Gemm": 12,
        "com.microsoft.FusedGemm": 1,
        "com.microsoft.FusedMatMul": 2,
        "com.microsoft.SkipLayerNormalization": 5,
    }
    assert result.ops_after["Gelu"] == 2  # the unfused GELUs BiasGelu would have taken
    assert result.nodes_after == 80
    # Level disabled runs the export as written: its own Gelu, Gemm and LayerNormalization, as ours does.
    assert bert_results["onnxruntime", "disabled"].fusions == bert_results["fusionwatch", "disabled"].fusions


def test_both_engines_fuse_the_same_conv_relu_pairs():
    ours = run_engine("fusionwatch", RESNET, "extended", **QUICK)
    reference = run_engine("onnxruntime", RESNET, "extended", **QUICK)
    # FusedConv keeps its Conv's name in onnxruntime's graph; the op change marks it as fused.
    assert ours.fusions == reference.fusions == {"com.microsoft.FusedConv": 5}


def test_timings_are_ordered_and_positive(bert_results):
    for result in bert_results.values():
        for stats in (result.model_run_ms, result.execute_ms):
            assert 0 < stats.min <= stats.median <= stats.max
        assert result.execute_ms.median <= result.model_run_ms.median  # Execute runs inside model_run
        assert result.session_ms > 0


def test_our_results_name_the_kernel_libraries_our_session_ran_on(bert_results):
    for (engine, _level), result in bert_results.items():
        if engine == "onnxruntime":
            assert result.kernel_libraries == {}
        else:
            assert set(result.kernel_libraries) >= {"gemm", "conv"}
            assert result.kernel_libraries["gemm"] in ("mkl-packed", "onednn", "numpy")


def test_both_engines_get_the_same_deterministic_feeds(bert_results):
    model = onnx.load(BERT_STATIC)
    first, second = make_feeds(model, 16), make_feeds(model, 16)
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    digests = {result.feeds_digest for result in bert_results.values()}
    assert digests == {feeds_digest(first)}


def test_feed_rules_read_the_graph():
    feeds = make_feeds(onnx.load(MODELS / "bert_torchscript_opset14.onnx"), sequence_length=12)
    assert {name: (a.dtype, a.shape) for name, a in feeds.items()} == {
        name: (np.dtype(np.int64), (1, 12)) for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    assert (feeds["attention_mask"] == 1).all() and (feeds["token_type_ids"] == 0).all()
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 1000
    image = make_feeds(onnx.load(RESNET))["pixel_values"]
    assert image.dtype == np.float32 and image.shape == (1, 3, 32, 32)
    assert 0.5 < image.std() < 1.5  # standard normal, not constant


def _embedding_model(input_type=TensorProto.INT64) -> onnx.ModelProto:
    """ids [batch, seq] -> Reshape -> Gather(table [7, 4]): the vocabulary is 7 rows."""
    table = numpy_helper.from_array(np.zeros((7, 4), np.float32), "table")
    shape = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["token", "flat"], ["flat_ids"]),
            helper.make_node("Gather", ["table", "flat_ids"], ["y"]),
        ],
        "embedding",
        [helper.make_tensor_value_info("token", input_type, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [table, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_token_ids_stay_below_the_embedding_table_they_index():
    ids = make_feeds(_embedding_model(), sequence_length=4096)["token"]
    assert ids.shape == (1, 4096)
    assert set(np.unique(ids)) == set(range(7))  # every row reachable, none beyond


def test_unsupported_input_type_names_the_input(tmp_path):
    with pytest.raises(FeedError, match=r"input 'token' has type tensor\(string\)"):
        make_feeds(_embedding_model(TensorProto.STRING))
    path = tmp_path / "strings.onnx"
    onnx.save(_embedding_model(TensorProto.STRING), path)
    with pytest.raises(EngineError, match=r"strings\.onnx: cannot make inputs: input 'token'") as raised:
        run_engine("onnxruntime", path, "basic", **QUICK)
    assert isinstance(raised.value.__cause__, FeedError)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_missing_or_unreadable_model_is_an_engine_error_naming_the_file(tmp_path, engine):
    with pytest.raises(EngineError, match=rf"{engine} at level basic: .*nope\.onnx: no such model file"):
        run_engine(engine, tmp_path / "nope.onnx", "basic", **QUICK)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not a model")
    with pytest.raises(EngineError, match=r"garbage\.onnx: not a readable ONNX model") as raised:
        run_engine(engine, garbage, "basic", **QUICK)
    assert raised.value.__cause__ is not None
    assert str(raised.value).count("garbage.onnx") == 1  # the loader's message named it too


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_model_that_fails_to_run_is_an_engine_error(engine):
    # The dynamic BERT fixture has 64 positions; 128 tokens index past its position table.
    with pytest.raises(
        EngineError, match=rf"{engine} at level basic: .*bert_dynamo_opset20\.onnx: failed while running"
    ) as raised:
        run_engine(engine, MODELS / "bert_dynamo_opset20.onnx", "basic", sequence_length=128, **QUICK)
    assert raised.value.__cause__ is not None


def test_unknown_engine_level_or_count_is_a_value_error():
    with pytest.raises(ValueError, match="unknown engine 'tvm'; choose one of fusionwatch, onnxruntime"):
        run_engine("tvm", BERT_STATIC, "basic")
    with pytest.raises(ValueError, match="unknown optimization level 'max'; choose one of disabled, basic"):
        run_engine("onnxruntime", BERT_STATIC, "max")
    with pytest.raises(ValueError, match="runs must be an int >= 1, got 0"):
        run_engine("onnxruntime", BERT_STATIC, "basic", runs=0)


def test_onnxruntime_failing_to_write_its_graph_keeps_the_timings(monkeypatch):
    # A folder that does not exist: onnxruntime's own save fails, as it may at level all.
    monkeypatch.setattr(ort_engine, "OPTIMIZED_MODEL", "missing/optimized.onnx")
    result = run_engine("onnxruntime", BERT_STATIC, "all", **QUICK)
    assert result.graph_error.startswith("onnxruntime ")
    assert "could not write its optimized graph at ORT_ENABLE_ALL" in result.graph_error
    assert (result.ops_after, result.fusions, result.nodes_after) == ({}, {}, None)
    assert result.runs == 2 and result.execute_ms.median > 0


def test_layout_maps_to_onnxruntimes_layout_level_or_all_before_it_existed(monkeypatch):
    assert ort_engine.graph_optimization_level("layout")[0] == "ORT_ENABLE_LAYOUT"
    older = SimpleNamespace(ORT_DISABLE_ALL=0, ORT_ENABLE_BASIC=1, ORT_ENABLE_EXTENDED=2, ORT_ENABLE_ALL=99)
    monkeypatch.setattr(ort_engine.ort, "GraphOptimizationLevel", older)
    assert ort_engine.graph_optimization_level("layout") == ("ORT_ENABLE_ALL", 99)
    assert ort_engine.graph_optimization_level("extended") == ("ORT_ENABLE_EXTENDED", 2)


def test_onnxruntime_fused_ops_are_the_optimized_graphs_products_of_fusion_whoever_wrote_them():
    graph = helper.make_graph([
        helper.make_node("FusedConv", ["x", "w"], ["c"], name="conv", domain="com.microsoft"),
        helper.make_node("Conv", ["c", "w"], ["d"], name="kept"),  # an ordinary op, fused into or not
        helper.make_node("Reshape", ["d", "s"], ["r"], name="gemm_input_reshape_token_1"),
        helper.make_node("Gemm", ["r", "m"], ["e"], name="mm/MatMulAddFusion"),
        helper.make_node("LayerNormalization", ["e", "g"], ["f"], name="written_by_the_exporter"),
        helper.make_node("NchwcConv", ["f", "w"], ["h"], domain="com.microsoft.nchwc"),  # layout, not fusion
    ], "g", [], [])
    ops_after, fusions = ort_engine.count_ops(helper.make_model(graph))
    assert ops_after == {"Conv": 1, "Gemm": 1, "LayerNormalization": 1, "Reshape": 1, "com.microsoft.FusedConv": 1,
                         "com.microsoft.nchwc.NchwcConv": 1}
    assert fusions == {"Gemm": 1, "LayerNormalization": 1, "com.microsoft.FusedConv": 1}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_sequence_longer_than_the_model_takes_names_the_setting(engine):
    # The dynamo BERT fixture has 64 positions; the default 128 breaks a broadcast deep in the graph.
    with pytest.raises(EngineError) as raised:
        run_engine(engine, MODELS / "bert_dynamo_opset20.onnx", "disabled", runs=1, warmup=0)
    message = str(raised.value)
    assert "failed while running" in message
    assert "'input_ids'" in message and "sequence length 128" in message and "--sequence-length" in message
    result = run_engine(engine, MODELS / "bert_dynamo_opset20.onnx", "disabled", runs=1, warmup=0, sequence_length=16)
    assert result.inputs["input_ids"] == "int64[1, 16]"
