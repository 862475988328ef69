"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against ONNX's node cases and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import loss
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test

test_node_case = node_case_test(loss.KERNELS)

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_softmax_cross_entropy_with_weights_and_ignored_labels_matches_onnxruntime(reduction):
    scores = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    labels = RNG.integers(0, 5, (4, 3)).astype(np.int64)
    labels[0, 1] = -100  # ignored, and outside the classes
    weights = RNG.uniform(0.5, 2, 5).astype(np.float32)
    assert_same_as_onnxruntime(
        "SoftmaxCrossEntropyLoss", [scores, labels, weights], opset=13, outputs=2,
        reduction=reduction, ignore_index=-100,
    )  # fmt: skip
