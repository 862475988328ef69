"""InferenceSession's onnxruntime-shaped surface: options, inputs/outputs, feeds, fetches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, InvalidFeedError, InvalidOutputNameError, NodeArg, SessionOptions
from runtime.options import normalize_level
from tests.runtime.runtime_toy_kernels import TOY_KERNELS
from tests.runtime.test_executor import make_model, mlp_model, ort_run, tensor

FLOAT = TensorProto.FLOAT


def session(model, **options):
    options.setdefault("graph_optimization_level", "disabled")
    return InferenceSession(model, SessionOptions(**options), extra_kernels=TOY_KERNELS)


def symbolic_model():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["y"], name="add"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    b = numpy_helper.from_array(np.arange(8, dtype=np.float32), "b")
    return make_model(
        nodes,
        [tensor("x", ["batch", 4, 8])],
        [tensor("y", ["batch", 4, 8]), tensor("z", ["batch", 4, 8])],
        [b],
    )


@pytest.mark.parametrize(
    "spelling, level",
    [
        ("all", "all"),
        ("Extended", "extended"),
        ("ORT_ENABLE_ALL", "all"),
        ("ORT_ENABLE_EXTENDED", "extended"),
        ("ORT_ENABLE_BASIC", "basic"),
        ("ORT_ENABLE_LAYOUT", "layout"),
        ("ORT_DISABLE_ALL", "disabled"),
        (onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC, "basic"),
        (onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL, "disabled"),
    ],
)
def test_level_spellings(spelling, level):
    assert normalize_level(spelling) == level
    assert SessionOptions(graph_optimization_level=spelling).level == level


def test_bad_options_are_rejected_with_the_choices():
    with pytest.raises(ValueError, match="unknown graph_optimization_level 'max'.*ORT_ENABLE_ALL"):
        SessionOptions(graph_optimization_level="max")
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        SessionOptions(intra_op_num_threads=-1)
    options = SessionOptions()
    options.graph_optimization_level = "fastest"  # ORT-style assignment after construction
    with pytest.raises(ValueError, match="'fastest'"):
        InferenceSession(mlp_model(), options, extra_kernels=TOY_KERNELS)


def test_inputs_and_outputs_match_onnxruntime(tmp_path):
    model = symbolic_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    ours = session(str(path))
    theirs = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    as_tuples = lambda args: [(a.name, a.shape, a.type) for a in args]  # noqa: E731
    assert (
        as_tuples(ours.get_inputs())
        == as_tuples(theirs.get_inputs())
        == [("x", ["batch", 4, 8], "tensor(float)")]
    )
    assert as_tuples(ours.get_outputs()) == as_tuples(theirs.get_outputs())
    assert ours.get_inputs()[0] == NodeArg("x", ["batch", 4, 8], "tensor(float)")
    assert ours.get_providers() == ["FusionwatchCPU"]


def test_output_names_select_and_order_outputs():
    model = symbolic_model()
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    ours = session(model)
    y, z = ort_run(model, {"x": x})
    z_ours, y_ours = ours.run(["z", "y"], {"x": x})
    np.testing.assert_allclose(z_ours, z, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(y_ours, y, rtol=1e-3, atol=1e-4)
    assert len(ours.run(["z"], {"x": x})) == 1
    with pytest.raises(
        InvalidOutputNameError,
        match=r"unknown output name\(s\) \['q'\]; the model's outputs are \['y', 'z'\]",
    ):
        ours.run(["q"], {"x": x})


def test_feed_errors_name_the_input_and_what_was_expected():
    ours = session(symbolic_model())
    good = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(
        InvalidFeedError,
        match=r"missing input\(s\) \['x'\]; the model's inputs are \['x'\], the feed has \[\]",
    ):
        ours.run(None, {})
    with pytest.raises(InvalidFeedError, match=r"unknown input name\(s\) \['bogus'\]"):
        ours.run(None, {"x": good, "bogus": good})
    with pytest.raises(InvalidFeedError, match=r"input 'x': expected tensor\(float\), got tensor\(double\)"):
        ours.run(None, {"x": good.astype(np.float64)})
    with pytest.raises(
        InvalidFeedError, match=r"input 'x': expected rank 3 \(shape \['batch', 4, 8\]\), got rank 2"
    ):
        ours.run(None, {"x": good[0]})
    with pytest.raises(InvalidFeedError, match=r"input 'x': dimension 2 is 7, expected 8"):
        ours.run(None, {"x": np.zeros((2, 4, 7), np.float32)})
    assert all(issubclass(e, ValueError) for e in (InvalidFeedError, InvalidOutputNameError))


def test_symbolic_dimensions_accept_any_size():
    ours = session(symbolic_model())
    for batch in (1, 3):
        x = np.ones((batch, 4, 8), np.float32)
        assert ours.run(["z"], {"x": x})[0].shape == (batch, 4, 8)


@pytest.mark.parametrize("level", ["disabled", "all"])
def test_a_dimension_declared_minus_one_accepts_any_size_as_onnxruntime_does(level):
    """Some exporters write -1 for "any" (onnxruntime's cloud_models/addf.onnx, shape-add.onnx); the
    input's Shape must not fold to -1 either."""
    x = helper.make_tensor_value_info("x", FLOAT, [2, -1])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2])
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    assert ours.get_inputs()[0].shape == [2, None]
    for width in (1, 5):
        assert ours.run(None, {"x": np.zeros((2, width), np.float32)})[0].tolist() == [2, width]


def test_an_onnxruntime_op_in_a_model_that_does_not_import_its_domain_runs_as_onnxruntime_runs_it():
    """Hand-made graphs (onnxruntime's embed_layer_norm_format3.onnx) use com.microsoft ops without
    importing the domain; onnxruntime reads them at version 1, and so do we."""
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", FLOAT, [2, 3])
    node = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_allclose(session(model).run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-3, atol=1e-4)


def test_onnx_domain_imported_as_ai_onnx_is_read_as_the_default_domain():
    """onnxruntime's attention_past_state.u8s8.onnx imports "ai.onnx" (the default domain's other
    name): its MatMulInteger was refused, and a rule's new Gemm imported "" again at version 1."""
    from optimizer import optimize

    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", FLOAT, [2, 3])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx", 13)])
    assert dict(optimize(model, level="extended").model.opset_imports) == {"": 13}
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32)}
    for level in ("disabled", "extended"):
        ours = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
        np.testing.assert_allclose(ours.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-3, atol=1e-4)


def test_extended_level_fuses_and_still_matches_onnxruntime(tmp_path):
    bias = numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "bias")
    nodes = [
        helper.make_node("Add", ["x", "bias"], ["h"], name="add"),
        helper.make_node("Gelu", ["h"], ["y"], name="gelu"),
    ]
    model = make_model(nodes, [tensor("x", [2, 8])], [tensor("y", [2, 8])], [bias], opset=20)
    optimized_path = tmp_path / "optimized.onnx"
    ours = session(
        model, graph_optimization_level="ORT_ENABLE_EXTENDED", optimized_model_filepath=str(optimized_path)
    )
    assert ours.optimize_result.report.fusions == {"com.microsoft.BiasGelu": 1}
    assert [step.node.op_type for step in ours.plan.steps] == ["BiasGelu"]
    assert [n.op_type for n in onnx.load(optimized_path).graph.node] == ["BiasGelu"]
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(ours.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-3, atol=1e-4)

    unfused = session(model, graph_optimization_level="extended", disabled_optimizers=["BiasGeluFusion"])
    assert unfused.optimize_result.report.fusions == {}
    assert [step.node.op_type for step in unfused.plan.steps] == ["Add", "Gelu"]


def test_an_ir_model_is_not_rewritten_by_the_session():
    bias = numpy_helper.from_array(np.ones(8, np.float32), "bias")
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Gelu", ["h"], ["y"])]
    model = ir.serde.deserialize_model(
        make_model(nodes, [tensor("x", [2, 8])], [tensor("y", [2, 8])], [bias], opset=20)
    )
    fused = session(model, graph_optimization_level="extended")
    assert [n.op_type for n in fused.model.graph] == ["BiasGelu"]
    assert [n.op_type for n in model.graph] == ["Add", "Gelu"]


def test_model_from_bytes_and_from_proto():
    model = mlp_model()
    x = np.ones((1, 16, 64), np.float32)
    expected = ort_run(model, {"x": x})[0]
    for source in (model, model.SerializeToString()):
        np.testing.assert_allclose(session(source).run(None, {"x": x})[0], expected, rtol=1e-3, atol=1e-4)


def test_unreadable_model_is_a_load_error(tmp_path):
    from optimizer import ModelLoadError

    with pytest.raises(ModelLoadError, match="no such model file"):
        session(str(tmp_path / "missing.onnx"))
    with pytest.raises(ModelLoadError, match="<bytes>: not a readable ONNX model"):
        session(b"\x00not a model")


def test_outputs_are_owned_by_the_caller():
    # y is an initializer passed straight through; z is a feed passed through Identity.
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"])],
        "g",
        [tensor("x", [3])],
        [tensor("w", [3]), tensor("z", [3])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    ours = session(model)
    x = np.zeros(3, np.float32)
    weight, z = ours.run(None, {"x": x})
    weight[:] = 100
    np.testing.assert_array_equal(ours.run(None, {"x": x})[0], [0, 1, 2])


def test_intra_op_threads_limits_blas():
    from threadpoolctl import threadpool_info

    ours = session(mlp_model(), intra_op_num_threads=1)
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == 1 for pool in blas)
    assert ours.run(None, {"x": np.ones((1, 16, 64), np.float32)})[0].shape == (1, 16, 8)


@pytest.mark.parametrize("fixture", ["bert_torchscript_opset14", "gpt2_dynamo_opset20"])
def test_real_fixture_with_registered_kernels_matches_onnxruntime(fixture, tmp_path):
    """The registered kernel families (not the toy ones) on an exported model, unoptimized."""
    path = Path(__file__).parents[1] / "models" / f"{fixture}.onnx"
    options = SessionOptions(
        graph_optimization_level="disabled", enable_profiling=True, profile_file_prefix=str(tmp_path / "p")
    )
    ours = InferenceSession(str(path), options)
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in ours.get_inputs():
        shape = [dim if isinstance(dim, int) else 2 if "batch" in str(dim) else 16 for dim in arg.shape]
        assert arg.type == "tensor(int64)", arg
        feeds[arg.name] = np.ones(shape, np.int64) if "mask" in arg.name else rng.integers(0, 2, shape)
    expected = ort_run(onnx.load(path), feeds)
    for mine, theirs in zip(ours.run(None, feeds), expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-3, atol=1e-4)
    stats = ours.memory_stats()
    assert stats.released_early == stats.intermediate_values - len(ours.get_outputs())
    # Releasing after last use keeps the peak far below everything the run allocates.
    trace = json.loads(Path(ours.end_profiling()).read_text())
    allocated = sum(int(e["args"]["output_size"]) for e in trace if e["cat"] == "Node")
    assert 0 < stats.peak_bytes < allocated / 4, (stats.peak_bytes, allocated)


def test_run_watching_hands_over_intermediates_as_onnxruntime_gives_them_as_outputs(tmp_path):
    """Every node output of the fixture, watched in one run, equals onnxruntime's with the same
    tensors marked as graph outputs; watching keeps nothing alive but what the sink keeps."""
    path = Path(__file__).resolve().parents[1] / "models" / "bert_torchscript_opset14.onnx"
    model = onnx.load(str(path))
    session = InferenceSession(path, SessionOptions(graph_optimization_level="disabled"))
    feeds = {"input_ids": np.arange(16, dtype=np.int64).reshape(2, 8), "attention_mask": np.ones((2, 8), np.int64),
             "token_type_ids": np.zeros((2, 8), np.int64)}
    names = [value.name for node in session.model.graph for value in node.outputs]
    watched: dict[str, np.ndarray] = {}
    session.run_watching(names, feeds, watched.__setitem__)
    assert set(watched) == set(names)
    marked = [n for n in names if n not in {o.name for o in model.graph.output}][:40]
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in marked)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(marked, feeds)
    for name, want in zip(marked, expected, strict=True):
        np.testing.assert_allclose(watched[name], want, rtol=1e-3, atol=1e-4, err_msg=name)
    with pytest.raises(InvalidOutputNameError, match="no value named"):
        session.run_watching(["no/such/tensor"], feeds, watched.__setitem__)
