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

# ORT's test runs its transformer on nodes no execution provider has claimed; in a CPU session
# (ours, and onnxruntime's own: `tools/fusion_table.py --ort-cases` shows both) these float16
# patterns stay unfused, as the CPU kernels compute LayerNorm in float or double only.
_CAST_SKIP = "float16 residual Add around Casts: onnxruntime's own CPU session does not fuse it either"
_CAST_LN = "a float16 LayerNorm: onnxruntime's own CPU session does not fuse it either"
# PyTorch's arange below opset 11 is NonZero(ConstantOfShape([S], value=1)); these two models leave
# out the value, whose default is 0: NonZero finds no index, the position ids are empty (their
# Expand to the ids' shape fails), not 0..S-1. ONNX Runtime's fusion does not read the value and
# drops them; ours drops them only for a non-zero value (test_norm_rules.py has both).
_EMBED = "the position ids are NonZero of ConstantOfShape's default zeros: empty, not 0..S-1"
KNOWN_GAPS: dict[str, str] = {
    "layer_norm_with_cast_2.onnx": _CAST_LN,
    "layer_norm_with_cast_3.onnx": _CAST_LN,
    "layer_norm_with_cast_4.onnx": _CAST_LN,
    "layer_norm_fusion_scale_bias.onnx": _CAST_LN,
    "skip_layer_norm_format1_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format2_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format3_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format1_partial_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format2_partial_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format1_graph_output_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format2_graph_output_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format3_no_fusion_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_format3_graph_output_with_cast.onnx": _CAST_SKIP,
    "skip_layer_norm_no_beta_with_cast.onnx": _CAST_SKIP,
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


@pytest.mark.parametrize("case", _params())
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
