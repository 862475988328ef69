"""Col2Im against ONNX's backend node cases and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import col2im
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    node_cases,
    one_node_model,
    run_kernel,
)

CASES = list(node_cases(col2im.KERNELS))


def test_every_col2im_case_is_collected():
    assert len(CASES) == 5


test_node_case = node_case_test(col2im.KERNELS)


RNG = np.random.default_rng(0)


def _i(*values):
    return np.array(values, dtype=np.int64)


CONFIGS = {
    # name: (channels, image, block, attributes)
    "overlapping_3x3": (3, (8, 9), (3, 3), {}),
    "strided_padded": (2, (10, 7), (3, 2), dict(strides=[2, 1], pads=[1, 0, 2, 1])),
    "dilated": (4, (9, 9), (2, 3), dict(dilations=[3, 2])),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_col2im_matches_onnxruntime(name):
    channels, image, block, attributes = CONFIGS[name]
    pads = attributes.get("pads", [0, 0, 0, 0])
    strides = attributes.get("strides", [1, 1])
    dilations = attributes.get("dilations", [1, 1])
    count = 1
    for i in range(2):
        count *= (image[i] + pads[i] + pads[i + 2] - (block[i] - 1) * dilations[i] - 1) // strides[i] + 1
    x = RNG.standard_normal((2, channels * block[0] * block[1], count)).astype(np.float32)
    assert_same_as_onnxruntime("Col2Im", [x, _i(*image), _i(*block)], 18, **attributes)


def test_non_overlapping_3d_blocks_are_an_exact_rearrangement():
    # Blocks as large as their stride tile the volume once: folding reorders values, sums nothing.
    volume = RNG.standard_normal((1, 2, 4, 6, 4)).astype(np.float32)
    blocks = volume.reshape(1, 2, 2, 2, 3, 2, 2, 2).transpose(0, 1, 3, 5, 7, 2, 4, 6).reshape(1, 2 * 8, 12)
    inputs = [blocks, _i(4, 6, 4), _i(2, 2, 2)]
    (folded,) = run_kernel(one_node_model("Col2Im", inputs, 18, strides=[2, 2, 2]), inputs)
    np.testing.assert_array_equal(folded, volume)
