"""The measured choice of kernel libraries (runtime/kernel_choice.py): which shapes are timed,
that the fastest candidate is used and cached per machine, and that the session and its profile
say what was chosen and why. Timings are replaced by fixed numbers where a test needs a winner."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions, kernel_choice
from runtime.kernels import gemm, onednn, onednn_matmul
from tests.oracle import MODELS, fixture_feeds, run_onnxruntime

rng = np.random.default_rng(0)
# oneDNN comes from the onednn extra's wheel, which exists for x86_64 Linux only.
needs_onednn = pytest.mark.skipif(
    not onednn.available(), reason=f"oneDNN is not loadable on this machine: {onednn.unavailable_reason()}"
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONWATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_choice, "ROUNDS", 1)


def _matmul_model(a_shape, k, n, op="MatMul", **attrs):
    w = rng.standard_normal((n, k) if attrs.get("transB") else (k, n)).astype(np.float32)
    node = helper.make_node(op, ["a", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "choice",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_cpu_info_names_the_model_and_its_vector_extensions():
    cpu = kernel_choice.cpu_info()
    assert cpu.model and cpu.vendor
    if Path("/proc/cpuinfo").is_file() and "avx2" in Path("/proc/cpuinfo").read_text():
        assert "avx2" in cpu.extensions and "avx2" in str(cpu)


@pytest.mark.parametrize(
    ("a_shape", "op", "attrs", "expected"),
    [
        ([2, 5, 48], "MatMul", {}, (10, 48, 33)),
        ([9, 48], "Gemm", {"transB": 1}, (9, 48, 33)),
        (["batch", "seq", 48], "MatMul", {}, (128, 48, 33)),  # symbolic: a typical 128 rows
    ],
)
def test_gemm_shapes_are_the_products_against_constant_weights(a_shape, op, attrs, expected):
    session = InferenceSession(
        _matmul_model(a_shape, 48, 33, op, **attrs), SessionOptions(graph_optimization_level="disabled")
    )
    assert kernel_choice.gemm_shapes(session.model) == [(*expected, 1)]


@needs_onednn
def test_fastest_candidate_is_chosen_cached_and_used(monkeypatch):
    candidates = kernel_choice.gemm_candidates()
    fake = {c: (1.0 if c == "onednn" else 5.0) for c in candidates}
    calls = []
    monkeypatch.setattr(kernel_choice, "_race", lambda c, s, m: calls.append(s) or fake)
    monkeypatch.setattr(kernel_choice, "MIN_MEASURED_GEMM_FLOPS", 0)
    model = _matmul_model([64, 256], 256, 512)
    first = InferenceSession(model, SessionOptions(graph_optimization_level="disabled"))
    assert first.kernel_choices.gemm.library == first.gemm_backend == "onednn"
    assert (
        "onednn 1.00 ms" in first.kernel_choices.gemm.reason
        and "measured now" in first.kernel_choices.gemm.reason
    )
    assert first.kernel_choices.gemm.shapes == [[64, 256, 512, 1]]
    (step,) = first.plan.steps
    assert isinstance(step.kernel.packed, onednn_matmul.MatMulWeight)
    a = rng.standard_normal((64, 256)).astype(np.float32)
    np.testing.assert_allclose(
        first.run(None, {"a": a})[0], run_onnxruntime(model, {"a": a})["y"], rtol=1e-3, atol=1e-4
    )
    second = InferenceSession(model, SessionOptions(graph_optimization_level="disabled"))
    assert len(calls) == 1, "the second session reads the cache"
    assert "cached in" in second.kernel_choices.gemm.reason and second.gemm_backend == "onednn"


def test_small_models_get_the_machines_choice_on_reference_shapes(monkeypatch):
    seen = []
    monkeypatch.setattr(kernel_choice, "_race", lambda c, s, m: seen.append(s) or {x: 1.0 for x in c})
    session = InferenceSession(
        _matmul_model([3, 4], 4, 2), SessionOptions(graph_optimization_level="disabled")
    )
    assert seen == [kernel_choice.REFERENCE_GEMM_SHAPES]
    assert "BERT-base's" in session.kernel_choices.gemm.reason
    assert session.gemm_backend == kernel_choice.gemm_candidates()[0]  # a tie goes to the first


def test_a_measurement_runs_every_candidate():
    # Real timings, one round, BERT-base's shapes cut down so the test stays quick.
    shapes = [(16, 64, 96, 2)]
    timings = kernel_choice._race(kernel_choice.gemm_candidates(), shapes, kernel_choice._time_gemm)
    assert set(timings) == set(kernel_choice.gemm_candidates()) and all(t > 0 for t in timings.values())


def test_the_race_goes_by_the_typical_call_not_the_luckiest(monkeypatch):
    # "erratic" is the fastest in one call of six and slow otherwise, as OpenBLAS's spinning
    # threads were on the loaded machine; "steady" always takes the same time. A session pays
    # for the typical call, so "steady" must win, and the timings must say so.
    monkeypatch.setattr(kernel_choice, "ROUNDS", 6)
    monkeypatch.setattr(kernel_choice, "_SETTLE_S", 0.0)
    counts = {"erratic": 0, "steady": 0}

    def make_call(library, shape):
        def call():
            counts[library] += 1
            fast = library == "erratic" and counts[library] % 6 == 0
            time.sleep(0.001 if fast else 0.012 if library == "erratic" else 0.004)

        return call

    timings = kernel_choice._race(["erratic", "steady"], [(1, 1, 1, 2)], make_call)
    assert timings["steady"] < timings["erratic"]
    assert timings["erratic"] >= 2 * 0.012 * 1e3 * 0.9  # the median call, counted twice


def test_gemm_race_times_the_pass_after_each_product(monkeypatch):
    # The one-thread pass a model runs after a product is part of what is timed (see
    # `_time_gemm`): its output, not only the product's, is written by the call.
    passes = []
    original = kernel_choice.compiled.bias_gelu_rows
    monkeypatch.setattr(
        kernel_choice.compiled, "bias_gelu_rows", lambda x, b, out: passes.append(x.shape) or original(x, b, out)
    )
    kernel_choice._time_gemm("numpy", (16, 64, 96, 1))()
    assert passes == [(16, 96)]


def test_fixed_libraries_are_not_measured_and_unknown_ones_refused(monkeypatch):
    monkeypatch.setattr(kernel_choice, "_race", lambda *a: pytest.fail("measured a fixed library"))
    options = SessionOptions(
        graph_optimization_level="disabled", kernel_libraries={"gemm": "numpy", "conv": "numpy"}
    )
    session = InferenceSession(_matmul_model([64, 256], 256, 512), options)
    assert session.kernel_choices.libraries() == {"gemm": "numpy", "conv": "numpy"}
    assert session.kernel_choices.gemm.reason == "set by SessionOptions.kernel_libraries"
    with pytest.raises(ValueError, match="candidates"):
        InferenceSession(_matmul_model([3, 4], 4, 2), SessionOptions(kernel_libraries={"gemm": "blis"}))


def test_profile_trace_records_the_choices(tmp_path):
    options = SessionOptions(
        graph_optimization_level="disabled",
        enable_profiling=True,
        profile_file_prefix=str(tmp_path / "p"),
        kernel_libraries={"gemm": "numpy"},
    )
    session = InferenceSession(_matmul_model([3, 4], 4, 2), options)
    trace = json.loads(Path(session.end_profiling()).read_text())
    [init] = [e for e in trace if e["name"] == "session_initialization"]
    choices = init["args"]["kernel_choices"]
    assert (
        choices["gemm"]["library"] == "numpy" and choices["cpu"]["model"] == session.kernel_choices.cpu.model
    )
    assert choices["conv"]["library"] in ("onednn", "numpy")


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is x86_64 Linux only")
@pytest.mark.parametrize("conv", ["onednn", "numpy"])
def test_resnet_fixture_matches_onnxruntime_on_either_convolution_library(conv):
    model = onnx.load(MODELS / "resnet_tiny_opset17.onnx")
    feeds = fixture_feeds(model)
    options = SessionOptions(graph_optimization_level="all", kernel_libraries={"conv": conv})
    ours = InferenceSession(model, options)
    assert ours.kernel_choices.conv.library == conv
    expected = run_onnxruntime(model, feeds)
    for mine, (name, theirs) in zip(ours.run(None, feeds), expected.items(), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-3, atol=1e-4, err_msg=name)


@needs_onednn
def test_convolutions_are_timed_on_the_models_own_nodes(monkeypatch):
    model = onnx.load(MODELS / "resnet_tiny_opset17.onnx")  # a symbolic batch: timed at 1
    session = InferenceSession(model, SessionOptions(graph_optimization_level="all"))
    conv = session.kernel_choices.conv
    assert conv.library in ("onednn", "numpy") and set(conv.timings_ms) == {"onednn", "numpy"}
    assert "convolutions" in conv.reason and conv.shapes
    assert gemm.backend_name() in ("mkl-packed", "numpy")  # outside the session: the default again


def test_a_gpu_backend_makes_no_cpu_library_choice():
    choices = kernel_choice.choose(None, threads=2, backend_name="cuda")
    assert choices.gemm.library == "cuda" and choices.libraries() == {}


@pytest.mark.parametrize(("numpy_ms", "winner"), [(9.5, "onednn"), (8.0, "numpy")])
@needs_onednn
def test_numpy_must_win_by_ten_percent(monkeypatch, numpy_ms, winner):
    monkeypatch.setattr(kernel_choice, "gemm_candidates", lambda: ["onednn", "numpy"])
    monkeypatch.setattr(kernel_choice, "_race", lambda c, s, m: {"onednn": 10.0, "numpy": numpy_ms})
    session = InferenceSession(_matmul_model([3, 4], 4, 2), SessionOptions(graph_optimization_level="disabled"))
    assert session.gemm_backend == winner and "must win by 10%" in session.kernel_choices.gemm.reason
