"""The CUDA backend (CuPy, runtime/backends/cuda.py) and onnxruntime-style provider selection.

On a machine with CuPy and a CUDA device: every fixture model at every level, and the fusion
patterns whose fused kernels the fixtures do not reach (FusedMatMul, QuickGelu, FusedConv with
Clip), run on the GPU against onnxruntime's CPU provider with all its optimizations off (the
oracle of tests/oracle.py). Tolerances are the oracle's fp32 ones, rtol 1e-3 and atol 1e-4:
CuPy's cuBLAS products stay in full float32 (TF32 only when CUPY_TF32=1 is set, which these
tests assume is not). Those tests skip, saying GPU/CUDA, where CuPy or a device is missing.

Everywhere: reading a providers list, falling back to CPU only when the list names it, the
error when CuPy is missing, and that the runtime never imports CuPy unless CUDA is asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from runtime import InferenceSession, SessionOptions
from runtime.backends import numpy_backend
from runtime.backends.cuda import CudaUnavailableError, cuda_backend
from runtime.providers import ProviderFallbackWarning, provider_names
from tests.models import patterns
from tests.oracle import ATOL, MODELS, RTOL, fixture_feeds, run_onnxruntime

LEVELS = ["disabled", "basic", "extended", "layout", "all"]
FIXTURES = sorted(path.name for path in MODELS.glob("*.onnx"))
TINY = MODELS / "resnet_tiny_opset17.onnx"
BOTH = ["CUDAExecutionProvider", "CPUExecutionProvider"]
ROOT = Path(__file__).resolve().parents[2]


def _assert_matches_onnxruntime(session: InferenceSession, model: onnx.ModelProto, feeds: dict) -> None:
    want = run_onnxruntime(model, feeds)
    got = session.run(None, feeds)
    assert [output.name for output in session.get_outputs()] == list(want)
    for (name, expected), actual in zip(want.items(), got, strict=True):
        assert type(actual) is np.ndarray, f"output {name} came back as {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"output {name}"
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=f"output {name}")


@pytest.fixture(scope="module")
def cupy():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed: no CUDA backend to test (GPU test)")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        pytest.skip(f"no usable CUDA device for the GPU tests: {error}")
    if count < 1:
        pytest.skip("no CUDA device for the GPU tests")
    return cupy


@pytest.fixture
def without_cupy(monkeypatch):
    """CuPy made unimportable, as on a machine that never installed it."""
    monkeypatch.setitem(sys.modules, "cupy", None)


# --- reading providers (everywhere) ----------------------------------------------------------


def test_provider_names_take_onnxruntime_and_trace_spellings_and_empty_option_pairs():
    listed = ["CUDAExecutionProvider", ("CPUExecutionProvider", {}), "FusionwatchCUDA", ["FusionwatchCPU", None]]
    assert provider_names(listed) == [
        "CUDAExecutionProvider", "CPUExecutionProvider", "FusionwatchCUDA", "FusionwatchCPU",
    ]


@pytest.mark.parametrize(
    ("providers", "message"),
    [
        (["TensorrtExecutionProvider", "CPUExecutionProvider"], "unknown execution provider 'TensorrtExecutionProvider'"),
        ([("CUDAExecutionProvider", {"device_id": 1})], r"provider options are not supported \(got \{'device_id': 1\}"),
        ([], "providers is empty"),
        ("CPUExecutionProvider", "a list of provider names, not str"),
        ([("CPUExecutionProvider",)], "a name or a \\(name, options\\) pair"),
    ],
)
def test_bad_provider_lists_are_errors_that_say_what_is_wrong(providers, message):
    with pytest.raises(ValueError, match=message):
        InferenceSession(TINY, providers=providers)


def test_cpu_is_the_default_and_a_listed_choice():
    feeds = fixture_feeds(onnx.load(TINY))
    default = InferenceSession(TINY)
    listed = InferenceSession(TINY, None, ["CPUExecutionProvider"])  # positional, as onnxruntime allows
    assert default.get_providers() == listed.get_providers() == ["FusionwatchCPU"]
    assert listed.backend is numpy_backend
    np.testing.assert_array_equal(listed.run(None, feeds)[0], default.run(None, feeds)[0])


def test_providers_and_backend_together_are_refused():
    with pytest.raises(ValueError, match="providers= or backend=, not both"):
        InferenceSession(TINY, providers=["CPUExecutionProvider"], backend=numpy_backend)


# --- without CuPy (everywhere; CuPy is hidden where installed) ------------------------------------


def test_missing_cupy_is_a_clear_error(without_cupy):
    with pytest.raises(CudaUnavailableError, match="the CUDA backend needs CuPy.*pip install cupy-cuda"):
        cuda_backend()


def test_cuda_alone_does_not_fall_back_without_cupy(without_cupy):
    with pytest.raises(CudaUnavailableError, match="CPUExecutionProvider was not among them.*needs CuPy"):
        InferenceSession(TINY, providers=["CUDAExecutionProvider"])


def test_cuda_then_cpu_falls_back_to_cpu_and_says_so(without_cupy):
    with pytest.warns(ProviderFallbackWarning, match="running on CPUExecutionProvider; passed over CUDAExecutionProvider"):
        session = InferenceSession(TINY, SessionOptions(graph_optimization_level="all"), providers=BOTH)
    assert session.get_providers() == ["FusionwatchCPU"]
    model = onnx.load(TINY)
    _assert_matches_onnxruntime(session, model, fixture_feeds(model))


def test_the_runtime_never_imports_cupy_unless_cuda_is_asked_for():
    script = (
        "import sys, onnx\n"
        "import runtime\n"
        "from tests.oracle import fixture_feeds\n"
        f"path = {str(TINY)!r}\n"
        "session = runtime.InferenceSession(path, providers=['CPUExecutionProvider'])\n"
        "session.run(None, fixture_feeds(onnx.load(path)))\n"
        "assert 'cupy' not in sys.modules, 'cupy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=300)


# --- on the GPU ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_on_cuda_matches_onnxruntime(cupy, fixture, level):
    model = onnx.load(MODELS / fixture)
    session = InferenceSession(
        MODELS / fixture, SessionOptions(graph_optimization_level=level), providers=["CUDAExecutionProvider"]
    )
    assert session.get_providers() == ["FusionwatchCUDA"]
    assert session.gemm_backend == "cuda"  # MKL's packed GEMM stepped aside
    _assert_matches_onnxruntime(session, model, fixture_feeds(model))


def _attention_feeds(model):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((patterns.ATTN_BATCH, patterns.ATTN_SEQ, patterns.ATTN_HIDDEN)).astype(np.float32)
    return {"x": x, "keep": patterns.attention_keep_mask()}


# (pattern, the com.microsoft op it fuses into at level all, feeds builder)
PATTERNS = {
    "erf_gelu_bias": (lambda: patterns.erf_gelu(bias=True), "BiasGelu", fixture_feeds),
    "tanh_gelu_bias": (lambda: patterns.tanh_gelu(bias=True), "FastGelu", fixture_feeds),
    "quick_gelu": (patterns.quick_gelu, "QuickGelu", fixture_feeds),
    "gemm_sigmoid": (lambda: patterns.gemm_activation("Sigmoid"), "FusedGemm", fixture_feeds),
    "conv_clip": (lambda: patterns.conv_activation("Clip", clip=(0.0, 6.0)), "FusedConv", fixture_feeds),
    "matmul_scale": (patterns.matmul_scale, "FusedMatMul", fixture_feeds),
    "matmul_transpose": (patterns.matmul_transpose, "FusedMatMul", fixture_feeds),
    "attention_packed": (lambda: patterns.self_attention(qkv="packed"), "Attention", _attention_feeds),
    "skip_layer_norm": (patterns.skip_layer_norm, "SkipLayerNormalization", fixture_feeds),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_fused_kernel_on_cuda_matches_onnxruntime(cupy, name):
    build, fused_op, feeds_for = PATTERNS[name]
    model = build()
    # onnx.helper stamps its newest IR version (14 with onnx 1.23), which an onnxruntime older
    # than its onnx refuses (the GPU image: onnxruntime 1.30 reads up to 13); these graphs need 10.
    model.ir_version = min(model.ir_version, 10)
    session = InferenceSession(model, SessionOptions(graph_optimization_level="all"), providers=BOTH)
    assert session.get_providers() == ["FusionwatchCUDA"]
    assert fused_op in {step.node.op_type for step in session.plan.steps}
    _assert_matches_onnxruntime(session, model, feeds_for(model))


def test_cuda_keeps_weights_on_the_device(cupy):
    session = InferenceSession(TINY, providers=["CUDAExecutionProvider"])
    weights = [value for value in session.plan.template if value is not None]
    assert weights and all(isinstance(value, cupy.ndarray) for value in weights)


def test_cuda_is_chosen_without_a_warning_when_it_can_start(cupy):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = InferenceSession(TINY, providers=BOTH)
    assert session.get_providers() == ["FusionwatchCUDA"]


def test_cuda_profile_names_the_provider(cupy, tmp_path):
    options = SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "cuda"))
    session = InferenceSession(MODELS / "bert_dynamo_opset20.onnx", options, providers=BOTH)
    model = onnx.load(MODELS / "bert_dynamo_opset20.onnx")
    session.run(None, fixture_feeds(model))
    events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [event for event in events if event["cat"] == "Node"]
    assert nodes and {event["args"]["provider"] for event in nodes} == {"FusionwatchCUDA"}
    assert {"session_initialization", "SequentialExecutor::Execute", "model_run"} <= {e["name"] for e in events}


def test_no_cuda_device_is_a_clear_error_and_a_fallback(cupy, monkeypatch):
    def no_device():
        raise cupy.cuda.runtime.CUDARuntimeError(100)  # cudaErrorNoDevice

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", no_device)
    with pytest.raises(CudaUnavailableError, match="found no usable CUDA device"):
        InferenceSession(TINY, providers=["CUDAExecutionProvider"])
    with pytest.warns(ProviderFallbackWarning, match="found no usable CUDA device"):
        session = InferenceSession(TINY, providers=BOTH)
    assert session.get_providers() == ["FusionwatchCPU"]
