"""Object-detection kernels: NonMaxSuppression and RoiAlign.

NonMaxSuppression, per (batch, class): the candidates above score_threshold sorted by score
(ties: lower box index first), their pairwise "suppresses" matrix computed once as array
math, then the greedy pass — keep the best live box, kill what it suppresses — which is a
loop over *kept* boxes only, each step one vectorized row operation. IoU arithmetic is done
in the boxes' own dtype, in the spec reference's order, so a box whose IoU lands exactly on
the threshold is kept or suppressed as the reference decides.

RoiAlign, per region: bilinear sampling on a regular sub-grid of each output bin. Average
pooling is separable — the weight a sample gives pixel (h, w) is wy(h) * wx(w), and a sample
outside the feature map contributes nothing in either factor — so each region is two small
matmuls, Ay (out_h x H) @ X[b] @ Ax^T (W x out_w), for all channels at once. Max pooling is
not separable (ONNX takes the max over samples of the largest weighted corner, as ONNX
Runtime does), so it gathers the four weighted corners of every sample and reduces.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp


def _corners(boxes, center_point_box):
    """(x_min, y_min, x_max, y_max) for [num_boxes, 4] boxes in either ONNX box format."""
    if center_point_box:
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        return boxes[:, 0] - half_w, boxes[:, 1] - half_h, boxes[:, 0] + half_w, boxes[:, 1] + half_h
    # [y1, x1, y2, x2] with either corner first
    return (
        np.minimum(boxes[:, 1], boxes[:, 3]),
        np.minimum(boxes[:, 0], boxes[:, 2]),
        np.maximum(boxes[:, 1], boxes[:, 3]),
        np.maximum(boxes[:, 0], boxes[:, 2]),
    )


def _suppression_matrix(boxes, center_point_box, iou_threshold):
    """[k, k] bool: box i suppresses box j (IoU above the threshold, both boxes non-empty)."""
    x_min, y_min, x_max, y_max = _corners(boxes, center_point_box)
    overlap_w = np.minimum(x_max[:, None], x_max[None, :]) - np.maximum(x_min[:, None], x_min[None, :])
    overlap_h = np.minimum(y_max[:, None], y_max[None, :]) - np.maximum(y_min[:, None], y_min[None, :])
    intersection = overlap_w * overlap_h
    area = (x_max - x_min) * (y_max - y_min)
    union = area[:, None] + area[None, :] - intersection
    valid = (overlap_w > 0) & (overlap_h > 0) & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = intersection / np.where(valid, union, 1)
    return valid & (iou > iou_threshold)


class NonMaxSuppression(Kernel):
    op_type = "NonMaxSuppression"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.center_point_box = self.attr("center_point_box", 0)
        if self.center_point_box not in (0, 1):
            raise UnsupportedOp(f"NonMaxSuppression '{node.name}': center_point_box must be 0 or 1")

    def run(self, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None):
        # Selection is data-dependent control flow: it runs on the host.
        to_host = self.backend.to_host
        boxes, scores = to_host(boxes), to_host(scores)
        limit = _scalar(max_output_boxes_per_class, 0, int, to_host)
        iou_limit = np.asarray(_scalar(iou_threshold, 0.0, float, to_host), dtype=boxes.dtype)
        has_score_threshold = score_threshold is not None and score_threshold.size > 0
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0]:
            raise ValueError(
                f"NonMaxSuppression '{self.node.name}': boxes {list(boxes.shape)} must be [batch, boxes, 4] "
                f"and scores {list(scores.shape)} [batch, classes, boxes]"
            )
        selected = []
        for batch in range(boxes.shape[0] if limit > 0 else 0):
            for cls in range(scores.shape[1]):
                class_scores = scores[batch, cls]
                candidates = np.arange(class_scores.size)
                if has_score_threshold:
                    candidates = candidates[class_scores > to_host(score_threshold).reshape(-1)[0]]
                # Highest score first; a stable sort keeps lower indices first among ties.
                candidates = candidates[np.argsort(-class_scores[candidates], kind="stable")]
                suppresses = _suppression_matrix(boxes[batch, candidates], self.center_point_box, iou_limit)
                alive = np.ones(candidates.size, dtype=bool)
                kept = 0
                while kept < limit and alive.any():
                    best = int(np.argmax(alive))
                    selected.append((batch, cls, int(candidates[best])))
                    kept += 1
                    alive[best] = False
                    alive &= ~suppresses[best]
        result = np.array(selected, dtype=np.int64).reshape(-1, 3)
        return (self.xp.asarray(result),)


def _scalar(array, default, kind, to_host):
    if array is None or array.size == 0:
        return default
    return kind(to_host(array).reshape(-1)[0])


class RoiAlign(Kernel):
    op_type = "RoiAlign"
    since_version = 10

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        where = f"RoiAlign '{node.name}'"
        self.mode = self.attr("mode", "avg")
        if self.mode not in ("avg", "max"):
            raise UnsupportedOp(f"{where}: unknown mode {self.mode!r}")
        # Opset 10 had no attribute and shifted nothing: "output_half_pixel".
        default_mode = "half_pixel" if opset >= 16 else "output_half_pixel"
        coordinate_mode = self.attr("coordinate_transformation_mode", default_mode)
        if coordinate_mode not in ("half_pixel", "output_half_pixel"):
            raise UnsupportedOp(f"{where}: unknown coordinate_transformation_mode {coordinate_mode!r}")
        self.half_pixel = coordinate_mode == "half_pixel"
        self.out_h = self.attr("output_height", 1)
        self.out_w = self.attr("output_width", 1)
        self.sampling_ratio = self.attr("sampling_ratio", 0)
        self.spatial_scale = float(self.attr("spatial_scale", 1.0))

    def run(self, x, rois, batch_indices):
        xp = self.xp
        n, c, height, width = x.shape
        dtype = x.dtype
        compute = np.float32 if dtype == np.float16 else dtype
        rois_host = self.backend.to_host(rois).astype(np.float64)
        batches = self.backend.to_host(batch_indices).astype(np.int64).reshape(-1)
        if rois_host.ndim != 2 or rois_host.shape[1] != 4 or rois_host.shape[0] != batches.size:
            raise ValueError(
                f"RoiAlign '{self.node.name}': rois {list(rois_host.shape)} must be [num_rois, 4] "
                f"with one batch index each (got {batches.size})"
            )
        if batches.size and (batches.min() < 0 or batches.max() >= n):
            raise ValueError(
                f"RoiAlign '{self.node.name}': batch_indices {batches.tolist()} outside batch {n}"
            )
        x = x.astype(compute, copy=False)
        y = xp.empty((batches.size, c, self.out_h, self.out_w), dtype=compute)
        for r, (roi, batch) in enumerate(zip(rois_host, batches, strict=True)):
            offset = 0.5 if self.half_pixel else 0.0
            start_w, start_h, end_w, end_h = (roi * self.spatial_scale - offset).tolist()
            roi_w, roi_h = end_w - start_w, end_h - start_h
            if not self.half_pixel:  # malformed regions become 1x1
                roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
            grid_h = self.sampling_ratio if self.sampling_ratio > 0 else math.ceil(roi_h / self.out_h)
            grid_w = self.sampling_ratio if self.sampling_ratio > 0 else math.ceil(roi_w / self.out_w)
            rows = _axis_samples(start_h, roi_h / self.out_h, self.out_h, grid_h, height)
            cols = _axis_samples(start_w, roi_w / self.out_w, self.out_w, grid_w, width)
            if self.mode == "avg":
                count = max(grid_h * grid_w, 1)
                ay = xp.asarray(_dense(rows, height, self.out_h).astype(compute))
                ax = xp.asarray(_dense(cols, width, self.out_w).astype(compute))
                y[r] = (ay @ x[batch] @ ax.T) / count
            else:
                y[r] = self._max_pool(x[batch], rows, cols, grid_h, grid_w, compute)
        return (y.astype(dtype, copy=False),)

    def _max_pool(self, image, rows, cols, grid_h, grid_w, compute):
        xp = self.xp
        (y_low, y_high, wy_low, wy_high), (x_low, x_high, wx_low, wx_high) = rows, cols
        corners = []
        for yi, wy in ((y_low, wy_low), (y_high, wy_high)):
            for xi, wx in ((x_low, wx_low), (x_high, wx_high)):
                weight = xp.asarray(np.outer(wy, wx).astype(compute))
                corners.append(image[:, xp.asarray(yi)[:, None], xp.asarray(xi)[None, :]] * weight)
        largest = corners[0]
        for corner in corners[1:]:
            largest = xp.maximum(largest, corner)
        c = image.shape[0]
        largest = largest.reshape(c, self.out_h, grid_h, self.out_w, grid_w)
        return largest.max(axis=(2, 4))


def _axis_samples(start, bin_size, bins, grid, size):
    """Sample positions along one axis, bin-major: (low index, high index, low weight, high
    weight), each [bins * grid]. A sample beyond the map's -1..size band weighs nothing; one
    past the last pixel snaps onto it."""
    steps = np.arange(bins)[:, None] * bin_size + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    pos = (start + steps).reshape(-1)
    outside = (pos < -1.0) | (pos > size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    pos = np.where(at_edge, low, pos)
    frac = pos - low
    w_low, w_high = np.where(outside, 0.0, 1.0 - frac), np.where(outside, 0.0, frac)
    return np.where(outside, 0, low), np.where(outside, 0, high), w_low, w_high


def _dense(samples, size, bins):
    """The [bins, size] matrix summing each bin's samples' interpolation weights per pixel."""
    low, high, w_low, w_high = samples
    grid = low.size // bins
    matrix = np.zeros((bins, size))
    owner = np.repeat(np.arange(bins), grid)
    np.add.at(matrix, (owner, low), w_low)
    np.add.at(matrix, (owner, high), w_high)
    return matrix


KERNELS = [
    NonMaxSuppression,
    RoiAlign,
]
