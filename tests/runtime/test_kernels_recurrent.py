"""The recurrent family against ONNX's backend node cases and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import recurrent
from runtime.kernels.base import UnsupportedOp
from tests.runtime.node_cases import (
    node_case_test,
    node_cases,
    one_node_model,
    run_kernel,
    run_onnxruntime,
)

CASES = list(node_cases(recurrent.KERNELS))


def test_every_rnn_gru_lstm_case_is_collected():
    assert len(CASES) == 18


test_node_case = node_case_test(recurrent.KERNELS)


# ---------------------------------------------------------------- against onnxruntime
# The node cases have no sequence_lens, initial states, clip, input_forget or custom
# activations, and only forward peepholes; these do, at batch/seq sizes where masking shows.

SEQ, BATCH, INPUT, HIDDEN = 6, 3, 5, 4
RNG = np.random.default_rng(0)


def _weights(op, directions, gates, with_bias=True):
    scale = 0.5
    x = RNG.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    w = (RNG.standard_normal((directions, gates * HIDDEN, INPUT)) * scale).astype(np.float32)
    r = (RNG.standard_normal((directions, gates * HIDDEN, HIDDEN)) * scale).astype(np.float32)
    b = (
        (RNG.standard_normal((directions, 2 * gates * HIDDEN)) * scale).astype(np.float32)
        if with_bias
        else None
    )
    return x, w, r, b


def _states(directions):
    return RNG.standard_normal((directions, BATCH, HIDDEN)).astype(np.float32)


LENGTHS = np.array([6, 2, 4], dtype=np.int32)


def _assert_matches_onnxruntime(op, inputs, outputs, opset=14, **attributes):
    model = one_node_model(op, inputs, opset, outputs=outputs, **attributes)
    ours, theirs = run_kernel(model, inputs), run_onnxruntime(model, inputs)
    assert len(ours) >= outputs
    for index, (actual, expected) in enumerate(zip(ours[:outputs], theirs, strict=True)):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
            index,
            actual.shape,
            expected.shape,
        )
        np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-4, err_msg=f"output {index}")


def test_bidirectional_lstm_with_sequence_lens_and_initial_states():
    x, w, r, b = _weights("LSTM", 2, 4)
    inputs = [x, w, r, b, LENGTHS, _states(2), _states(2)]
    _assert_matches_onnxruntime("LSTM", inputs, 3, hidden_size=HIDDEN, direction="bidirectional")


def test_reverse_lstm_with_peepholes_and_sequence_lens():
    x, w, r, b = _weights("LSTM", 1, 4)
    p = RNG.standard_normal((1, 3 * HIDDEN)).astype(np.float32)
    inputs = [x, w, r, b, LENGTHS, _states(1), _states(1), p]
    _assert_matches_onnxruntime("LSTM", inputs, 3, hidden_size=HIDDEN, direction="reverse")


def test_lstm_input_forget_couples_the_forget_gate():
    x, w, r, b = _weights("LSTM", 1, 4)
    _assert_matches_onnxruntime("LSTM", [x, w, r, b], 3, hidden_size=HIDDEN, input_forget=1)


def test_lstm_clip_bounds_gate_inputs():
    x, w, r, b = _weights("LSTM", 2, 4)
    x *= 4
    inputs = [x, w, r, b, None, _states(2), _states(2)]
    _assert_matches_onnxruntime("LSTM", inputs, 3, hidden_size=HIDDEN, direction="bidirectional", clip=0.7)


def test_lstm_custom_activations_consume_alpha_and_beta_in_order():
    x, w, r, b = _weights("LSTM", 1, 4)
    _assert_matches_onnxruntime(
        "LSTM",
        [x, w, r, b],
        3,
        hidden_size=HIDDEN,
        activations=["HardSigmoid", "LeakyRelu", "ScaledTanh"],
        activation_alpha=[0.3, 0.05, 1.5],
        activation_beta=[0.4, 0.8],
    )


def test_lstm_without_bias_only_y_h_requested():
    x, w, r, _ = _weights("LSTM", 1, 4, with_bias=False)
    model = one_node_model("LSTM", [x, w, r], 14, outputs=1, hidden_size=HIDDEN)
    (expected,) = run_onnxruntime(model, [x, w, r])
    actual = run_kernel(model, [x, w, r])[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_bidirectional_gru_with_sequence_lens(linear_before_reset):
    x, w, r, b = _weights("GRU", 2, 3)
    inputs = [x, w, r, b, LENGTHS, _states(2)]
    _assert_matches_onnxruntime(
        "GRU",
        inputs,
        2,
        hidden_size=HIDDEN,
        direction="bidirectional",
        linear_before_reset=linear_before_reset,
    )


def test_reverse_gru_linear_before_reset_with_initial_state():
    x, w, r, b = _weights("GRU", 1, 3)
    inputs = [x, w, r, b, None, _states(1)]
    _assert_matches_onnxruntime(
        "GRU", inputs, 2, hidden_size=HIDDEN, direction="reverse", linear_before_reset=1
    )


def test_bidirectional_rnn_relu_with_sequence_lens():
    x, w, r, b = _weights("RNN", 2, 1)
    inputs = [x, w, r, b, LENGTHS, _states(2)]
    _assert_matches_onnxruntime(
        "RNN", inputs, 2, hidden_size=HIDDEN, direction="bidirectional", activations=["Relu", "Tanh"]
    )


@pytest.mark.parametrize("op, gates", [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
def test_layout_1_is_the_batch_major_transpose_of_layout_0(op, gates):
    # onnxruntime's CPU kernels take layout 0 only; layout 1 must equal layout 0 transposed.
    x, w, r, b = _weights(op, 2, gates)
    h0 = _states(2)
    outputs = 3 if op == "LSTM" else 2
    seq_major = [x, w, r, b, LENGTHS, h0] + ([_states(2)] if op == "LSTM" else [])
    batch_major = [x.transpose(1, 0, 2).copy(), w, r, b, LENGTHS] + [
        s.transpose(1, 0, 2).copy() for s in seq_major[5:]
    ]
    attributes = dict(hidden_size=HIDDEN, direction="bidirectional")
    expected = run_kernel(one_node_model(op, seq_major, 14, outputs=outputs, **attributes), seq_major)
    actual = run_kernel(
        one_node_model(op, batch_major, 14, outputs=outputs, layout=1, **attributes), batch_major
    )
    np.testing.assert_allclose(actual[0], expected[0].transpose(2, 0, 1, 3), rtol=1e-6)
    for got, want in zip(actual[1:], expected[1:], strict=True):
        np.testing.assert_allclose(got, want.transpose(1, 0, 2), rtol=1e-6)


def test_padding_steps_emit_zeros_and_keep_the_state():
    x, w, r, b = _weights("GRU", 1, 3)
    inputs = [x, w, r, b, LENGTHS]
    y, y_h = run_kernel(one_node_model("GRU", inputs, 14, outputs=2, hidden_size=HIDDEN), inputs)
    assert not y[2:, 0, 1].any() and not y[4:, 0, 2].any()
    np.testing.assert_array_equal(y_h[0, 1], y[1, 0, 1])


def test_unknown_activation_is_declined():
    x, w, r, b = _weights("RNN", 1, 1)
    model = one_node_model("RNN", [x, w, r], 14, hidden_size=HIDDEN, activations=["Gelu"])
    with pytest.raises(UnsupportedOp, match="unknown activation 'Gelu'"):
        run_kernel(model, [x, w, r])


def test_wrong_number_of_activations_names_the_node():
    x, w, r, b = _weights("GRU", 2, 3)
    model = one_node_model(
        "GRU", [x, w, r], 14, hidden_size=HIDDEN, direction="bidirectional", activations=["Sigmoid", "Tanh"]
    )
    with pytest.raises(ValueError, match=r"GRU .*2 activations given, expected 2 per direction x 2"):
        run_kernel(model, [x, w, r])
