"""Every fixture, at every level, on the inputs where masking decides the answer, against onnxruntime.

A fusion must compute what its subgraph computes for every input the subgraph accepts. The inputs
where attention rewrites have gone wrong are the masked ones: a left-padded row (batched generation
pads on the left, so under a causal mask the first queries see only padding), a right-padded row,
a row whose every key is masked, batch 1 and a single position. Each fixture in tests/models and
each hand-built attention block runs through our executor at every optimization level on such
inputs; onnxruntime with its graph optimizations off on the original model is the oracle: fp32
rtol 1e-3, atol 1e-4, and no NaN or inf where onnxruntime has a finite number.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import runtime
from tests.models import patterns
from tests.oracle import ATOL, MODELS, RTOL, fixture_feeds, run_onnxruntime

LEVELS = ("disabled", "basic", "extended", "all")
# the exported fixtures and the attention forms (tools/export_attention_forms.py)
FIXTURES = sorted(str(p.relative_to(MODELS)) for p in [*MODELS.glob("*.onnx"), *MODELS.glob("attention_forms/*.onnx")])
SEQ = 8


def _with_mask(feeds: dict[str, np.ndarray], rows: dict[int, slice]) -> dict[str, np.ndarray]:
    """A copy of `feeds` whose attention_mask is all ones except 0 over `rows` (row -> positions)."""
    feeds = {name: array.copy() for name, array in feeds.items()}
    mask = feeds["attention_mask"]
    mask[...] = 1
    for row, positions in rows.items():
        mask[row, positions] = 0
    return feeds


def masked_inputs(model: onnx.ModelProto) -> dict[str, dict[str, np.ndarray]]:
    """Named feeds: left/right padding, a fully masked row, batch 1, one position (what the graph's
    static dimensions allow)."""
    feeds = fixture_feeds(model, batch=2, seq=SEQ)
    if "attention_mask" not in feeds:
        cases = {"batch2": feeds}
        if not _static_batch(model):
            cases["batch1"] = fixture_feeds(model, batch=1, seq=SEQ)
        return cases
    batch, seq = feeds["attention_mask"].shape
    last = batch - 1
    cases = {
        "left_padded": _with_mask(feeds, {0: slice(0, 3)}),
        "right_padded": _with_mask(feeds, {last: slice(seq - 3, seq)}),
        "masked_row": _with_mask(feeds, {last: slice(0, seq)}),
    }
    if batch > 1 and not _static_batch(model):
        cases["batch1_left_padded"] = _with_mask(fixture_feeds(model, batch=1, seq=SEQ), {0: slice(0, 2)})
    if seq > 1:
        single = fixture_feeds(model, batch=batch, seq=1)
        cases["one_position"] = _with_mask(single, {})
        cases["one_position_masked"] = _with_mask(single, {last: slice(0, 1)})
    return cases


def _static_batch(model: onnx.ModelProto) -> bool:
    first = model.graph.input[0].type.tensor_type.shape.dim
    return bool(first) and first[0].HasField("dim_value")


def assert_matches_onnxruntime(model: onnx.ModelProto, cases: dict[str, dict[str, np.ndarray]]) -> None:
    sessions = {level: runtime.InferenceSession(model, runtime.SessionOptions(graph_optimization_level=level))
                for level in LEVELS}
    for case, feeds in cases.items():
        expected = run_onnxruntime(model, feeds)
        for level, session in sessions.items():
            for (name, want), got in zip(expected.items(), session.run(None, feeds), strict=True):
                where = f"{case}, level {level}, output {name}"  # NaN where onnxruntime has NaN is equal
                invented = ~np.isfinite(got) & np.isfinite(want)
                assert not invented.any(), f"{where}: {int(invented.sum())} NaN/inf where onnxruntime is finite"
                np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=where)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_on_masked_inputs_matches_onnxruntime_at_every_level(name):
    model = onnx.load(MODELS / name)
    assert_matches_onnxruntime(model, masked_inputs(model))


def _block_inputs(mask_form: str) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    shape = (patterns.ATTN_BATCH, patterns.ATTN_SEQ, patterns.ATTN_HIDDEN)
    x = rng.standard_normal(shape).astype(np.float32)
    if mask_form == "raw":
        def mask(rows: dict[int, slice]) -> dict[str, np.ndarray]:
            raw = np.ones(shape[:2], np.int64)
            for row, positions in rows.items():
                raw[row, positions] = 0
            return {"x": x, "attention_mask": raw}
    else:
        def mask(rows: dict[int, slice]) -> dict[str, np.ndarray]:
            keep = np.ones((shape[0], 1, 1 if mask_form == "key_row" else shape[1], shape[1]), bool)
            for row, positions in rows.items():
                keep[row, :, :, positions] = False
            return {"x": x, "keep": keep}
    return {"left_padded": mask({0: slice(0, 2)}), "right_padded": mask({1: slice(2, 4)}),
            "masked_row": mask({1: slice(0, 4)})}


@pytest.mark.parametrize("heads_form", [False, True])
@pytest.mark.parametrize("mask_form", ["rows", "key_row", "fill", "raw"])
def test_attention_block_on_masked_inputs_matches_onnxruntime_at_every_level(mask_form, heads_form):
    # -inf masks (rows, key_row) leave NaN in a fully masked row in the graph itself: the fused op
    # must leave the same NaN, not invent or hide one; masked_fill with finfo.min gives uniform weights.
    # The heads form (MultiHeadAttention) repeats a key row over the queries of Q in heads, [B, N, S, H].
    cases = _block_inputs(mask_form)
    if heads_form:
        rot = np.random.default_rng(6).standard_normal((1, 1, patterns.ATTN_SEQ, patterns.ATTN_HIDDEN // patterns.ATTN_HEADS))
        cases = {case: {**feeds, "rot": rot.astype(np.float32)} for case, feeds in cases.items()}
    assert_matches_onnxruntime(patterns.self_attention(mask_form=mask_form, heads_form=heads_form), cases)
