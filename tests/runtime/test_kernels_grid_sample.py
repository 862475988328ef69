"""GridSample against ONNX's backend node cases and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.kernels import grid_sample
from tests.runtime.node_cases import (
    assert_same_as_onnxruntime,
    node_case_test,
    node_cases,
    one_node_model,
    run_kernel,
)

CASES = list(node_cases(grid_sample.KERNELS))


def test_every_grid_sample_case_is_collected():
    assert len(CASES) == 18


test_node_case = node_case_test(grid_sample.KERNELS)


# ---------------------------------------------------------------- against onnxruntime
# The node cases sample 3x2 images; these use real feature-map sizes, batches, channels and
# grids that reach beyond the image so every padding mode is exercised.

RNG = np.random.default_rng(0)
IMAGE = RNG.standard_normal((2, 3, 16, 20)).astype(np.float32)
GRID = RNG.uniform(-1.3, 1.3, (2, 9, 11, 2)).astype(np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_matches_onnxruntime(mode, padding_mode, align_corners):
    assert_same_as_onnxruntime(
        "GridSample", [IMAGE, GRID], 20, mode=mode, padding_mode=padding_mode, align_corners=align_corners
    )


def test_opset_16_bilinear_and_bicubic_names():
    assert_same_as_onnxruntime("GridSample", [IMAGE, GRID], 16, mode="bilinear", padding_mode="border")
    assert_same_as_onnxruntime("GridSample", [IMAGE, GRID], 16, mode="bicubic", padding_mode="zeros")


def test_identity_grid_reproduces_the_image():
    # align_corners=1: the normalized pixel centres -1..1 map exactly onto pixels.
    height, width = IMAGE.shape[2:]
    ys, xs = np.meshgrid(np.linspace(-1, 1, height), np.linspace(-1, 1, width), indexing="ij")
    grid = np.broadcast_to(np.stack([xs, ys], axis=-1), (2, height, width, 2)).astype(np.float32)
    model = one_node_model("GridSample", [IMAGE, grid], 20, mode="linear", align_corners=1)
    (out,) = run_kernel(model, [IMAGE, grid])
    np.testing.assert_allclose(out, IMAGE, rtol=1e-5, atol=1e-5)


def test_volumetric_linear_matches_onnxruntime():
    volume = RNG.standard_normal((1, 2, 5, 6, 7)).astype(np.float32)
    grid = RNG.uniform(-1.1, 1.1, (1, 3, 4, 5, 3)).astype(np.float32)
    assert_same_as_onnxruntime("GridSample", [volume, grid], 20, mode="linear", padding_mode="zeros")
