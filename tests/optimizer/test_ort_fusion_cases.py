"""ONNX Runtime's own fusion test models give the op counts ONNX Runtime's tests expect.

Runs when the models are present (`FUSIONWATCH_ORT_TESTDATA`, see ort_fusion_cases.py) and skips
otherwise. Cases with `ours` set are where we differ from ONNX Runtime on purpose (see `why`).
KNOWN_GAPS are the cases we do not match yet, each with why; they are strict xfails, so
a fix that makes one match fails here until it is taken off the list.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.optimizer.ort_fusion_cases import CASES, ort_testdata_dir, run_case

FOLDER = ort_testdata_dir()
pytestmark = pytest.mark.skipif(FOLDER is None, reason="ONNX Runtime's fusion test models are not here")

# PyTorch's arange below opset 11 is NonZero(ConstantOfShape([S], value=1)); these two models leave
# out the value, whose default is 0: NonZero finds no index, the position ids are empty (their
# Expand to the ids' shape fails), not 0..S-1. ONNX Runtime's fusion does not read the value and
# drops them; ours drops them only for a non-zero value (test_norm_rules.py has both).
_EMBED = "the position ids are NonZero of ConstantOfShape's default zeros: empty, not 0..S-1"
KNOWN_GAPS: dict[str, str] = {
    "embed_layer_norm_format2.onnx": _EMBED,
    "embed_layer_norm_format4.onnx": _EMBED,
    # Its Where fills masked scores with 0.0, which is not a mask (softmax still weighs them);
    # ONNX Runtime's fusion assumes a mask whatever the fill, ours does not.
    "attention_distilbert.onnx": "the masked_fill value is 0, so the Where is not an attention mask",
}


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(reason=KNOWN_GAPS[case.model], strict=True)] if case.model in KNOWN_GAPS else []
        yield pytest.param(case, id=case.model.removesuffix(".onnx"), marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_onnxruntime_fusion_case(case):
    _, mismatches = run_case(case, FOLDER)
    assert not mismatches, f"{case.test}: ours vs ONNX Runtime's expected count: {mismatches}"


@pytest.mark.parametrize("case", [c for c in CASES if c.ours is not None], ids=lambda c: c.model.removesuffix(".onnx"))
def test_where_we_differ_on_purpose_the_fused_graph_is_exact(case):
    # Random inputs in onnxruntime, original vs ours: the divergence must cost nothing in results.
    import onnx

    from optimizer import optimize
    from optimizer.levels import known_rule_names
    from tests.oracle import assert_same_outputs, fixture_feeds

    model = onnx.load(str(FOLDER / case.model))
    result = optimize(model, "extended", disabled=[r for r in known_rule_names() if r not in case.rules])
    assert_same_outputs(model, result, fixture_feeds(model))


def _float16_cases() -> list:
    """The LayerNorm cases whose models carry float16 data: mixed-precision patterns with Casts."""
    if FOLDER is None:
        return []
    import onnx

    def uses_float16(model) -> bool:
        values = [*model.graph.input, *model.graph.output]
        return any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in values) or any(
            t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)

    return [c for c in CASES if "LayerNormFusion" in c.rules and uses_float16(onnx.load(str(FOLDER / c.model)))]


FLOAT16_CASES = _float16_cases()


def _on_grid(rng, shape, bound, dtype) -> np.ndarray:
    """Multiples of 1/64 within +-bound: sums of two or three of them are exact in float16."""
    return (np.round(rng.uniform(-bound, bound, shape) * 64) / 64).astype(dtype)


def _run_fused_in_our_executor(case, model, feeds) -> dict:
    import onnx_ir as ir

    import runtime
    from optimizer import optimize
    from optimizer.levels import known_rule_names

    result = optimize(model, "extended", disabled=[r for r in known_rule_names() if r not in case.rules])
    session = runtime.InferenceSession(ir.to_proto(result.model), runtime.SessionOptions(graph_optimization_level="disabled"))
    return dict(zip([o.name for o in model.graph.output], session.run(None, feeds), strict=True))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", FLOAT16_CASES, ids=lambda c: c.model.removesuffix(".onnx"))
def test_float16_fusions_run_in_our_executor_as_onnxruntime_runs_the_original(case, seed):
    # The fused graph in our executor against onnxruntime on the original graph. Inputs and
    # weights are multiples of 1/64 (ORT's own weights are zeros or 1, 2, 3, 4 in places), so
    # every float16 residual sum the original rounds is exact and what is compared is the norm:
    # the fused op computes it in float32 and rounds its output once, where a float16 chain
    # rounds gamma * y and then + beta separately. That is one float16 ulp at most (2^-10, ~1e-3
    # relative): rtol 2e-3, atol 1e-3 on float16 outputs; float32 outputs keep rtol 1e-3, atol 1e-4.
    import onnx
    from onnx import numpy_helper

    from tests.oracle import ATOL, RTOL, run_onnxruntime

    rng = np.random.default_rng(seed)
    model = onnx.load(str(FOLDER / case.model))
    for tensor in model.graph.initializer:  # gamma, beta and bias; scalars (exponent, epsilon) stay
        array = numpy_helper.to_array(tensor)
        if array.ndim == 1 and array.size > 1 and array.dtype.kind == "f":
            tensor.CopyFrom(numpy_helper.from_array(_on_grid(rng, array.shape, 2, array.dtype), tensor.name))
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = _on_grid(rng, shape, 4, onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    expected = run_onnxruntime(model, feeds)
    for name, got in _run_fused_in_our_executor(case, model, feeds).items():
        assert got.dtype == expected[name].dtype, name
        rtol, atol = (2e-3, 1e-3) if got.dtype == np.float16 else (RTOL, ATOL)
        np.testing.assert_allclose(got, expected[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("case", FLOAT16_CASES, ids=lambda c: c.model.removesuffix(".onnx"))
def test_float16_fusions_on_standard_normal_inputs_stay_within_the_float16_sum_rounding(case):
    # Standard normal inputs, ORT's own weights: now the residual sums are not exact in float16.
    # The fused SkipLayerNormalization adds in float32 (ONNX Runtime's fusion casts the same way),
    # where the chain rounds each sum to float16; our executor rounds the Adds the fusion leaves
    # too, which onnxruntime's CPU session runs in float32 between Casts it drops. That rounding
    # is up to 2^-11 of sums up to ~8, ~4e-3, and the norm divides it by a row's standard
    # deviation (these rows are 4 wide: down to ~0.3) and multiplies it by gamma (up to 4): atol
    # 5e-2, rtol 1e-2. A wrong epsilon, gamma, bias or dtype is off by far more.
    import onnx

    from tests.oracle import fixture_feeds, run_onnxruntime

    model = onnx.load(str(FOLDER / case.model))
    feeds = fixture_feeds(model)
    expected = run_onnxruntime(model, feeds)
    for name, got in _run_fused_in_our_executor(case, model, feeds).items():
        assert got.dtype == expected[name].dtype, name
        np.testing.assert_allclose(got, expected[name], rtol=1e-2, atol=5e-2, err_msg=name)


def test_every_gap_names_a_case():
    assert set(KNOWN_GAPS) <= {case.model for case in CASES}


# GPT-2 with a past (vocabulary 20, 8 positions, 2 heads of 2): the fused Attention takes the past,
# returns the present and masks causally, at every level, in onnxruntime and in our executor.
GPT_CASES = ["attention_past_unidir.onnx", "attention_past_no_unidir.onnx", "gpt2_past_mask_one_layer.onnx",
             "gpt2_past_one_layer.onnx", "gpt2_one_layer.onnx"]


def _gpt_feeds(model, past: int, new: int, batch: int = 2) -> dict:
    rng = np.random.default_rng(past * 10 + new)
    feeds = {}
    for value in model.graph.input:
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, 20, (batch, new)).astype(np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(past + np.arange(new), (batch, new)).astype(np.int64).copy()
        elif value.name == "attention_mask":  # right padding: every query still sees a key
            mask = np.ones((batch, past + new), np.float32)
            mask[-1, -1] = 0
            feeds[value.name] = mask
        elif value.name.startswith("past"):
            feeds[value.name] = rng.standard_normal((2, batch, 2, past, 2)).astype(np.float32)
        else:
            raise AssertionError(f"no feed rule for input '{value.name}'")
    return feeds


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
@pytest.mark.parametrize("name", GPT_CASES, ids=lambda n: n.removesuffix(".onnx"))
def test_gpt2_attention_with_past_matches_onnxruntime_at_every_level(name, level):
    import onnx

    import runtime
    from optimizer import optimize
    from tests.oracle import ATOL, RTOL, assert_same_outputs, run_onnxruntime

    model = onnx.load(str(FOLDER / name))
    optimized = optimize(model, level)
    if level != "basic":
        [attention] = [n for n in optimized.model.graph if n.op_type == "Attention"]
        unidirectional = attention.attributes.get("unidirectional")
        assert (unidirectional.value if unidirectional is not None else 0) == (0 if "no_unidir" in name else 1)
    session = runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
    names = [o.name for o in model.graph.output]
    has_past = any(v.name.startswith("past") for v in model.graph.input)
    for past, new in [(3, 4), (5, 1)] if has_past else [(0, 5), (0, 1)]:
        feeds = _gpt_feeds(model, past, new)
        assert_same_outputs(model, optimized, feeds)
        expected = run_onnxruntime(model, feeds)
        for output, got in zip(names, session.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, expected[output], rtol=RTOL, atol=ATOL, err_msg=output)
