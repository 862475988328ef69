"""The measured choice of kernel libraries (runtime/kernel_choice.py): which shapes are timed,
that the fastest candidate is used and cached per machine, and that the session and its profile
say what was chosen and why. Timings are replaced by fixed numbers where a test needs a winner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions, kernel_choice
from runtime.kernels import gemm, libraries, onednn, onednn_matmul, openmp
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
    # With Intel OpenMP loadable, each OpenMP library races once per wait of its workers, and
    # the winner's wait is the session's.
    fastest = "onednn/spin" if openmp.settable() else "onednn"
    calls = []
    monkeypatch.setattr(
        kernel_choice,
        "race_libraries",
        lambda c, s, m, rounds=None: calls.append(s) or {x: (1.0 if x == fastest else 5.0) for x in c},
    )
    monkeypatch.setattr(kernel_choice, "MIN_MEASURED_GEMM_FLOPS", 0)
    model = _matmul_model([64, 256], 256, 512)
    first = InferenceSession(model, SessionOptions(graph_optimization_level="disabled"))
    assert first.kernel_choices.gemm.library == first.gemm_backend == "onednn"
    assert (
        f"{fastest} 1.00 ms" in first.kernel_choices.gemm.reason
        and "measured now" in first.kernel_choices.gemm.reason
    )
    if openmp.settable():
        assert set(first.kernel_choices.gemm.timings_ms) >= {"onednn/sleep", "onednn/spin", "numpy"}
        assert first.kernel_choices.wait.library == "spin" and first.kernel_choices.libraries()["wait"] == "spin"
        assert "gemm on onednn" in first.kernel_choices.wait.reason
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
    monkeypatch.setattr(kernel_choice, "race_libraries", lambda c, s, m, rounds=None: seen.append(s) or {x: 1.0 for x in c})
    session = InferenceSession(
        _matmul_model([3, 4], 4, 2), SessionOptions(graph_optimization_level="disabled")
    )
    assert seen == [kernel_choice.REFERENCE_GEMM_SHAPES]
    assert "BERT-base's" in session.kernel_choices.gemm.reason
    assert session.gemm_backend == kernel_choice.gemm_candidates()[0]  # a tie goes to the first


def test_a_measurement_runs_every_candidate():
    # Real timings, one round, BERT-base's shapes cut down so the test stays quick.
    shapes = [(16, 64, 96, 2)]
    entrants = kernel_choice.with_waits(kernel_choice.gemm_candidates())
    timings = kernel_choice.race_libraries(entrants, shapes, kernel_choice.time_gemm)
    assert set(timings) == set(entrants) and all(t > 0 for t in timings.values())
    assert {kernel_choice.split(e)[0] for e in entrants} == set(kernel_choice.gemm_candidates())


@pytest.mark.skipif(
    not openmp.settable(), reason="no intel-openmp wheel (the mkl extra), or KMP_BLOCKTIME set in the environment"
)
def test_a_sessions_wait_holds_for_its_runs_only():
    # libiomp5 keeps the blocktime per thread: a session sets its choice for the block it runs,
    # then puts back what was there, so another session in the process keeps its own.
    runtime = openmp.load()
    before = runtime.kmp_get_blocktime()
    with libraries.using({"wait": "spin"}):
        assert runtime.kmp_get_blocktime() == openmp.BLOCKTIME_MS["spin"]
        with libraries.using({"wait": "sleep"}):
            assert runtime.kmp_get_blocktime() == 0
        assert runtime.kmp_get_blocktime() == openmp.BLOCKTIME_MS["spin"]
    assert runtime.kmp_get_blocktime() == before
    with pytest.raises(ValueError, match="candidates"):
        with libraries.using({"wait": "forever"}):
            pass


_WITH_THE_USERS_BLOCKTIME = """
from runtime import kernel_choice
from runtime.kernels import openmp
print(kernel_choice.with_waits(["onednn", "numpy"]))
with openmp.waiting("spin"):
    print(openmp.load().kmp_get_blocktime())
"""


@pytest.mark.skipif(not openmp.available(), reason="the intel-openmp wheel (the mkl extra) is not installed")
def test_a_blocktime_the_user_set_is_neither_raced_nor_overridden():
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _WITH_THE_USERS_BLOCKTIME], capture_output=True, text=True, check=True,
        env={**os.environ, "KMP_BLOCKTIME": "7"},
    )  # fmt: skip
    assert done.stdout.split("\n")[:2] == ["['onednn', 'numpy']", "7"]


_THREADS_AFTER_EACH_LIBRARY = """
import os, numpy as np
from runtime.kernels import gemm, onednn, onednn_matmul
onednn.available()  # oneDNN loads first, before MKL, as a model with convolutions only has it
from runtime.threads import limit_blas_threads
limit_blas_threads(2)
a = np.ones((256, 256), np.float32)
gemm.matmul_packed(a, gemm.PackedWeight(a))
after_mkl = len(os.listdir("/proc/self/task"))
onednn_matmul.MatMulWeight(a).matmul(a)
print(after_mkl, len(os.listdir("/proc/self/task")))
"""


@needs_onednn
@pytest.mark.skipif(not openmp.available(), reason="the intel-openmp wheel (the mkl extra) is not installed")
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc to count threads in (not Linux)")
def test_onednn_runs_on_the_intel_openmp_pool():
    # oneDNN's GNU OpenMP calls bind to libiomp5 (loaded first, globally), so its products run
    # on the worker MKL's started, and the wait a session sets reaches them: no new thread.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _THREADS_AFTER_EACH_LIBRARY], capture_output=True, text=True, check=True
    )
    after_mkl, after_onednn = (int(n) for n in done.stdout.split())
    assert after_mkl >= 2 and after_onednn == after_mkl


class _RaceClock:
    """The race's clock in tests: time passes only by what the entrants' calls say they took, so
    every timing is exact and no load on the machine can reorder the entrants."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _entrants(seconds):
    """Race entrants whose calls take `seconds(entrant, call number)` on the returned clock (the
    first call is number 1), the count of calls each made, and the clock."""
    clock = _RaceClock()
    counts: dict[str, int] = {}

    def make_call(library, shape):
        def call():
            counts[library] = counts.get(library, 0) + 1
            clock.now += seconds(library, counts[library])

        return call

    return counts, make_call, clock


def test_the_race_goes_by_the_typical_call_not_the_luckiest(monkeypatch):
    # "erratic" is the fastest in one timed call of six and slower otherwise, as OpenBLAS's
    # spinning threads were on the loaded machine; "steady" always takes the same time. By its
    # best call erratic would win; a session pays for the typical call, so "steady" must win.
    monkeypatch.setattr(kernel_choice, "ROUNDS", 6)
    monkeypatch.setattr(kernel_choice, "_SETTLE_S", 0.0)
    # per round, one call that wakes the threads and one timed: call 12 is the sixth timed one
    counts, make_call, clock = _entrants(
        lambda library, n: 0.004 if library == "steady" else 0.001 if n == 12 else 0.006
    )
    timings = kernel_choice.race_libraries(["erratic", "steady"], [(1, 1, 1, 2)], make_call, clock=clock)
    assert counts == {"erratic": 12, "steady": 12}  # the lucky call was timed
    assert timings == {"steady": pytest.approx(8.0), "erratic": pytest.approx(12.0)}  # counted twice


def test_the_race_goes_by_the_lower_quartile_so_a_slow_spell_in_half_the_rounds_does_not_decide(monkeypatch):
    # "spelled" ran in a slow spell of the host for its last 4 rounds of 8 (as the Zen 5 VM's
    # rounds did, for every entrant alike); "steady" is always 20% slower than spelled's fast
    # rounds. By the median (15 ms) spelled would lose; by the lower quartile it wins, as its fast
    # rounds say.
    monkeypatch.setattr(kernel_choice, "ROUNDS", 8)
    monkeypatch.setattr(kernel_choice, "_SETTLE_S", 0.0)
    monkeypatch.setattr(kernel_choice, "_CLOSE", 0.0)
    # the last 4 rounds are calls 9-16 (2 a round)
    counts, make_call, clock = _entrants(
        lambda library, n: 0.012 if library == "steady" else 0.020 if n > 8 else 0.010
    )
    timings = kernel_choice.race_libraries(["spelled", "steady"], [(1, 1, 1, 1)], make_call, clock=clock)
    assert counts == {"spelled": 16, "steady": 16}
    assert timings == {"spelled": pytest.approx(10.0), "steady": pytest.approx(12.0)}


def test_an_entrant_far_behind_stops_after_two_rounds(monkeypatch):
    # "slow" takes 4x "quick"'s time: after a round in each order it is out, its time the lower
    # quartile of the rounds it ran; "close" (1.25x) runs all six.
    monkeypatch.setattr(kernel_choice, "ROUNDS", 6)
    monkeypatch.setattr(kernel_choice, "_SETTLE_S", 0.0)
    pause = {"quick": 0.004, "close": 0.005, "slow": 0.016}
    counts, make_call, clock = _entrants(lambda library, n: pause[library])
    timings = kernel_choice.race_libraries(["quick", "close", "slow"], [(1, 1, 1, 1)], make_call, clock=clock)
    # per round, one call that wakes the threads and one timed
    assert counts == {"quick": 12, "close": 12, "slow": 4}
    assert timings == {"quick": pytest.approx(4.0), "close": pytest.approx(5.0), "slow": pytest.approx(16.0)}


def test_a_close_call_races_as_many_rounds_again(monkeypatch):
    # "first" and "second" take the same time, a call closer than _CLOSE (5%): both race six more
    # rounds; "fourth", 6% behind the fastest, and "third", 80% behind, stop with the six.
    monkeypatch.setattr(kernel_choice, "ROUNDS", 6)
    monkeypatch.setattr(kernel_choice, "_SETTLE_S", 0.0)
    assert kernel_choice._CLOSE == 0.05
    pause = {"first": 0.010, "second": 0.010, "third": 0.018, "fourth": 0.0106}
    counts, make_call, clock = _entrants(lambda library, n: pause[library])
    timings = kernel_choice.race_libraries(list(pause), [(1, 1, 1, 1)], make_call, clock=clock)
    # per round, one call that wakes the threads and one timed
    assert counts == {"first": 24, "second": 24, "third": 12, "fourth": 12}
    assert timings == {name: pytest.approx(1e3 * seconds) for name, seconds in pause.items()}


def test_gemm_race_times_the_pass_after_each_product(monkeypatch):
    # The one-thread pass a model runs after a product is part of what is timed (see
    # `_time_gemm`): its output, not only the product's, is written by the call.
    passes = []
    original = kernel_choice.compiled.bias_gelu_rows
    monkeypatch.setattr(
        kernel_choice.compiled, "bias_gelu_rows", lambda x, b, out: passes.append(x.shape) or original(x, b, out)
    )
    kernel_choice.time_gemm("numpy", (16, 64, 96, 1))()
    assert passes == [(16, 96)]


def test_fixed_libraries_are_not_measured_and_unknown_ones_refused(monkeypatch):
    monkeypatch.setattr(kernel_choice, "race_libraries", lambda *a: pytest.fail("measured a fixed library"))
    options = SessionOptions(
        graph_optimization_level="disabled", kernel_libraries={"gemm": "numpy", "conv": "numpy"}
    )
    session = InferenceSession(_matmul_model([64, 256], 256, 512), options)
    assert session.kernel_choices.libraries() == {"gemm": "numpy", "conv": "numpy", "wait": "sleep"}
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
    assert conv.library in ("onednn", "numpy")
    assert {kernel_choice.split(entrant)[0] for entrant in conv.timings_ms} == {"onednn", "numpy"}
    assert "convolutions" in conv.reason and conv.shapes
    # Every convolution of the model is timed, each distinct one once, weighted by its count (a
    # race over the three largest chose im2col for ResNet-50, whose other 50 run faster on oneDNN).
    nodes = [node for node in session.model.graph if node.op_type == "NhwcFusedConv"]
    assert sum(shape[-1] for shape in conv.shapes) == len(nodes)
    assert f"{len(conv.shapes)} distinct channels-last convolutions ({len(nodes)} nodes)" in conv.reason


def _nhwc_conv_model(strides_per_node):
    """Chained 8-channel NhwcFusedConv nodes on a (1, 16, 16, 8) input, one per given stride."""
    nodes, initializers, value_infos = [], [], []
    name, size = "x", 16
    for index, stride in enumerate(strides_per_node):
        weight = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), f"w{index}")
        initializers.append(weight)
        out = f"y{index}"
        nodes.append(
            helper.make_node("NhwcFusedConv", [name, f"w{index}"], [out], domain="com.microsoft",
                             strides=[stride, stride], pads=[1, 1, 1, 1], activation="Relu")
        )  # fmt: skip
        size = (size - 1) // stride + 1
        value_infos.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, size, size, 8]))
        name = out
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)], initializer=initializers,
        value_info=value_infos[:-1],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ir.from_proto(model)


def test_distinct_convolutions_are_timed_once_each_weighted_by_count():
    # Two stride-1 convolutions of one shape are one entry counted twice; the stride-2 one is
    # its own entry, its work counted on its output (a quarter of its input's positions).
    model = _nhwc_conv_model([1, 1, 2])
    found = kernel_choice.conv_nodes(model)
    assert len(found) == 2
    by_stride = {node.attributes["strides"].value[0]: (node, shape, count) for node, shape, count in found}
    assert by_stride[1][1:] == ((1, 16, 16, 8), 2) and by_stride[2][1:] == ((1, 16, 16, 8), 1)
    # two nodes of 16x16 outputs against one of 8x8
    assert kernel_choice.conv_flops(*by_stride[1]) == 8 * kernel_choice.conv_flops(*by_stride[2])
    assert found[0] == by_stride[1]  # the costliest share first
    assert gemm.backend_name() in ("mkl-packed", "numpy")  # outside the session: the default again


def test_a_gpu_backend_makes_no_cpu_library_choice():
    choices = kernel_choice.choose(None, threads=2, backend_name="cuda")
    assert choices.gemm.library == "cuda" and choices.libraries() == {}


@pytest.mark.parametrize(("numpy_ms", "winner"), [(9.5, "onednn"), (8.0, "numpy")])
@needs_onednn
def test_numpy_must_win_by_ten_percent(monkeypatch, numpy_ms, winner):
    monkeypatch.setattr(kernel_choice, "gemm_candidates", lambda: ["onednn", "numpy"])
    monkeypatch.setattr(
        kernel_choice, "race_libraries", lambda c, s, m, rounds=None: {x: numpy_ms if x == "numpy" else 10.0 for x in c}
    )
    session = InferenceSession(_matmul_model([3, 4], 4, 2), SessionOptions(graph_optimization_level="disabled"))
    assert session.gemm_backend == winner and "must win by 10%" in session.kernel_choices.gemm.reason


@needs_onednn
def test_with_one_thread_numpy_wins_on_time_alone(monkeypatch):
    """One thread: OpenBLAS has no workers to spin between products, so no 10% to make up."""
    monkeypatch.setattr(kernel_choice, "gemm_candidates", lambda: ["onednn", "numpy"])
    monkeypatch.setattr(
        kernel_choice, "race_libraries", lambda c, s, m, rounds=None: {x: 9.5 if x == "numpy" else 10.0 for x in c}
    )
    options = SessionOptions(graph_optimization_level="disabled", intra_op_num_threads=1)
    session = InferenceSession(_matmul_model([3, 4], 4, 2), options)
    assert session.gemm_backend == "numpy" and "must win" not in session.kernel_choices.gemm.reason
