"""DeformConv against ONNX's backend node cases and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import deform_conv
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    node_cases,
    one_node_model,
    run_kernel,
)

CASES = list(node_cases(deform_conv.KERNELS))


def test_every_deform_conv_case_is_collected():
    assert len(CASES) == 4


test_node_case = node_case_test(deform_conv.KERNELS)


RNG = np.random.default_rng(0)

CONFIGS = {
    # name: (x shape, w shape, output size, attributes, with mask, with bias)
    "3x3_pad1": ((2, 4, 9, 10), (6, 4, 3, 3), (9, 10), dict(pads=[1, 1, 1, 1]), False, True),
    "grouped_offset_groups_mask": (
        (1, 8, 8, 8),
        (4, 4, 3, 3),
        (6, 6),
        dict(group=2, offset_group=4),
        True,
        True,
    ),
    "strided_dilated": (
        (1, 3, 12, 11),
        (5, 3, 3, 2),
        (5, 6),
        dict(strides=[2, 2], dilations=[2, 1], pads=[1, 0, 1, 1]),
        True,
        False,
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_deform_conv_matches_onnxruntime(name):
    x_shape, w_shape, out, attributes, with_mask, with_bias = CONFIGS[name]
    offset_groups = attributes.get("offset_group", 1)
    taps = w_shape[2] * w_shape[3]
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    offset = (RNG.standard_normal((x_shape[0], offset_groups * taps * 2, *out)) * 1.5).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    mask = RNG.random((x_shape[0], offset_groups * taps, *out)).astype(np.float32) if with_mask else None
    inputs = [x, w, offset, b, mask]
    while inputs[-1] is None:
        inputs.pop()
    assert_same_as_onnxruntime("DeformConv", inputs, 19, kernel_shape=list(w_shape[2:]), **attributes)


def test_zero_offsets_make_it_an_ordinary_convolution():
    x = RNG.standard_normal((1, 3, 7, 7)).astype(np.float32)
    w = RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)
    offset = np.zeros((1, 18, 7, 7), np.float32)
    (deformed,) = run_kernel(
        one_node_model("DeformConv", [x, w, offset], 19, pads=[1, 1, 1, 1]), [x, w, offset]
    )
    (plain,) = run_kernel(one_node_model("Conv", [x, w], 19, pads=[1, 1, 1, 1]), [x, w])
    np.testing.assert_allclose(deformed, plain, rtol=1e-5, atol=1e-5)


def test_offset_of_the_wrong_spatial_size_names_the_node():
    x = RNG.standard_normal((1, 3, 7, 7)).astype(np.float32)
    w = RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)
    offset = np.zeros((1, 18, 7, 7), np.float32)  # without padding the output is 5x5
    with pytest.raises(ValueError, match=r"DeformConv .*offset is 7x7 per position, the output is 5x5"):
        run_kernel(one_node_model("DeformConv", [x, w, offset], 19), [x, w, offset])
