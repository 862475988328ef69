"""The window generators against ONNX's node cases and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import window
from tests.runtime.node_cases import assert_same_as_onnxruntime, node_case_test

test_node_case = node_case_test(window.KERNELS)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_matches_onnxruntime(op, periodic):
    assert_same_as_onnxruntime(op, [np.array(16, np.int64)], opset=17, periodic=periodic)
