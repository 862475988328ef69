"""The CUDA backend (CuPy, runtime/backends/cuda.py) and onnxruntime-style provider selection.

On a machine with CuPy and a CUDA device: every fixture model at every level, and the fusion
patterns whose fused kernels the fixtures do not reach (FusedMatMul, QuickGelu, FusedConv with
Clip), run on the GPU against onnxruntime's CPU provider with all its optimizations off (the
oracle of tests/oracle.py), and so does each fused contrib op's one-launch CUDA kernel
(runtime/kernels/cuda_fused.py), optional outputs and every mask kind included, with a check
that the one-launch path ran. Tolerances are the oracle's fp32 ones, rtol 1e-3 and atol 1e-4:
CuPy's cuBLAS products stay in full float32 (TF32 only when CUPY_TF32=1 is set, which these
tests assume is not). Those tests skip, saying GPU/CUDA, where CuPy or a device is missing.

Everywhere: reading a providers list, falling back to CPU only when the list names it, the
error when CuPy is missing, and that the runtime never imports CuPy unless CUDA is asked for.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from runtime import InferenceSession, SessionOptions
from runtime.backends import numpy_backend
from runtime.backends.cuda import CudaUnavailableError, cuda_backend
from runtime.kernels import cuda_fused
from runtime.kernels.registry import find_kernel
from runtime.providers import ProviderFallbackWarning, provider_names
from tests.models import patterns
from tests.oracle import ATOL, MODELS, RTOL, fixture_feeds, run_onnxruntime
from tests.runtime.contrib_cases import embed_inputs as contrib_embed_inputs
from tests.runtime.contrib_cases import masks as contrib_masks

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
        pytest.skip(reason=f"no usable CUDA device for the GPU tests: {error}")
    if count < 1:
        pytest.skip(reason="no CUDA device for the GPU tests")
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


# --- fused CUDA kernels (runtime/kernels/cuda_fused.py; on the GPU) ---------------------------
# Each fused contrib op runs through its kernel class on the CUDA backend, one node at a time,
# against onnxruntime's CPU provider on the same node; `fused_calls` tells that the one-launch
# path ran, not the array path that every case would otherwise still pass through.

MS = "com.microsoft"
F, I32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
_ELEM = {np.dtype(np.float32): F, np.dtype(np.float16): onnx.TensorProto.FLOAT16, np.dtype(np.int32): I32}
FUSED_LAUNCHERS = ("skip_layer_norm", "rms_norm", "layer_norm", "embed_layer_norm", "gelu", "quick_gelu", "attention", "masked_softmax")


@pytest.fixture
def fused_calls(cupy, monkeypatch):
    """How often each cuda_fused launcher ran, by name."""
    calls = collections.Counter()

    def counting(name, launch):
        def counted(*args, **kwargs):
            calls[name] += 1
            return launch(*args, **kwargs)

        return counted

    for name in FUSED_LAUNCHERS:
        monkeypatch.setattr(cuda_fused, name, counting(name, getattr(cuda_fused, name)))
    return calls


def _rand(*shape, scale=1.0, seed=0, dtype=np.float32):
    return (np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale).astype(dtype)


def _one_node(op_type, inputs, outputs, domain, opset, attrs):
    """A one-node model; `inputs` maps name -> array or None (an omitted optional input), as
    `outputs` maps name -> element type with "" for an omitted optional output."""
    names = [name if value is not None else "" for name, value in inputs.items()]
    while names and not names[-1]:
        names.pop()
    node = onnx.helper.make_node(op_type, names, [name for name, _ in outputs], domain=domain, **attrs)
    graph = onnx.helper.make_graph(
        [node],
        "one_node",
        [onnx.helper.make_tensor_value_info(n, _ELEM[v.dtype], v.shape) for n, v in inputs.items() if v is not None],
        [onnx.helper.make_tensor_value_info(n, elem, None) for n, elem in outputs if n],
    )
    opsets = [onnx.helper.make_opsetid("", opset if domain == "" else 17), onnx.helper.make_opsetid(MS, 1)]
    return onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run_on_cuda(cupy, model, inputs):
    node = ir.from_proto(model).graph[0]
    opset = {domain: version for domain, version in ir.from_proto(model).opset_imports.items()}[node.domain]
    kernel = find_kernel(node.domain, node.op_type, opset)(node, opset, cuda_backend())
    args = [cupy.asarray(inputs[v.name]) if v is not None and v.name else None for v in node.inputs]
    results = kernel.run(*args)
    return [result for result, value in zip(results, node.outputs, strict=False) if value.name]


def _check_on_cuda(
    cupy, op_type, inputs, outputs=(("Y", F),), domain=MS, opset=1, rtol=RTOL, atol=ATOL, oracle_inputs=None, **attrs
):
    """Our kernel on CUDA against onnxruntime's CPU provider, every requested output;
    `oracle_inputs`, where given, are what onnxruntime gets instead (the same computation)."""
    model = _one_node(op_type, inputs, list(outputs), domain, opset, attrs)
    reference = inputs if oracle_inputs is None else oracle_inputs
    expected = run_onnxruntime(
        _one_node(op_type, reference, list(outputs), domain, opset, attrs),
        {n: v for n, v in reference.items() if v is not None},
    )
    got = _run_on_cuda(cupy, model, inputs)
    assert len(got) == len(expected)
    for (name, want), actual in zip(expected.items(), got, strict=True):
        assert isinstance(actual, cupy.ndarray), f"{op_type} output {name} is {type(actual).__name__}"
        actual = cupy.asnumpy(actual)
        assert actual.dtype == want.dtype and actual.shape == want.shape, f"{op_type} output {name}"
        np.testing.assert_allclose(actual, want, rtol=rtol, atol=atol, err_msg=f"{op_type} output {name}")


SKIP_OUTPUTS = [("Y", F), ("mean", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]


@pytest.mark.parametrize("skip_shape", [(2, 16, 768), (1, 16, 768), (16, 768)])
@pytest.mark.parametrize(("with_beta", "with_bias"), [(True, True), (False, True), (True, False)])
def test_skip_layer_norm_on_cuda_is_one_launch(cupy, fused_calls, skip_shape, with_beta, with_bias):
    inputs = {
        "input": _rand(2, 16, 768, scale=2),
        "skip": _rand(*skip_shape, seed=1),
        "gamma": _rand(768, seed=2),
        "beta": _rand(768, seed=3) if with_beta else None,
        "bias": _rand(768, seed=4) if with_bias else None,
    }
    _check_on_cuda(cupy, "SkipLayerNormalization", inputs, SKIP_OUTPUTS, epsilon=1e-5)
    assert fused_calls["skip_layer_norm"] == 1


@pytest.mark.parametrize(
    "outputs", [SKIP_OUTPUTS[:1], [SKIP_OUTPUTS[0], ("", F), ("", F), SKIP_OUTPUTS[3]], SKIP_OUTPUTS[:2]]
)
def test_skip_layer_norm_on_cuda_optional_outputs(cupy, fused_calls, outputs):
    inputs = {"input": _rand(1, 8, 40), "skip": _rand(1, 8, 40, seed=1), "gamma": _rand(40, seed=2)}
    _check_on_cuda(cupy, "SkipLayerNormalization", inputs, outputs)  # default epsilon 1e-12
    assert fused_calls["skip_layer_norm"] == 1


@pytest.mark.parametrize("with_bias", [True, False])
def test_skip_simplified_layer_norm_on_cuda(cupy, fused_calls, with_bias):
    inputs = {
        "input": _rand(2, 16, 64, scale=2),
        "skip": _rand(2, 16, 64, seed=1),
        "gamma": _rand(64, seed=2),
        "bias": _rand(64, seed=4) if with_bias else None,
    }
    outputs = [("Y", F), ("", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]
    _check_on_cuda(cupy, "SkipSimplifiedLayerNormalization", inputs, outputs, epsilon=1e-6)
    assert fused_calls["skip_layer_norm"] == 1


@pytest.mark.parametrize("axis", [-1, 2, 1])
def test_simplified_layer_norm_on_cuda(cupy, fused_calls, axis):
    x = _rand(2, 3, 4, 6, scale=3)
    inputs = {"X": x, "scale": _rand(*x.shape[axis:], seed=5)}
    outputs = [("Y", F), ("inv_std_var", F)]
    _check_on_cuda(cupy, "SimplifiedLayerNormalization", inputs, outputs, domain="", opset=17, axis=axis)
    assert fused_calls["rms_norm"] == 1


@pytest.mark.parametrize("with_stats", [False, True], ids=["Y", "Y, mean, inv_std"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization_on_cuda_is_one_launch(cupy, fused_calls, axis, with_bias, with_stats):
    x = _rand(2, 6, 64, scale=3)
    inputs = {"X": x, "Scale": _rand(*x.shape[axis:], seed=5), "B": _rand(*x.shape[axis:], seed=6) if with_bias else None}
    outputs = [("Y", F)] + ([("Mean", F), ("InvStdDev", F)] if with_stats else [])
    _check_on_cuda(cupy, "LayerNormalization", inputs, outputs, domain="", opset=17, axis=axis, epsilon=1e-5)
    assert fused_calls["layer_norm"] == 1


def embed_inputs(mask=True, segment=True, position_ids_shape=None):
    """test_kernels_contrib's EmbedLayerNormalization inputs, at a width with several warps a row."""
    return contrib_embed_inputs(mask, segment, position_ids_shape, hidden=96)


@pytest.mark.parametrize(("mask", "segment"), [(True, True), (False, False)])
@pytest.mark.parametrize("position_ids_shape", [None, (2, 5), (1, 5)])
def test_embed_layer_norm_on_cuda_is_one_launch(cupy, fused_calls, mask, segment, position_ids_shape):
    inputs = embed_inputs(mask, segment, position_ids_shape)
    outputs = [("output", F), ("mask_index", I32), ("embedding_sum", F)]
    _check_on_cuda(cupy, "EmbedLayerNormalization", inputs, outputs, epsilon=1e-5)
    assert fused_calls["embed_layer_norm"] == 1


@pytest.mark.parametrize(("field", "message"), [("input_ids", "input_ids"), ("position_ids", "position_ids")])
def test_embed_layer_norm_on_cuda_rejects_out_of_range_ids(cupy, fused_calls, field, message):
    inputs = embed_inputs(position_ids_shape=(2, 5))
    inputs[field][1, 2] = 20
    model = _one_node("EmbedLayerNormalization", inputs, [("output", F), ("mask_index", I32)], MS, 1, {})
    with pytest.raises(ValueError, match=rf"{message} out of range"):
        _run_on_cuda(cupy, model, inputs)
    assert fused_calls["embed_layer_norm"] == 1  # the kernel found it; the array path named it


# (op, domain, opset, inputs, attributes, launcher)
GELU_CASES = {
    "gelu": ("Gelu", MS, 1, {"X": _rand(2, 16, 64, scale=3)}, {}, "gelu"),
    "bias_gelu": ("BiasGelu", MS, 1, {"A": _rand(2, 16, 64, scale=3), "B": _rand(64, seed=1)}, {}, "gelu"),
    "fast_gelu": ("FastGelu", MS, 1, {"X": _rand(2, 16, 64, scale=3)}, {}, "gelu"),
    "bias_fast_gelu": ("FastGelu", MS, 1, {"X": _rand(2, 16, 64, scale=3), "bias": _rand(64, seed=2)}, {}, "gelu"),
    "quick_gelu": ("QuickGelu", MS, 1, {"X": _rand(4, 32, scale=40)}, {}, "quick_gelu"),
    "quick_gelu_alpha": ("QuickGelu", MS, 1, {"X": _rand(4, 32, scale=40)}, {"alpha": -0.5}, "quick_gelu"),
    "onnx_gelu": ("Gelu", "", 20, {"X": _rand(2, 16, 64, scale=3)}, {}, "gelu"),
    "onnx_gelu_tanh": ("Gelu", "", 20, {"X": _rand(2, 16, 64, scale=3)}, {"approximate": "tanh"}, "gelu"),
}


@pytest.mark.parametrize("case", list(GELU_CASES))
def test_gelus_on_cuda_are_one_launch(cupy, fused_calls, case):
    op, domain, opset, inputs, attrs, launcher = GELU_CASES[case]
    _check_on_cuda(cupy, op, inputs, domain=domain, opset=opset, **attrs)
    assert fused_calls[launcher] == 1


@pytest.mark.parametrize("case", ["bias_gelu", "onnx_gelu_tanh"])
def test_gelus_on_cuda_take_float16(cupy, fused_calls, case):
    """float16 in, float16 out, computed in float32 and rounded once: within one float16
    rounding (2**-11, about 4.9e-4 relative) of onnxruntime's float32 result on the same values,
    hence rtol 1e-3 here."""
    op, domain, opset, inputs, attrs, _ = GELU_CASES[case]
    narrow = {name: value.astype(np.float16) for name, value in inputs.items()}
    model = _one_node(op, {n: v.astype(np.float32) for n, v in narrow.items()}, [("Y", F)], domain, opset, attrs)
    want = next(iter(run_onnxruntime(model, {n: v.astype(np.float32) for n, v in narrow.items()}).values()))
    got = _run_on_cuda(cupy, _one_node(op, narrow, [("Y", onnx.TensorProto.FLOAT16)], domain, opset, attrs), narrow)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float32), want, rtol=1e-3, atol=ATOL)
    assert fused_calls["gelu"] == 1


BATCH, SEQ, HIDDEN, HEADS = 2, 40, 32, 4  # 40 keys: each warp lane takes two columns of a score row


def masks(past=0):
    """Every mask_index format ORT's CPU Attention takes (test_kernels_contrib's set), at this
    file's sizes."""
    return contrib_masks(BATCH, SEQ, past)


@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_on_cuda_masks(cupy, fused_calls, mask_name, unidirectional):
    inputs = {
        "input": _rand(BATCH, SEQ, HIDDEN),
        "weights": _rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": _rand(3 * HIDDEN, seed=2),
        "mask_index": masks()[mask_name],
    }
    _check_on_cuda(cupy, "Attention", inputs, num_heads=HEADS, unidirectional=unidirectional)
    assert fused_calls["attention"] == 1


@pytest.mark.parametrize(
    "variant", ["no_bias", "scale", "qkv_hidden_sizes", "attention_bias", "batch_attention_bias", "filter_value"]
)
def test_attention_on_cuda_attributes(cupy, fused_calls, variant):
    dv = 16 if variant == "qkv_hidden_sizes" else HIDDEN
    bias_shape = {"attention_bias": (1, HEADS, SEQ, SEQ), "batch_attention_bias": (BATCH, 1, SEQ, SEQ)}
    inputs = {
        "input": _rand(BATCH, SEQ, HIDDEN),
        "weights": _rand(HIDDEN, 2 * HIDDEN + dv, scale=0.5, seed=1),
        "bias": None if variant == "no_bias" else _rand(2 * HIDDEN + dv, seed=2),
        "mask_index": masks()["2d_raw"],
        "past": None,
        "attention_bias": _rand(*bias_shape[variant], seed=3) if variant in bias_shape else None,
    }
    attrs = {"num_heads": HEADS}
    if variant == "scale":
        attrs["scale"] = 0.3
    if variant == "qkv_hidden_sizes":
        attrs["qkv_hidden_sizes"] = [HIDDEN, HIDDEN, dv]
    if variant == "filter_value":
        attrs["mask_filter_value"] = -1e4 / 3
    # onnxruntime 1.30's CPU Attention crashes (segfault) without a bias; a zero bias is the same sum.
    oracle = dict(inputs, bias=np.zeros(3 * HIDDEN, np.float32)) if variant == "no_bias" else None
    _check_on_cuda(cupy, "Attention", inputs, oracle_inputs=oracle, **attrs)
    assert fused_calls["attention"] == 1


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("with_past", [True, False])
def test_attention_on_cuda_past_and_present(cupy, fused_calls, unidirectional, with_past):
    past_len = 3 if with_past else 0
    inputs = {
        "input": _rand(BATCH, SEQ, HIDDEN),
        "weights": _rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": _rand(3 * HIDDEN, seed=2),
        "mask_index": masks(past=past_len)["2d_raw"],
        "past": _rand(2, BATCH, HEADS, past_len, HIDDEN // HEADS, seed=4) if with_past else None,
    }
    outputs = [("Y", F), ("present", F)]
    _check_on_cuda(cupy, "Attention", inputs, outputs, num_heads=HEADS, unidirectional=unidirectional)
    assert fused_calls["attention"] == 1


def test_attention_on_cuda_4d_mask_takes_the_fused_softmax_only(cupy, fused_calls):
    """A 4-D (Megatron) mask is no case of the one-call path; the array path builds the
    additive mask and `_attend` still softmaxes in one launch. ORT's CPU kernel refuses 4-D
    masks, so the oracle is ORT on the equivalent 3-D mask."""
    past_len, max_len = 2, SEQ + 4
    four_d = (np.random.default_rng(3).random((BATCH, 1, max_len, max_len)) > 0.3).astype(np.int32)
    four_d[:, :, :, 0] = 1
    inputs = {
        "input": _rand(BATCH, SEQ, HIDDEN),
        "weights": _rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": _rand(3 * HIDDEN, seed=2),
        "mask_index": four_d,
        "past": _rand(2, BATCH, HEADS, past_len, HIDDEN // HEADS, seed=4),
    }
    outputs = [("Y", F), ("present", F)]
    got = _run_on_cuda(cupy, _one_node("Attention", inputs, outputs, MS, 1, {"num_heads": HEADS}), inputs)
    three_d = dict(inputs, mask_index=np.ascontiguousarray(four_d[:, 0, past_len : past_len + SEQ, : past_len + SEQ]))
    model = _one_node("Attention", three_d, outputs, MS, 1, {"num_heads": HEADS})
    for actual, want in zip(got, run_onnxruntime(model, three_d).values(), strict=True):
        np.testing.assert_allclose(cupy.asnumpy(actual), want, rtol=RTOL, atol=ATOL)
    assert fused_calls["attention"] == 0 and fused_calls["masked_softmax"] == 1


@pytest.mark.parametrize("variant", ["padding_mask", "attention_bias", "unidirectional"])
def test_multi_head_attention_on_cuda_takes_the_fused_softmax(cupy, fused_calls, variant):
    kv_seq = 37
    lengths = np.array([kv_seq - 5, kv_seq], np.int32)
    inputs = {
        "query": _rand(BATCH, SEQ, HIDDEN),
        "key": _rand(BATCH, kv_seq, HIDDEN, seed=1),
        "value": _rand(BATCH, kv_seq, HIDDEN, seed=2),
        "bias": _rand(3 * HIDDEN, seed=3),
        "key_padding_mask": (np.arange(kv_seq)[None, :] < lengths[:, None]).astype(np.int32),
        "attention_bias": _rand(BATCH, HEADS, SEQ, kv_seq, seed=4) if variant == "attention_bias" else None,
    }
    attrs = {"num_heads": HEADS, "unidirectional": int(variant == "unidirectional")}
    _check_on_cuda(cupy, "MultiHeadAttention", inputs, **attrs)
    assert fused_calls["masked_softmax"] == 1


def test_bert_on_cuda_runs_its_fused_ops_as_fused_launches(cupy, fused_calls):
    path = MODELS / "bert_dynamo_opset20.onnx"
    model = onnx.load(path)
    session = InferenceSession(path, SessionOptions(graph_optimization_level="all"), providers=["CUDAExecutionProvider"])
    _assert_matches_onnxruntime(session, model, fixture_feeds(model))
    layers = 2
    assert fused_calls["embed_layer_norm"] == 1
    assert fused_calls["attention"] == layers
    assert fused_calls["skip_layer_norm"] == 2 * layers
    assert fused_calls["gelu"] == layers  # BiasGelu
