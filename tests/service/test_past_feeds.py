"""Feeds for decoders with a key/value past (service/adapters/engines/dimensions.py, feeds.py): each
dimension form sized by its name, position ids as generate() makes them, use_cache_branch, the
padded sets, and the FeedError for an expression no rule evaluates."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from service.adapters.engines.dimensions import PAST_SEQUENCE_LENGTH, Dimensions, FeedError
from service.adapters.engines.feeds import (
    LEFT_PADDED,
    RIGHT_PADDED,
    SYNTHESIZED,
    Padding,
    make_feeds,
    synthesized_feed_sets,
)
from tests.models.past_decoder import HEAD, HEADS, past_decoder
from tests.oracle import MODELS

SEQ, PAST = 8, PAST_SEQUENCE_LENGTH


def _sizes(*dims, others=(), batch=2, sequence=SEQ, **lengths) -> tuple[int, ...]:
    """The shape Dimensions gives an input 'x' with `dims`, beside inputs shaped `others`."""
    inputs = [helper.make_tensor_value_info(f"o{i}", TensorProto.FLOAT, shape) for i, shape in enumerate(others)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    return Dimensions([*inputs, x], batch, sequence, **lengths).shape(x)


@pytest.mark.parametrize(
    ("dims", "others", "want"),
    [
        # plain names, as feeds always sized them: the batch first, the sequence after
        (["batch", "seq"], (), (2, SEQ)),
        (["N", "sequence", 5], (), (2, SEQ, 5)),
        (["unk__12", "unk__13"], (), (2, SEQ)),
        (["batch size", "?"], (), (2, SEQ)),  # not names, not expressions
        ([None, None], (), (2, SEQ)),
        # a past and what covers it
        (["batch_size", HEADS, "past_sequence_length", HEAD], (), (2, HEADS, PAST, HEAD)),
        (["batch_size", "past_sequence_length + sequence_length"], (), (2, PAST + SEQ)),
        (["batch_size", "total_sequence_length"], [["b", 1, "past_sequence_length", 1]], (2, PAST + SEQ)),
        (["batch_size", "past_sequence_length + 1"], (), (2, PAST + 1)),
        (["batch_size", HEADS, "past_decoder_sequence_length", HEAD], (), (2, HEADS, PAST, HEAD)),
        # a cross-attention past is the encoder's length, not the cache's
        (["batch_size", HEADS, "encoder_sequence_length", HEAD], (), (2, HEADS, SEQ, HEAD)),
        # without a past in the graph, a total is the sequence alone
        (["batch_size", "total_sequence_length"], (), (2, SEQ)),
        # a torch export's names, bound where they stand alone
        (["s0", "s1 + s2"], [["s0", "s1"], ["s0", 2, "s2", 4]], (2, 2 * SEQ)),
        (["batch", "2*seq - 1"], [["batch", "seq"]], (2, 2 * SEQ - 1)),
        (["batch", "(seq + 2)//2"], [["batch", "seq"]], (2, (SEQ + 2) // 2)),
    ],
)
def test_each_dimension_form_is_sized_by_its_name(dims, others, want):
    assert _sizes(*dims, others=others) == want


def test_lengths_a_caller_chooses():
    assert _sizes("batch_size", "past_sequence_length + sequence_length", past=0) == (2, SEQ)
    assert _sizes("batch_size", "past_encoder_sequence_length", encoder=6) == (2, 6)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("past_sequence_length + foo", r"no rule sizes 'foo'"),
        ("min(past_sequence_length, 3)", r"only integers, names, \+ - \* // and parentheses"),
        ("past_sequence_length / 2", r"only integers, names, \+ - \* // and parentheses"),
        ("past_sequence_length - 9", r"evaluates to -5"),
        ("past_sequence_length // 0", r"divides by zero"),
        ("past_sequence_length" + " + 1" * 60, r"longer than 200 characters"),
    ],
)
def test_an_expression_no_rule_evaluates_is_a_feed_error_naming_input_dimension_and_expression(expression, why):
    with pytest.raises(FeedError, match=rf"^input 'x' dimension 1 is '{re.escape(expression)}': {why}"):
        _sizes("batch_size", expression)


def test_a_decoder_with_past_gets_a_past_and_a_mask_over_both():
    feeds = make_feeds(past_decoder(), SEQ)
    assert {name: array.shape for name, array in feeds.items()} == {
        "input_ids": (1, SEQ),
        "attention_mask": (1, PAST + SEQ),
        "position_ids": (1, SEQ),
        "past_key_values.0.key": (1, HEADS, PAST, HEAD),
        "past_key_values.0.value": (1, HEADS, PAST, HEAD),
    }
    assert feeds["attention_mask"].all()
    assert feeds["position_ids"].tolist() == [list(range(PAST, PAST + SEQ))]  # after the cached positions
    past = feeds["past_key_values.0.key"]
    assert past.dtype == np.float32 and 0.5 < past.std() < 1.5  # seeded normal, not zeros
    total = make_feeds(past_decoder(mask_length="total_sequence_length"), SEQ)
    assert total["attention_mask"].shape == (1, PAST + SEQ)


def test_use_cache_branch_is_true_exactly_when_a_past_is_fed():
    merged = past_decoder(merged=True)
    feeds = make_feeds(merged, SEQ)
    assert feeds["use_cache_branch"].dtype == np.bool_ and feeds["use_cache_branch"].tolist() == [True]
    empty = make_feeds(merged, SEQ, past_length=0)
    assert empty["use_cache_branch"].tolist() == [False]
    assert empty["past_key_values.0.key"].shape == (1, HEADS, 0, HEAD)
    assert empty["attention_mask"].shape == (1, SEQ) and empty["position_ids"].tolist() == [list(range(SEQ))]


def test_padded_sets_pad_the_mask_over_past_and_new_positions_and_positions_follow_it():
    sets = synthesized_feed_sets(past_decoder(), SEQ)
    assert list(sets) == [SYNTHESIZED, LEFT_PADDED, RIGHT_PADDED]
    left, right = sets[LEFT_PADDED], sets[RIGHT_PADDED]
    pad = (PAST + SEQ) // 4  # 3: the left padding lies in the past
    assert left["attention_mask"].tolist() == [[0] * pad + [1] * (PAST + SEQ - pad), [1] * (PAST + SEQ)]
    # generate(): cumsum(mask) - 1, so row 0's first real token (in the past) is position 0
    assert left["position_ids"].tolist() == [list(range(PAST - pad, PAST - pad + SEQ)), list(range(PAST, PAST + SEQ))]
    assert right["attention_mask"][1].tolist() == [1] * (PAST + SEQ - pad) + [0] * pad
    assert right["position_ids"][1].tolist() == list(range(PAST, PAST + SEQ - pad)) + [1] * pad  # 1 on padding


def test_a_caller_pads_as_it_likes_and_a_model_without_a_mask_cannot_be_padded():
    feeds = make_feeds(past_decoder(), 3, batch=2, past_length=5, padding=Padding("left", 0, 2))
    assert feeds["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert feeds["position_ids"].tolist() == [[3, 4, 5], [5, 6, 7]]
    with pytest.raises(FeedError, match="no \\[batch, positions\\] attention mask"):
        make_feeds(onnx.load(MODELS / "resnet_tiny_opset17.onnx"), padding=Padding("left", 0))


def test_a_plain_decoders_positions_follow_its_padded_mask_and_its_timed_feeds_are_as_before():
    sets = synthesized_feed_sets(onnx.load(MODELS / "llama_torchscript_opset14.onnx"), 16)
    assert sets[SYNTHESIZED]["position_ids"].tolist() == [list(range(16))]
    assert sets[LEFT_PADDED]["position_ids"][0].tolist() == [1] * 4 + list(range(12))
    assert sets[RIGHT_PADDED]["position_ids"][1].tolist() == list(range(12)) + [1] * 4
