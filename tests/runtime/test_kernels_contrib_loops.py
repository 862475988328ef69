"""The contrib kernels' compiled loops (runtime/kernels/compiled.py) and their fallback: on numpy
float32 with contiguous inputs the Gelus, the skip normalizations and the attention softmax run
the loops; everything else takes the array-API path. Each case pins down which path ran (a spy
on the loop) and checks both against onnxruntime.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numba
import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto

from runtime.kernels import compiled, contrib_attention, gemm
from runtime.kernels.registry import find_kernel
from tests.runtime.contrib_cases import (
    ATOL,
    ATTENTION_PATH_CASES,
    BATCH,
    HEADS,
    HIDDEN,
    KV_SEQ,
    MS,
    ROOT,
    RTOL,
    SEQ,
    SKIP_OUTPUTS,
    F,
    check,
    masks,
    mha_inputs,
    one_node_model,
    rand,
    run_ort,
    run_ours,
)

# ---------------------------------------------------------------- compiled loops and their fallback
# On numpy float32 with contiguous inputs the Gelus, the skip normalizations and the attention
# softmax run runtime/kernels/compiled.py's loops; everything else takes the array-API path.
# These cases pin down which path ran (a spy on the loop) and check both against the oracle.


@pytest.fixture
def loop_calls(monkeypatch):
    """Counts calls of each compiled loop by name; the loops still run."""
    calls = {}

    def spy(name):
        real = getattr(compiled, name)

        def counted(*args):
            calls[name] = calls.get(name, 0) + 1
            return real(*args)

        monkeypatch.setattr(compiled, name, counted)

    for name in (
        "gelu_rows",
        "bias_gelu_rows",
        "fast_gelu_rows",
        "bias_fast_gelu_rows",
        "skip_layer_norm_rows",
        "masked_softmax_heads",
        "small_attention",
    ):
        spy(name)
    return calls


def strided(array):
    """The same values as a non-contiguous view (every other element of a wider last axis)."""
    wide = np.zeros((*array.shape[:-1], 2 * array.shape[-1]), array.dtype)
    wide[..., ::2] = array
    view = wide[..., ::2]
    assert not view.flags.c_contiguous
    return view


def test_scalar_functions_of_the_loops_match_float64():
    """erf32, tanh32 and exp32 stand in for library calls; their error is what Gelu and softmax inherit."""
    grid = np.linspace(-10, 10, 20001, dtype=np.float32)
    erf = np.array([compiled.erf32(v) for v in grid])
    tanh = np.array([compiled.tanh32(v) for v in grid])
    assert np.abs(erf - [math.erf(float(v)) for v in grid]).max() < 1e-6
    assert np.abs(tanh - np.tanh(grid.astype(np.float64))).max() < 1e-6
    below_zero = np.linspace(-86.4, 0, 20001, dtype=np.float32)
    exp = np.array([compiled.exp32(v) for v in below_zero])
    relative = np.abs(exp - np.exp(below_zero.astype(np.float64))) / np.exp(below_zero.astype(np.float64))
    assert relative.max() < 1e-6
    assert compiled.exp32(np.float32(-1e4)) == 0.0
    assert compiled.exp32(np.float32(-np.inf)) == 0.0
    assert compiled.exp32(np.float32(100.0)) == np.inf


def test_gelu_loops_against_math_erf_and_tanh():
    x = np.concatenate([np.linspace(-10, 10, 40001, dtype=np.float32), np.float32([np.inf, np.nan])])
    rows = x.reshape(1, -1)
    exact, tanh_form = np.empty_like(rows), np.empty_like(rows)
    compiled.gelu_rows(rows, exact)
    compiled.fast_gelu_rows(rows, tanh_form)
    x64 = x.astype(np.float64)[:-2]
    want_exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x64])
    want_tanh = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    # float32 results of magnitude up to 10: 2 ulp there is 1.9e-6
    assert np.abs(exact[0, :-2] - want_exact).max() < 2e-6
    assert np.abs(tanh_form[0, :-2] - want_tanh).max() < 2e-6
    assert exact[0, -2] == np.inf and tanh_form[0, -2] == np.inf
    assert np.isnan(exact[0, -1]) and np.isnan(tanh_form[0, -1])


@pytest.mark.parametrize("shape", [(2, 16, 64), (3, 13), (1, 1, 13), (1, 5), (0, 4, 13)])
@pytest.mark.parametrize(
    ("op", "loop"),
    [("Gelu", "gelu_rows"), ("BiasGelu", "bias_gelu_rows"), ("FastGelu", "bias_fast_gelu_rows")],
)
def test_gelus_take_the_compiled_loop(op, loop, shape, loop_calls):
    x = rand(*shape, scale=3)
    inputs = {"X": x} if op == "Gelu" else {"X": x, "bias": rand(shape[-1], seed=1)}
    check(op, inputs)
    assert loop_calls == ({} if x.size == 0 else {loop: 1})


@pytest.mark.parametrize("op", ["Gelu", "BiasGelu", "FastGelu"])
def test_gelus_fall_back_on_strided_input(op, loop_calls):
    x = rand(2, 7, 13, scale=3)
    inputs = {"X": x} if op == "Gelu" else {"X": x, "bias": rand(13, seed=1)}
    model = one_node_model(op, inputs, [("Y", TensorProto.FLOAT)])
    expected = run_ort(model, inputs)[0]
    got = run_ours(model, {**inputs, "X": strided(x)})[0]
    assert loop_calls == {}
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("approximate", "loop"), [("none", "gelu_rows"), ("tanh", "fast_gelu_rows")])
@pytest.mark.parametrize("shape", [(2, 16, 64), (3, 13), (7,)])
def test_onnx_gelu_takes_the_contrib_gelus_loops(approximate, loop, shape, loop_calls):
    """ONNX's Gelu (opset 20, what exporters write from then on) computes com.microsoft.Gelu's and
    FastGelu's formulas: the same loops, against onnxruntime; a strided input takes the array path."""
    from onnx import helper

    x = rand(*shape, scale=3)
    node = helper.make_node("Gelu", ["X"], ["Y"], approximate=approximate)
    graph = helper.make_graph([node], "gelu", [helper.make_tensor_value_info("X", F, shape)],
                              [helper.make_tensor_value_info("Y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    kernel = find_kernel("", "Gelu", 20)(ir.from_proto(model).graph[0], 20)
    want = run_ort(model, {"X": x})[0]
    np.testing.assert_allclose(kernel.run(x)[0], want, rtol=RTOL, atol=ATOL)
    assert loop_calls == {loop: 1}
    if len(shape) > 1:
        np.testing.assert_allclose(kernel.run(strided(x))[0], want, rtol=RTOL, atol=ATOL)
        assert loop_calls == {loop: 1}


def test_fast_gelu_without_bias_takes_its_own_loop(loop_calls):
    check("FastGelu", {"X": rand(4, 13, scale=3)})
    assert loop_calls == {"fast_gelu_rows": 1}


def test_gelus_in_float64_use_the_array_path():
    """ORT's CPU Gelus are float-only, so the oracle here is the formula with math.erf / tanh."""
    x = np.linspace(-6, 6, 1001).reshape(7, 143)
    bias = np.linspace(-1, 1, 143)
    for op, want in [
        ("Gelu", np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)),
        ("BiasGelu", np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x + bias)),
    ]:
        inputs = {"X": x} if op == "Gelu" else {"X": x, "bias": bias}
        node = ir.from_proto(
            one_node_model(op, {k: v.astype(np.float32) for k, v in inputs.items()}, [("Y", F)])
        )
        kernel = find_kernel(MS, op, 1)(node.graph[0], 1)
        got = kernel.run(*inputs.values())[0]
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=op)
    y = x + bias
    fast = find_kernel(MS, "FastGelu", 1)(
        ir.from_proto(one_node_model("FastGelu", {"X": x.astype(np.float32)}, [("Y", F)])).graph[0], 1
    ).run(x, bias)[0]
    want = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
    np.testing.assert_allclose(fast, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("x_shape", "skip_shape"),
    [((2, 5, 13), (2, 5, 13)), ((2, 5, 13), (5, 13)), ((1, 1, 13), (1, 1, 13)), ((3, 4, 768), (1, 4, 768))],
)
@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_normalizations_take_the_compiled_loop(op, x_shape, skip_shape, loop_calls):
    hidden = x_shape[-1]
    inputs = {
        "input": rand(*x_shape, scale=2),
        "skip": rand(*skip_shape, seed=1),
        "gamma": rand(hidden, seed=2),
        "beta": rand(hidden, seed=3),
        "bias": rand(hidden, seed=4),
    }
    outputs = SKIP_OUTPUTS
    if op == "SkipSimplifiedLayerNormalization":
        del inputs["beta"]
        outputs = [("Y", F), ("", F), ("inv_std_var", F), ("input_skip_bias_sum", F)]
    check(op, inputs, outputs=outputs, epsilon=1e-5)
    assert loop_calls == {"skip_layer_norm_rows": 1}


def test_skip_layer_normalization_float16_takes_float32_statistics():
    # ONNX Runtime's float16 kernel sums and normalizes in float32 and rounds the output (and the
    # sum) to float16 once; so do we. Both round the same float32 results, so they differ by at
    # most one float16 ulp (2^-10 relative, ~1e-3) where the float32 values straddle a rounding
    # boundary: rtol 2e-3, atol 2e-3 for the outputs near zero. In float16 throughout, the
    # variance of these 768-wide rows at 30 +- 3 loses its digits and the check fails.
    h = np.float16
    inputs = {
        "input": (rand(2, 4, 768, scale=3) + 30).astype(h),
        "skip": rand(2, 4, 768, seed=1).astype(h),
        "gamma": rand(768, seed=2).astype(h),
        "beta": rand(768, seed=3).astype(h),
        "bias": rand(768, seed=4).astype(h),
    }
    half = TensorProto.FLOAT16
    outputs = [("Y", half), ("mean", F), ("inv_std_var", F), ("input_skip_bias_sum", half)]
    ours = check("SkipLayerNormalization", inputs, outputs=outputs, rtol=2e-3, atol=2e-3, epsilon=1e-5)
    assert [a.dtype for a in ours] == [h, np.float32, np.float32, h]


def test_skip_layer_normalization_falls_back_on_strided_input(loop_calls):
    inputs = {"input": rand(2, 5, 13), "skip": rand(2, 5, 13, seed=1), "gamma": rand(13, seed=2)}
    model = one_node_model("SkipLayerNormalization", inputs, SKIP_OUTPUTS, epsilon=1e-5)
    expected = run_ort(model, inputs)
    got = run_ours(model, {**inputs, "skip": strided(inputs["skip"])})
    assert loop_calls == {}
    for want, ours in zip(expected, got, strict=True):
        np.testing.assert_allclose(ours, want, rtol=RTOL, atol=ATOL)


def test_skip_layer_normalization_loop_keeps_precision_far_from_zero_mean():
    """Rows at 1000 +- 1: E[x^2] - mean^2 in float32 would lose the variance to cancellation.

    The oracle is float64 numpy (ORT's float kernel takes that shortcut, so it is not one here).
    """
    x = 1000 + rand(2, 3, 768)
    skip, gamma, beta = np.zeros_like(x), np.ones(768, np.float32), np.zeros(768, np.float32)
    model = one_node_model("SkipLayerNormalization", {"input": x, "skip": skip, "gamma": gamma}, [("Y", F)])
    got = run_ours(model, {"input": x, "skip": skip, "gamma": gamma, "beta": beta})[0]
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("batch", "seq", "hidden", "mask_name"),
    [(2, 6, 16, "none"), (2, 6, 16, "2d_raw"), (2, 6, 16, "3d"), (1, 1, 12, "none"), (3, 5, 20, "none")],
)
def test_attention_softmax_takes_the_compiled_loop(batch, seq, hidden, mask_name, loop_calls):
    inputs = {
        "input": rand(batch, seq, hidden),
        "weights": rand(hidden, 3 * hidden, scale=0.5, seed=1),
        "bias": rand(3 * hidden, seed=2),
        "mask_index": masks(batch, seq)[mask_name] if mask_name != "none" else None,
    }
    check("Attention", inputs, num_heads=4, unidirectional=1)
    assert loop_calls == {"small_attention": 1}  # small: the whole attention is one loop


@pytest.mark.parametrize("masked", ["none", "padded", "padded_lowest", "a_row_all_inf"])
@pytest.mark.parametrize("batch", [1, 2])
def test_distilbert_sized_attention_takes_the_one_loop(batch, masked, loop_calls):
    """DistilBERT's attention (dim 256, 4 heads of 64) at sequence 32: 524,288 multiply-adds in
    the head products, twice the old SMALL_ATTENTION, now the one loop (20 µs against 32 on
    oneDNN's products). Its export carries the padding mask as a (B, 1, S, T) attention_bias of
    0 and -inf (or float32's lowest); a query row with every key at -inf is NaN, as in ORT."""
    seq, hidden = 32, 256
    bias = np.zeros((batch, 1, seq, seq), np.float32)
    if masked != "none":
        low = np.finfo(np.float32).min if masked == "padded_lowest" else -np.inf
        bias[-1, :, :, -8:] = low  # the last row of the batch padded on the right
        if masked == "a_row_all_inf":
            bias[0, :, 3, :] = -np.inf
    inputs = {
        "input": rand(batch, seq, hidden),
        "weights": rand(hidden, 3 * hidden, scale=0.1, seed=1),
        "bias": rand(3 * hidden, seed=2),
        "mask_index": None,
        "past": None,
        "attention_bias": bias,
    }
    assert batch * seq * seq * 2 * hidden > 65536 * 4  # beyond the limit before
    ours = check("Attention", inputs, num_heads=4)
    assert loop_calls == {"small_attention": 1}
    assert np.isnan(ours[0][0, 3]).all() == (masked == "a_row_all_inf")


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize(("batch", "seq", "hidden", "mask_name"), [(2, 6, 16, "2d_raw"), (1, 128, 64, "none")])
def test_attention_beyond_small_takes_the_compiled_softmax(batch, seq, hidden, mask_name, with_bias, loop_calls, monkeypatch):
    """Above SMALL_ATTENTION (here made 0 for the first case) the heads are multiplied as products
    and only the softmax is a loop; both paths agree with onnxruntime."""
    if seq < 64:
        monkeypatch.setattr(compiled, "SMALL_ATTENTION", 0)
    inputs = {
        "input": rand(batch, seq, hidden),
        "weights": rand(hidden, 3 * hidden, scale=0.5, seed=1),
        "bias": rand(3 * hidden, seed=2) if with_bias else None,
        "mask_index": masks(batch, seq)[mask_name] if mask_name != "none" else None,
    }
    check("Attention", inputs, num_heads=4, unidirectional=1)
    assert "small_attention" not in loop_calls


@pytest.mark.parametrize(("seq", "mask_name"), [(1, "none"), (7, "2d_raw"), (7, "3d")])
def test_small_attention_without_bias_matches_onnxruntime(seq, mask_name, loop_calls):
    inputs = {"input": rand(2, seq, 16), "weights": rand(16, 48, scale=0.5, seed=1), "bias": None,
              "mask_index": None if mask_name == "none" else masks(2, seq)[mask_name]}  # fmt: skip
    check("Attention", inputs, num_heads=2)
    assert loop_calls == {"small_attention": 1}


def test_attention_softmax_falls_back_when_scores_are_an_output(loop_calls):
    """MultiHeadAttention's qk output needs the scores before softmax, which the loop overwrites."""
    inputs = {"query": rand(2, 6, 16), "key": rand(2, 6, 16, seed=1), "value": rand(2, 6, 16, seed=2)}
    outputs = [("output", F), ("", F), ("", F), ("qk", F)]
    check("MultiHeadAttention", inputs, outputs=outputs, num_heads=4)
    assert loop_calls == {}


@pytest.mark.parametrize(
    "mask_shape", [None, (1, 1, 1, 7), (2, 1, 5, 7), (1, 3, 1, 7), (2, 3, 5, 7), (2, 1, 1, 7)]
)
def test_masked_softmax_heads_broadcasts_its_mask(mask_shape):
    """The oracle is float64 numpy softmax(scores + mask); masked keys at -1e4 and float32's lowest."""
    scores = rand(2, 3, 5, 7, scale=4)
    mask = np.zeros((1, 1, 1, 7), np.float32) if mask_shape is None else rand(*mask_shape, seed=1)
    mask[..., -1] = -1e4
    mask[..., 0] = np.finfo(np.float32).min
    total = scores.astype(np.float64) + mask
    want = np.exp(total - total.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    compiled.masked_softmax_heads(scores, mask)
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-7)


def test_skip_layer_norm_loop_with_a_scratch_row_matches_a_full_sum():
    x, skip = rand(6, 40), rand(6, 40, seed=1)
    gamma, beta, bias = rand(40, seed=2), rand(40, seed=3), rand(40, seed=4)
    results = []
    for summed in (np.empty((6, 40), np.float32), np.empty((1, 40), np.float32)):
        out, mean, inv_std = np.empty_like(x), np.empty(6, np.float32), np.empty(6, np.float32)
        epsilon = np.float32(1e-5)
        compiled.skip_layer_norm_rows(x, skip, bias, gamma, beta, epsilon, True, out, summed, mean, inv_std)
        results.append((out, mean, inv_std))
    # Not bitwise: the row sums are reassociated, and how depends on the arrays' alignment.
    for full, scratch in zip(*results, strict=True):
        np.testing.assert_allclose(scratch, full, rtol=1e-6, atol=1e-6)


def test_wide_vectors_marks_the_calling_function():
    """The attribute must reach LLVM: llvmlite has no string attributes, so this leans on its printing."""

    @numba.njit
    def doubled(x):
        compiled.wide_vectors()
        for i in range(x.shape[0]):
            x[i] *= 2

    x = np.arange(4, dtype=np.float32)
    doubled(x)
    np.testing.assert_array_equal(x, [0, 2, 4, 6])
    assert '"prefer-vector-width"="512"' in next(iter(doubled.inspect_llvm().values()))


# ---------------------------------------------------------------- attention reading heads in place
# With MKL, Attention and MultiHeadAttention on 3-D numpy float32 projections read every head
# straight from them (contrib_attention.mkl_attend); past, present and qk outputs take the path
# that copies heads out. Both against ORT.

needs_mkl = pytest.mark.skipif(not gemm.available(), reason=f"no MKL here: {gemm.unavailable_reason()}")


@pytest.fixture
def head_reads(monkeypatch):
    """Lists each in-place call's q shape; these shapes are small, so products of every size go to
    the libraries here (gemm.SMALL_PRODUCT 0) and no attention is small enough for the one loop
    (compiled.SMALL_ATTENTION 0), which Attention would otherwise take first."""
    monkeypatch.setattr(gemm, "SMALL_PRODUCT", 0)
    monkeypatch.setattr(compiled, "SMALL_ATTENTION", 0)
    calls = []
    real = contrib_attention.mkl_attend

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(contrib_attention, "mkl_attend", counted)
    return calls


@needs_mkl
@pytest.mark.parametrize("case", list(ATTENTION_PATH_CASES))
def test_attention_reads_heads_in_place(case, head_reads):
    spec = ATTENTION_PATH_CASES[case]
    dv = spec.get("dv", HIDDEN)
    bias_shape = spec.get("attention_bias")
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 2 * HIDDEN + dv, scale=0.5, seed=1),
        "bias": rand(2 * HIDDEN + dv, seed=2) if spec.get("bias", True) else None,
        "mask_index": masks()[spec["mask"]],
        "past": None,
        "attention_bias": None if bias_shape is None else rand(*bias_shape, seed=3),
    }
    attrs = {"num_heads": HEADS, "unidirectional": spec.get("unidirectional", 0)}
    if "scale" in spec:
        attrs["scale"] = spec["scale"]
    if "dv" in spec:
        attrs["qkv_hidden_sizes"] = [HIDDEN, HIDDEN, dv]
    check("Attention", inputs, **attrs)
    assert head_reads == [(BATCH, SEQ, HIDDEN)]


@needs_mkl
def test_attention_with_present_copies_heads(head_reads):
    inputs = {
        "input": rand(BATCH, SEQ, HIDDEN),
        "weights": rand(HIDDEN, 3 * HIDDEN, scale=0.5, seed=1),
        "bias": rand(3 * HIDDEN, seed=2),
        "mask_index": masks()["2d_raw"],
    }
    check("Attention", inputs, outputs=[("Y", F), ("present", F)], num_heads=HEADS)
    assert head_reads == []


@needs_mkl
@pytest.mark.parametrize(
    ("layout", "with_bias", "reads"), [("3d", True, True), ("3d", False, True), ("bnsh", True, False)]
)
def test_multi_head_attention_reads_heads_in_place(layout, with_bias, reads, head_reads):
    inputs = mha_inputs(layout, with_bias, mask=masks(seq=KV_SEQ)["2d_raw"], attention_bias=True)
    check("MultiHeadAttention", inputs, num_heads=HEADS)
    assert head_reads == ([(BATCH, SEQ, HIDDEN)] if reads else [])


def test_compiled_loops_run_where_numba_cannot_cache(tmp_path):
    """No writable cache location must cost compile time, not an import error or a warning."""
    script = (
        "import numpy as np\n"
        "from numba.core.caching import NullCache\n"
        "from runtime.kernels import compiled\n"
        "assert isinstance(compiled.gelu_span._cache, NullCache)  # the uncached fallback ran\n"
        "assert isinstance(compiled.gelu_chunks._cache, NullCache)\n"
        "x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)\n"
        "out = np.empty_like(x)\n"
        "compiled.bias_gelu_rows(x, np.zeros(16, np.float32), out)\n"
        "print(repr(float(out.sum())))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    out = np.empty_like(x)
    compiled.bias_gelu_rows(x, np.zeros(16, np.float32), out)
    assert float(result.stdout) == float(out.sum())
