"""The resize family against ONNX's backend node cases and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import resize
from runtime.kernels.base import UnsupportedOp
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    node_cases,
    one_node_model,
    run_kernel,
)

CASES = list(node_cases(resize.KERNELS))


def test_every_resize_and_upsample_case_is_collected():
    assert len([c for c in CASES if c.name.startswith("test_resize_")]) == 39
    assert [c.name for c in CASES if c.name.startswith("test_upsample")] == ["test_upsample_nearest"]


test_node_case = node_case_test(resize.KERNELS)


# ---------------------------------------------------------------- against onnxruntime
# The node cases resize 1x1x4x4 images; these cover realistic image sizes, integer images,
# Resize-10/11 and Upsample's older conventions, and sizes that round.

RNG = np.random.default_rng(0)
IMAGE = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
ODD_IMAGE = RNG.standard_normal((2, 3, 13, 17)).astype(np.float32)


def _f(*values):
    return np.array(values, dtype=np.float32)


def _i(*values):
    return np.array(values, dtype=np.int64)


ORT_CASES = {
    # name: (opset, inputs, attributes)
    "linear_half_pixel_2x_upsample": (19, [IMAGE, None, _f(1, 1, 2, 2)], dict(mode="linear")),
    "linear_half_pixel_downsample_odd": (13, [ODD_IMAGE, None, _f(1, 1, 0.6, 0.45)], dict(mode="linear")),
    "linear_align_corners_sizes": (
        13,
        [ODD_IMAGE, None, None, _i(2, 3, 29, 8)],
        dict(mode="linear", coordinate_transformation_mode="align_corners"),
    ),
    "linear_pytorch_half_pixel_to_one_row": (
        13,
        [ODD_IMAGE, None, None, _i(2, 3, 1, 40)],
        dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    ),
    "linear_asymmetric_3x": (
        13,
        [ODD_IMAGE, None, _f(1, 1, 3, 3)],
        dict(mode="linear", coordinate_transformation_mode="asymmetric"),
    ),
    "cubic_half_pixel_upsample": (19, [IMAGE, None, _f(1, 1, 1.5, 2.25)], dict(mode="cubic")),
    "cubic_exclude_outside_a_half": (
        13,
        [ODD_IMAGE, None, _f(1, 1, 1.7, 0.8)],
        dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1),
    ),
    "linear_antialias_downsample": (
        18,
        [IMAGE, None, _f(1, 1, 0.3, 0.5)],
        dict(mode="linear", antialias=1),
    ),
    "cubic_antialias_downsample_sizes": (
        18,
        [IMAGE, None, None, _i(1, 3, 9, 14)],
        dict(mode="cubic", antialias=1),
    ),
    "nearest_round_prefer_floor_odd_scale": (
        19,
        [ODD_IMAGE, None, _f(1, 1, 2.5, 0.62)],
        dict(mode="nearest"),
    ),
    "nearest_floor_asymmetric": (
        13,
        [ODD_IMAGE, None, _f(1, 1, 1.3, 3)],
        dict(mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
    ),
    "nearest_ceil_align_corners": (
        13,
        [ODD_IMAGE, None, None, _i(2, 3, 20, 9)],
        dict(mode="nearest", nearest_mode="ceil", coordinate_transformation_mode="align_corners"),
    ),
    "nearest_uint8_image": (
        13,
        [RNG.integers(0, 256, (1, 3, 10, 12)).astype(np.uint8), None, _f(1, 1, 2, 2)],
        dict(mode="nearest"),
    ),
    "nearest_axes_not_smaller": (
        18,
        [ODD_IMAGE, None, None, _i(20, 20)],
        dict(mode="nearest", axes=[2, 3], keep_aspect_ratio_policy="not_smaller"),
    ),
    "linear_axes_not_larger": (
        18,
        [ODD_IMAGE, None, None, _i(20, 20)],
        dict(mode="linear", axes=[3, 2], keep_aspect_ratio_policy="not_larger"),
    ),
    "tf_crop_and_resize_extrapolation": (
        13,
        [ODD_IMAGE, _f(0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3), None, _i(2, 3, 7, 11)],
        dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0),
    ),
    "resize_11_tf_half_pixel_for_nn": (
        11,
        [ODD_IMAGE, _f(), _f(1, 1, 1.6, 2)],
        dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn"),
    ),
    "resize_11_linear_half_pixel": (11, [ODD_IMAGE, _f(), _f(1, 1, 2, 0.5)], dict(mode="linear")),
    "resize_10_nearest_downsample": (10, [ODD_IMAGE, _f(1, 1, 0.6, 0.5)], dict(mode="nearest")),
    "resize_10_nearest_upsample": (10, [ODD_IMAGE, _f(1, 1, 2, 1.5)], dict(mode="nearest")),
    "resize_10_linear": (10, [ODD_IMAGE, _f(1, 1, 2, 1.5)], dict(mode="linear")),
}


@pytest.mark.parametrize("name", list(ORT_CASES))
def test_resize_matches_onnxruntime(name):
    opset, inputs, attributes = ORT_CASES[name]
    assert_same_as_onnxruntime("Resize", inputs, opset, **attributes)


def test_upsample_7_scales_attribute_linear_matches_onnxruntime():
    assert_same_as_onnxruntime("Upsample", [ODD_IMAGE], 7, mode="linear", scales=[1.0, 1.0, 2.0, 3.0])


def test_upsample_9_nearest_fractional_scale_matches_onnxruntime():
    assert_same_as_onnxruntime("Upsample", [ODD_IMAGE, _f(1, 1, 1.5, 2.5)], 9, mode="nearest")


def test_uint8_linear_rounds_half_to_even_and_saturates():
    # 0 and 255 interpolated halfway give 127.5 -> 128 (even); the image's corners are kept.
    image = np.array([[[[0, 255], [255, 0]]]], dtype=np.uint8)
    inputs = [image, None, _f(1, 1, 2, 2)]
    model = one_node_model(
        "Resize", inputs, 13, mode="linear", coordinate_transformation_mode="align_corners"
    )
    (out,) = run_kernel(model, inputs)
    assert out.dtype == np.uint8 and out.shape == (1, 1, 4, 4)
    assert out[0, 0, 0, 0] == 0 and out[0, 0, 0, 3] == 255
    expected_row = np.rint(np.array([0, 85, 170, 255], dtype=np.float64))
    np.testing.assert_array_equal(out[0, 0, 0], expected_row)


def test_plan_is_cached_per_shape_and_scales():
    inputs = [IMAGE, None, _f(1, 1, 2, 2)]
    model = one_node_model("Resize", inputs, 19, mode="linear")
    from tests.runtime.node_cases import build_kernel

    kernel, _, _ = build_kernel(model)
    first = kernel.run(IMAGE, None, _f(1, 1, 2, 2))[0]
    second = kernel.run(IMAGE, None, _f(1, 1, 2, 2))[0]
    kernel.run(IMAGE[:, :, :16], None, _f(1, 1, 2, 2))
    assert len(kernel._plans) == 2
    np.testing.assert_array_equal(first, second)


def test_scales_and_sizes_together_are_rejected_with_the_node_name():
    inputs = [IMAGE, None, _f(1, 1, 2, 2), _i(1, 3, 64, 64)]
    model = one_node_model("Resize", inputs, 13, mode="linear")
    with pytest.raises(ValueError, match="either scales or sizes"):
        run_kernel(model, inputs)


def test_unknown_mode_is_declined():
    inputs = [IMAGE, None, _f(1, 1, 2, 2)]
    model = one_node_model("Resize", inputs, 13, mode="area")
    with pytest.raises(UnsupportedOp, match="unknown mode 'area'"):
        run_kernel(model, inputs)


def test_negative_axes_count_from_the_end():
    # onnxruntime 1.32 ignores negative Resize axes (returns the input), so compare with axes [3, 2].
    sizes = _i(20, 20)
    negative = one_node_model(
        "Resize",
        [ODD_IMAGE, None, None, sizes],
        18,
        mode="linear",
        axes=[-1, -2],
        keep_aspect_ratio_policy="not_larger",
    )
    positive = one_node_model(
        "Resize",
        [ODD_IMAGE, None, None, sizes],
        18,
        mode="linear",
        axes=[3, 2],
        keep_aspect_ratio_policy="not_larger",
    )
    (ours,) = run_kernel(negative, [ODD_IMAGE, None, None, sizes])
    (reference,) = run_kernel(positive, [ODD_IMAGE, None, None, sizes])
    assert ours.shape == (2, 3, 15, 20)
    np.testing.assert_array_equal(ours, reference)
