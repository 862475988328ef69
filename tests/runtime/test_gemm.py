"""MKL's packed SGEMM (runtime/kernels/gemm.py) and oneDNN's matmul (runtime/kernels/onednn_matmul.py)
against numpy, the kernels that use them against onnxruntime, and the numpy fallback when MKL is
absent. Sessions here fix the GEMM library (SessionOptions.kernel_libraries) rather than let the
machine's measurement pick one, so each library's path is tested on every machine.

`make test` installs the `mkl` extra, so on x86_64 MKL must be there: its absence fails here
rather than silently testing only the fallback.
"""

from __future__ import annotations

import platform

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import InferenceSession, SessionOptions
from runtime.kernels import gemm, onednn, onednn_matmul
from tests.oracle import MODELS, fixture_feeds, run_onnxruntime

RTOL, ATOL = 1e-3, 1e-4
# Sums over K = 3000 terms of products of standard normals reach ~50 in magnitude, and a float32
# sum of that length differs between BLAS libraries by up to ~1e-5 relative to the largest terms.
RTOL_LONG, ATOL_LONG = 1e-3, 2e-3
X86 = platform.machine().lower() in ("x86_64", "amd64")

rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def products_of_every_size_on_the_libraries(request, monkeypatch):
    """The shapes here are small; the libraries' paths are what these tests are about, so products
    below gemm.SMALL_PRODUCT go to them too, unless a test asks for `real_small_product`."""
    if "real_small_product" not in request.fixturenames:
        monkeypatch.setattr(gemm, "SMALL_PRODUCT", 0)


@pytest.fixture
def real_small_product(monkeypatch):
    """gemm.SMALL_PRODUCT as the runtime has it in a fresh process. The limit's factor is process-wide
    (`gemm.set_threads`): a one-thread session an earlier test created in this process triples it."""
    monkeypatch.setattr(gemm, "_small_factor", 1)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_mkl_is_available_on_x86_64():
    if X86:
        assert gemm.available(), gemm.unavailable_reason()
        assert gemm.backend_name() == "mkl-packed"  # outside a session: MKL where installed
    else:
        assert not gemm.available() and "x86_64" in gemm.unavailable_reason()


needs_mkl = pytest.mark.skipif(not X86, reason="MKL exists for x86_64 only")


@needs_mkl
@pytest.mark.parametrize("m", [1, 2, 7, 128, 2048])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (33, 17), (1, 5), (768, 3072), (3072, 7)])
@pytest.mark.parametrize("trans", [False, True])
def test_packed_product_matches_numpy(m, k, n, trans):
    """One packing (at M = 128) serves every M."""
    a, b = normal(m, k), normal(k, n)
    packed = gemm.PackedWeight(np.ascontiguousarray(b.T) if trans else b, trans=trans)
    assert (packed.k, packed.n) == (k, n)
    np.testing.assert_allclose(gemm.matmul_packed(a, packed), a @ b, rtol=RTOL_LONG, atol=ATOL_LONG)


@needs_mkl
def test_packed_product_flattens_leading_dimensions():
    a, b = normal(2, 3, 5, 40), normal(40, 24)
    y = gemm.matmul_packed(a, gemm.PackedWeight(b))
    assert y.shape == (2, 3, 5, 24)
    np.testing.assert_allclose(y, a @ b, rtol=RTOL, atol=ATOL)
    strided = normal(6, 80)[:, ::2]  # a non-contiguous A is copied first
    np.testing.assert_allclose(
        gemm.matmul_packed(strided, gemm.PackedWeight(b)), strided @ b, rtol=RTOL, atol=ATOL
    )


@needs_mkl
def test_packed_product_rejects_a_mismatched_a():
    packed = gemm.PackedWeight(normal(8, 4))
    with pytest.raises(ValueError, match="K = 8"):
        gemm.matmul_packed(normal(3, 9), packed)
    with pytest.raises(ValueError, match="float64"):
        gemm.matmul_packed(np.ones((3, 8)), packed)
    with pytest.raises(ValueError, match="2-D float32"):
        gemm.PackedWeight(np.ones((3, 8)))


@needs_mkl
@pytest.mark.parametrize(
    ("a", "b"),
    [
        (normal(3, 5), normal(5, 7)),
        (normal(2, 4, 16, 8), normal(2, 4, 8, 16)),
        (normal(2, 4, 16, 8), normal(2, 4, 16, 8).transpose(0, 1, 3, 2)),  # attention's q k^T
        (normal(8, 3).T, normal(8, 5)),  # Gemm's transA
        (normal(2, 9, 12), normal(12, 6)),  # a 2-D B against a batch of rows
        (normal(0, 4), normal(4, 3)),
        (normal(3, 0), normal(0, 4)),
        (normal(4, 16)[:, ::2], normal(8, 3)),  # neither contiguous nor a transpose: copied
        (normal(2, 4, 8), normal(1, 8, 3)),  # broadcast batch
        (normal(3, 5, 8), normal(2, 1, 8, 6)),  # broadcast batch, ranks differ (Conv's weight)
        (normal(1, 5, 8), normal(2, 3, 8, 6)),
        (normal(2, 6, 3, 5).transpose(0, 2, 1, 3), normal(2, 5, 3, 4).transpose(0, 2, 1, 3)),  # unfused heads
    ],
)
def test_mkl_product_matches_numpy(a, b):
    y = gemm.matmul(a, b)
    assert y is not None and y.shape == (a @ b).shape
    np.testing.assert_allclose(y, a @ b, rtol=RTOL, atol=ATOL)


@needs_mkl
@pytest.mark.parametrize(
    ("a", "b"),
    [
        (normal(4, 8), normal(8)),  # vector
        (normal(4, 8).astype(np.float64), normal(8, 3)),
        (normal(2, 4, 8), normal(3, 8, 2)),  # batches that do not broadcast: numpy's error
    ],
)
def test_mkl_product_declines_what_numpy_must_do(a, b):
    assert gemm.matmul(a, b) is None
    try:
        expected = np.matmul(a, b)
    except ValueError as error:
        with pytest.raises(ValueError, match=str(error)[:20]):
            gemm.product(np, a, b)
    else:
        np.testing.assert_allclose(gemm.product(np, a, b), expected, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- kernels in a session


def _model(node, inputs, initializers, outputs, domain=""):
    graph = helper.make_graph([node], "gemm_case", inputs, outputs, initializer=initializers)
    imports = [helper.make_opsetid("", 17)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


LIBRARIES = ["mkl-packed", "onednn"] if X86 else ["numpy"]


def _session(model, library=LIBRARIES[0]):
    options = SessionOptions(graph_optimization_level="disabled", kernel_libraries={"gemm": library})
    return InferenceSession(model, options)


def _kernel(session):
    (step,) = session.plan.steps
    return step.kernel


def _check(model, feeds, packed_expected, rtol=RTOL, atol=ATOL, library=LIBRARIES[0]):
    ours = _session(model, library)
    assert ours.gemm_backend == library
    packed = _kernel(ours).packed
    assert (packed is not None) == packed_expected
    if packed is not None:
        assert isinstance(packed, onednn_matmul.MatMulWeight if library == "onednn" else gemm.PackedWeight)
    expected = run_onnxruntime(model, feeds)
    for mine, (name, theirs) in zip(ours.run(None, feeds), expected.items(), strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        np.testing.assert_allclose(mine, theirs, rtol=rtol, atol=atol, err_msg=name)


def matmul_model(a_shape, w, as_graph_input=False):
    node = helper.make_node("MatMul", ["a", "w"], ["y"])
    inputs = [_float("a", a_shape)] + ([_float("w", list(w.shape))] if as_graph_input else [])
    return _model(node, inputs, [numpy_helper.from_array(w, "w")], [_float("y", None)])


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("a_shape", [[1, 48], [7, 48], [2, 5, 48], [2, 3, 4, 48]])
def test_matmul_with_a_constant_weight_runs_packed(a_shape, library):
    w = normal(48, 33)
    _check(matmul_model(a_shape, w), {"a": normal(*a_shape)}, packed_expected=X86, library=library)


@needs_mkl
@pytest.mark.parametrize("library", LIBRARIES)
def test_small_products_run_on_numpy_and_larger_ones_packed(library, monkeypatch, real_small_product):
    """Below gemm.SMALL_PRODUCT multiply-adds a call into a library costs more than the product."""
    packed_calls = []
    real = gemm.matmul_packed
    monkeypatch.setattr(
        gemm, "matmul_packed", lambda a, packed, out=None: packed_calls.append(a.shape) or real(a, packed, out)
    )
    w = normal(64, 64)
    ours = _session(matmul_model([None, 64], w), library)
    assert _kernel(ours).packed is not None
    small, large = normal(1, 64), normal(128, 64)  # 4,096 and 524,288 multiply-adds
    for a in (small, large):
        np.testing.assert_allclose(ours.run(None, {"a": a})[0], a @ w, rtol=RTOL, atol=ATOL)
    assert packed_calls == [(128, 64)]


def test_matmul_whose_weight_a_feed_may_replace_is_not_packed():
    w = normal(16, 8)
    model = matmul_model([4, 16], w, as_graph_input=True)
    ours = _session(model)
    assert _kernel(ours).packed is None
    a, other = normal(4, 16), normal(16, 8)
    np.testing.assert_allclose(ours.run(None, {"a": a, "w": other})[0], a @ other, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ours.run(None, {"a": a})[0], a @ w, rtol=RTOL, atol=ATOL)


def test_matmul_of_two_feeds_matches_onnxruntime():
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = _model(node, [_float("a", [2, 3, 6, 5]), _float("b", [2, 3, 5, 4])], [], [_float("y", None)])
    _check(model, {"a": normal(2, 3, 6, 5), "b": normal(2, 3, 5, 4)}, packed_expected=False)


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("fused", [False, True])
def test_gemm_with_a_constant_weight(trans_a, trans_b, fused, library):
    w = normal(24, 40) if trans_b else normal(40, 24)
    c = normal(24)
    attrs = {"alpha": 0.5, "beta": 2.0, "transA": trans_a, "transB": trans_b}
    if fused:
        node = helper.make_node(
            "FusedGemm",
            ["a", "w", "c"],
            ["y"],
            domain="com.microsoft",
            activation="LeakyRelu",
            activation_alpha=0.1,
            **attrs,
        )
    else:
        node = helper.make_node("Gemm", ["a", "w", "c"], ["y"], **attrs)
    a_shape = [40, 9] if trans_a else [9, 40]
    model = _model(
        node,
        [_float("a", a_shape)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")],
        [_float("y", None)],
        domain="com.microsoft" if fused else "",
    )
    _check(model, {"a": normal(*a_shape)}, packed_expected=X86 and not trans_a, library=library)


@pytest.mark.parametrize(
    ("attrs", "packed"),
    [({}, True), ({"transB": 1}, True), ({"alpha": 0.25}, True), ({"transA": 1}, False)],
)
def test_fused_matmul_with_a_constant_weight(attrs, packed):
    w = normal(12, 32) if attrs.get("transB") else normal(32, 12)
    a_shape = [2, 32, 6] if attrs.get("transA") else [2, 6, 32]
    node = helper.make_node("FusedMatMul", ["a", "w"], ["y"], domain="com.microsoft", **attrs)
    model = _model(
        node,
        [_float("a", a_shape)],
        [numpy_helper.from_array(w, "w")],
        [_float("y", None)],
        domain="com.microsoft",
    )
    _check(model, {"a": normal(*a_shape)}, packed_expected=X86 and packed)


def test_attention_with_constant_weights_runs_packed():
    hidden, heads = 32, 4
    node = helper.make_node(
        "Attention", ["x", "w", "b", "mask"], ["y"], domain="com.microsoft", num_heads=heads
    )
    model = _model(
        node,
        [_float("x", [2, 7, hidden]), helper.make_tensor_value_info("mask", TensorProto.INT32, [2, 7])],
        [
            numpy_helper.from_array(normal(hidden, 3 * hidden), "w"),
            numpy_helper.from_array(normal(3 * hidden), "b"),
        ],
        [_float("y", None)],
        domain="com.microsoft",
    )
    mask = np.ones((2, 7), np.int32)
    mask[1, 5:] = 0
    _check(model, {"x": normal(2, 7, hidden), "mask": mask}, packed_expected=X86)


# ---------------------------------------------------------------- the numpy fallback


def test_without_mkl_or_onednn_kernels_fall_back_to_numpy(monkeypatch):
    monkeypatch.setattr(gemm, "available", lambda: False)
    monkeypatch.setattr(onednn, "available", lambda: False)
    assert gemm.backend_name() == "numpy"
    w = normal(48, 20)
    model = matmul_model([2, 5, 48], w)
    ours = InferenceSession(model, SessionOptions(graph_optimization_level="disabled"))
    assert ours.gemm_backend == "numpy" and _kernel(ours).packed is None
    a = normal(2, 5, 48)
    assert gemm.matmul(a, w) is None
    _check(model, {"a": a}, packed_expected=False, library="numpy")


def test_a_library_this_process_cannot_load_is_refused(monkeypatch):
    monkeypatch.setattr(gemm, "available", lambda: False)
    with pytest.raises(ValueError, match="not loadable here"):
        _session(matmul_model([3, 4], normal(4, 2)), "mkl-packed")


def test_gemm_backend_is_the_measured_choice():
    ours = InferenceSession(matmul_model([3, 4], normal(4, 2)))
    assert ours.gemm_backend == ours.kernel_choices.gemm.library
    assert ours.gemm_backend in (LIBRARIES + ["numpy"])


@pytest.mark.skipif(not X86, reason="MKL exists for x86_64 only")
def test_intra_op_threads_reach_mkl():
    InferenceSession(matmul_model([3, 4], normal(4, 2)), SessionOptions(intra_op_num_threads=1))
    assert gemm.max_threads() == 1
    InferenceSession(matmul_model([3, 4], normal(4, 2)), SessionOptions(intra_op_num_threads=2))
    assert gemm.max_threads() == 2


# ---------------------------------------------------------------- whole fixtures


@pytest.mark.parametrize(
    "fixture",
    ["bert_torchscript_opset14", "bert_dynamo_opset20", "gpt2_torchscript_opset14", "gpt2_dynamo_opset20"],
)
@pytest.mark.parametrize("library", [*LIBRARIES, "numpy"])
def test_fixture_at_level_all_matches_onnxruntime(fixture, library):
    model = onnx.load(MODELS / f"{fixture}.onnx")
    feeds = fixture_feeds(model)
    options = SessionOptions(graph_optimization_level="all", kernel_libraries={"gemm": library})
    ours = InferenceSession(model, options)
    assert ours.gemm_backend == library
    packed = [step for step in ours._executor.plan.steps if getattr(step.kernel, "packed", None) is not None]
    assert bool(packed) == (library != "numpy")
    expected = run_onnxruntime(model, feeds)
    for mine, (name, theirs) in zip(ours.run(None, feeds), expected.items(), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL, err_msg=name)


# ---------------------------------------------------------------- oneDNN's matmul


needs_onednn = pytest.mark.skipif(not onednn.available(), reason="oneDNN is x86_64 Linux only")


@needs_onednn
@pytest.mark.parametrize("m", [1, 7, 128])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (33, 17), (768, 3072)])
@pytest.mark.parametrize("trans", [False, True])
def test_onednn_product_matches_numpy(m, k, n, trans):
    a, b = normal(m, k), normal(k, n)
    weight = onednn_matmul.MatMulWeight(np.ascontiguousarray(b.T) if trans else b, trans=trans)
    assert (weight.k, weight.n) == (k, n)
    np.testing.assert_allclose(weight.matmul(a), a @ b, rtol=RTOL_LONG, atol=ATOL_LONG)


@needs_onednn
def test_onednn_weight_keeps_one_primitive_per_row_count():
    b = normal(40, 24)
    weight = onednn_matmul.MatMulWeight(b)
    for a in (normal(2, 3, 5, 40), normal(30, 40), normal(6, 80)[:, ::2]):  # 30 rows twice; a strided A
        np.testing.assert_allclose(weight.matmul(a), a @ b, rtol=RTOL, atol=ATOL)
    assert sorted(weight._by_rows) == [6, 30]
    assert weight.nbytes >= 2 * b.nbytes
    with pytest.raises(ValueError, match="K = 40"):
        weight.matmul(normal(3, 9))


@needs_onednn
def test_onednn_weight_stands_aside_where_onednn_is_gone(monkeypatch):
    # As in a process forked after oneDNN ran: the kernel multiplies with numpy instead.
    w = normal(48, 33)
    ours = _session(matmul_model([4, 48], w), "onednn")
    a = normal(4, 48)
    monkeypatch.setattr(onednn, "available", lambda: False)
    assert not gemm.applies(_kernel(ours).packed, a, w)
    np.testing.assert_allclose(ours.run(None, {"a": a})[0], a @ w, rtol=RTOL, atol=ATOL)


def feed_forward_model(width, inner):
    """A transformer's feed-forward product as an unfused graph has it: MatMul, then the bias Add."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["y"])]
    weights = [numpy_helper.from_array(normal(width, inner), "w"), numpy_helper.from_array(normal(inner), "bias")]
    graph = helper.make_graph(nodes, "ffn", [_float("x", [1, "seq", width])], [_float("y", None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@needs_onednn
def test_onednn_feed_forward_product_follows_the_sequence_length_and_matches_onnxruntime(real_small_product):
    # The tiny BERT's (16, 128) @ (128, 512) runs on oneDNN's compiled call (onednn_call.py), the
    # single row on numpy; every run's result is its own, whatever runs after it.
    model = feed_forward_model(128, 512)
    options = SessionOptions(
        graph_optimization_level="disabled", intra_op_num_threads=1, kernel_libraries={"gemm": "onednn"}
    )
    ours = InferenceSession(model, options)
    weight = ours.plan.steps[0].kernel.packed
    kept = []
    for seq in (16, 1, 128, 16):
        feeds = {"x": normal(1, seq, 128)}
        (mine,) = ours.run(None, feeds)
        (theirs,) = run_onnxruntime(model, feeds).values()
        np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL, err_msg=f"sequence {seq}")
        kept.append((mine, mine.copy()))
    assert sorted(weight._by_rows) == [16, 128]
    for mine, copy in kept:
        np.testing.assert_array_equal(mine, copy)


@needs_onednn
def test_a_failed_onednn_call_raises_with_its_status():
    from runtime.kernels.onednn_call import PreparedCall

    weight = onednn_matmul.MatMulWeight(normal(8, 4))
    a, out = normal(2, 8), np.empty((2, 4), np.float32)
    weight.matmul(a, out)
    primitive = weight._by_rows[2]
    no_primitive = onednn.Handle("dnnl_primitive_destroy")  # a null primitive: oneDNN refuses it
    call = PreparedCall(no_primitive, primitive._src, primitive._dst, onednn.prepared_args([]))
    with pytest.raises(onednn.OneDnnError, match="primitive_execute failed: invalid arguments"):
        call(a, out)
