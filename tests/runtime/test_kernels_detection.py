"""NonMaxSuppression and RoiAlign against ONNX's backend node cases and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import detection
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    node_cases,
    one_node_model,
    run_kernel,
)

CASES = list(node_cases(detection.KERNELS))


def test_every_nms_and_roi_align_case_is_collected():
    assert len(CASES) == 13


test_node_case = node_case_test(detection.KERNELS)


# ---------------------------------------------------------------- against onnxruntime

RNG = np.random.default_rng(0)


def _random_boxes(batches, count, center_point_box):
    centre = RNG.uniform(0, 10, (batches, count, 2))
    size = RNG.uniform(0.5, 4, (batches, count, 2))
    if center_point_box:
        return np.concatenate([centre, size], axis=-1).astype(np.float32)
    first, second = centre - size / 2, centre + size / 2
    boxes = np.concatenate([first, second], axis=-1)  # [y1, x1, y2, x2]
    flip = RNG.random((batches, count)) < 0.3  # some boxes list their corners the other way round
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
def test_non_max_suppression_matches_onnxruntime(center_point_box, score_threshold):
    boxes = _random_boxes(2, 60, center_point_box)
    scores = RNG.random((2, 3, 60)).astype(np.float32)
    scores[0, 0, 5:9] = 0.75  # ties: the lower box index goes first
    inputs = [boxes, scores, np.array([7], np.int64), np.array([0.25], np.float32)]
    if score_threshold is not None:
        inputs.append(np.array([score_threshold], np.float32))
    assert_same_as_onnxruntime("NonMaxSuppression", inputs, 11, center_point_box=center_point_box)


def test_non_max_suppression_without_max_output_selects_nothing():
    boxes, scores = _random_boxes(1, 5, 0), RNG.random((1, 1, 5)).astype(np.float32)
    (selected,) = run_kernel(one_node_model("NonMaxSuppression", [boxes, scores], 11), [boxes, scores])
    assert selected.dtype == np.int64 and selected.shape == (0, 3)


FEATURES = RNG.standard_normal((2, 4, 20, 24)).astype(np.float32)
ROIS = np.array(
    [
        [1.0, 2.0, 15.5, 12.0],
        [0.0, 0.0, 23.0, 19.0],
        [5.3, 7.1, 6.0, 7.5],
        [-3.0, -2.0, 4.0, 30.0],
        [10, 4, 40, 22],
    ],
    dtype=np.float32,
)
BATCH_INDICES = np.array([0, 1, 1, 0, 1], dtype=np.int64)


@pytest.mark.parametrize("coordinate_transformation_mode", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_average_matches_onnxruntime(coordinate_transformation_mode, sampling_ratio):
    assert_same_as_onnxruntime(
        "RoiAlign",
        [FEATURES, ROIS, BATCH_INDICES],
        16,
        output_height=6,
        output_width=5,
        sampling_ratio=sampling_ratio,
        spatial_scale=0.75,
        coordinate_transformation_mode=coordinate_transformation_mode,
    )


def test_roi_align_max_matches_onnxruntime():
    assert_same_as_onnxruntime(
        "RoiAlign",
        [FEATURES, ROIS, BATCH_INDICES],
        16,
        mode="max",
        output_height=3,
        output_width=4,
        sampling_ratio=2,
        coordinate_transformation_mode="output_half_pixel",
    )


def test_roi_align_opset_10_has_no_half_pixel_shift():
    assert_same_as_onnxruntime(
        "RoiAlign", [FEATURES, ROIS, BATCH_INDICES], 10, output_height=4, output_width=4, sampling_ratio=0
    )


def test_roi_align_rejects_a_batch_index_past_the_batch():
    inputs = [FEATURES, ROIS[:1], np.array([2], np.int64)]
    with pytest.raises(ValueError, match=r"RoiAlign .*batch_indices \[2\] outside batch 2"):
        run_kernel(one_node_model("RoiAlign", inputs, 16), inputs)
