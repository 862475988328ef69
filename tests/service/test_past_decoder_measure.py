"""A decoder with a key/value past through the service's measure path (service/adapters/measure.py):
both engines run it at every level on the synthesized feeds (a past of PAST_SEQUENCE_LENGTH, a mask
over past and new positions, the left- and right-padded batches) and agree. Before the past had a
length of its own, both refused it: the mask was as long as the past alone."""

from __future__ import annotations

import onnx
import pytest

from service.adapters.engines import ENGINES, run_engine
from service.adapters.engines.dimensions import PAST_SEQUENCE_LENGTH
from service.adapters.engines.feeds import LEFT_PADDED, RIGHT_PADDED, SYNTHESIZED
from service.adapters.measure import compare_outputs, measure
from service.domain.protocol import Protocol
from service.domain.vocabulary import LEVEL_NAMES
from tests.models.past_decoder import past_decoder

SEQ = 8
PROTOCOL = Protocol(runs=2, warmup=1, threads=1, sequence_length=SEQ)


@pytest.mark.parametrize("merged", [False, True], ids=["with_past", "merged"])
def test_both_engines_run_a_decoder_with_past_on_synthesized_feeds_and_agree_at_every_level(tmp_path, merged):
    path = tmp_path / "decoder.onnx"
    onnx.save(past_decoder(merged=merged), path)
    for level in LEVEL_NAMES:
        outputs = {}
        for engine in ENGINES:
            measured = measure(path, engine, level, PROTOCOL)
            assert measured.inputs["attention_mask"] == f"int64[1, {PAST_SEQUENCE_LENGTH + SEQ}]"
            assert measured.numeric_ok, (engine, level, measured.numeric_checks)
            checked = {check["feed_set"]: check for check in measured.numeric_checks}
            # `disabled` is checked against our engine's `disabled` on the timed feeds; every other level
            # against its own unfused graph on all three sets
            assert set(checked) == ({SYNTHESIZED} if level == "disabled" else {SYNTHESIZED, LEFT_PADDED, RIGHT_PADDED})
            assert all(check["status"] == "compared" and check["ok"] for check in checked.values()), checked
            outputs[engine] = run_engine(engine, path, level, runs=1, warmup=0, sequence_length=SEQ).outputs
        ours, theirs = outputs.values()
        assert compare_outputs(ours, theirs, PROTOCOL.tolerances()).ok, level
