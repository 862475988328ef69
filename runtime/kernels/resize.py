"""Resizing kernels: Resize (opsets 10-19) and the deprecated Upsample (7, 9).

Every mode Resize offers is separable, so an N-D resize is one 1-D resize per changed axis.
For each axis a plan holds two small tables, built once per (input shape, scales/sizes, roi)
and cached: `taps` (output positions x taps) source indices, already clamped into the input
as the spec's edge padding asks, and `weights` of the same shape. Applying an axis is then
one `take` and one multiply-add per tap over the whole tensor: nearest is a single gather
(exact for every dtype), linear two taps, cubic four, and antialiased filters as many as the
stretched support needs.

Where a source coordinate x falls between pixels, taps are counted from `base`, the pixel
left of x, with `ratio = x - base` in (0, 1]: an x exactly on a pixel counts from the pixel
before it (ratio 1). This is how the spec's reference chooses neighbours, and it decides
which pixels an antialiased or exclude_outside filter sees at exact hits.

Source coordinates are computed in float64 from the float32 scales, as the reference does.
ONNX Runtime computes them in float32, so where a coordinate lands within float32 rounding of
a nearest-mode tie (scale 0.7: (3 + 0.5) / 0.7 - 0.5 is 4.50000009 in float64, 4.5 in
float32) the two can pick neighbouring pixels; the conformance cases follow the reference.

Integer inputs are interpolated in floating point, then rounded half to even and saturated
into their type, as the reference's saturate_cast does; float16/bfloat16 go through float32.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.backends import numpy_backend
from runtime.kernels.base import Kernel, UnsupportedOp

_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


# ---- source coordinates ----------------------------------------------------------------


def _source_coordinates(mode, out_size, in_size, scale, roi_start, roi_end):
    """Where each output position samples the input along one axis (float64)."""
    y = np.arange(out_size, dtype=np.float64)
    out_extent = scale * in_size  # the unrounded output length the scale implies
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        # Centres the rounded output on the input: only differs from half_pixel when
        # out_size != scale * in_size.
        offset = in_size / 2 * (1 - out_size / out_extent)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if out_size > 1 else np.full(out_size, -0.5)
    if mode == "align_corners":
        return y * (in_size - 1) / (out_extent - 1) if out_extent != 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    # tf_crop_and_resize: the output spans roi of the input, corner to corner.
    if out_extent != 1:
        x = y * (roi_end - roi_start) * (in_size - 1) / (out_extent - 1)
    else:
        x = np.full(out_size, (roi_end - roi_start) * (in_size - 1) / 2)
    return x + roi_start * (in_size - 1)


def _nearest_index(x, nearest_mode, downsampling):
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if nearest_mode == "floor":
        return np.floor(x)
    if nearest_mode == "ceil":
        return np.ceil(x)
    # "simple", Resize-10 and Upsample as ONNX Runtime runs them: truncate when upsampling,
    # round up when downsampling.
    return np.ceil(x) if downsampling else np.trunc(x)


# ---- filters: weight of the input pixel at signed distance d from x ---------------------


def _linear_filter(d, a):
    return np.clip(1 - np.abs(d), 0, 1)


def _cubic_filter(d, a):
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


_FILTERS = {"linear": (_linear_filter, 1), "cubic": (_cubic_filter, 2)}  # filter, support radius


class _AxisPlan:
    """One axis's resize: gather `taps` (out, n) from the input, weigh by `weights`, and
    overwrite positions flagged in `extrapolated` with the extrapolation value."""

    def __init__(self, axis, taps, weights, extrapolated):
        self.axis = axis
        self.taps = taps
        self.weights = weights
        self.extrapolated = extrapolated


# ---- the shared kernel ------------------------------------------------------------------


class _Resampler(Kernel):
    """Resize's behaviour; subclasses only say which attributes and inputs their opset has."""

    mode = "nearest"
    coordinate_mode = "half_pixel"
    nearest_mode = "round_prefer_floor"
    cubic_coeff_a = -0.75
    exclude_outside = False
    extrapolation_value = 0.0
    antialias = False
    axes: list[int] | None = None
    aspect_policy = "stretch"

    def _check_attributes(self):
        where = f"{self.op_type} '{self.node.name}'"
        if self.mode not in ("nearest", "linear", "cubic"):
            raise UnsupportedOp(f"{where}: unknown mode {self.mode!r}")
        if self.coordinate_mode not in _COORDINATE_MODES:
            raise UnsupportedOp(f"{where}: unknown coordinate_transformation_mode {self.coordinate_mode!r}")
        if self.nearest_mode not in _NEAREST_MODES:
            raise UnsupportedOp(f"{where}: unknown nearest_mode {self.nearest_mode!r}")
        if self.aspect_policy not in _ASPECT_POLICIES:
            raise UnsupportedOp(f"{where}: unknown keep_aspect_ratio_policy {self.aspect_policy!r}")
        self._plans: dict = {}

    # -- planning (host side, once per distinct shape/scales/sizes/roi) --

    def _output_geometry(self, shape, scales, sizes):
        """(axes, per-axis scale, per-axis output size) for the resized axes."""
        rank = len(shape)
        where = f"{self.op_type} '{self.node.name}'"
        axes = list(range(rank)) if self.axes is None else [a + rank if a < 0 else a for a in self.axes]
        if scales is not None and sizes is not None:
            raise ValueError(f"{where}: give either scales or sizes, not both")
        if scales is None and sizes is None:
            raise ValueError(f"{where}: needs scales or sizes")
        given = scales if scales is not None else sizes
        if len(given) != len(axes):
            name = "scales" if scales is not None else "sizes"
            raise ValueError(
                f"{where}: {name} has {len(given)} values for {len(axes)} axes of input {list(shape)}"
            )
        if scales is not None:
            if any(s <= 0 for s in scales):
                raise ValueError(f"{where}: scales must be positive, got {list(scales)}")
            return (
                axes,
                list(scales),
                [int(math.floor(s * shape[a])) for s, a in zip(scales, axes, strict=True)],
            )
        ratios = [n / shape[a] for n, a in zip(sizes, axes, strict=True)]
        if self.aspect_policy == "stretch":
            return axes, ratios, [int(n) for n in sizes]
        ratio = min(ratios) if self.aspect_policy == "not_larger" else max(ratios)
        return axes, [ratio] * len(axes), [int(ratio * shape[a] + 0.5) for a in axes]

    def _plan(self, shape, scales, sizes, roi):
        axes, axis_scales, out_sizes = self._output_geometry(shape, scales, sizes)
        rank = len(shape)
        plans = []
        for position, (axis, scale, out_size) in enumerate(zip(axes, axis_scales, out_sizes, strict=True)):
            roi_start, roi_end = 0.0, 1.0
            if self.coordinate_mode == "tf_crop_and_resize":
                if roi is None:
                    raise ValueError(f"{self.op_type} '{self.node.name}': tf_crop_and_resize needs roi")
                span = len(axes) if len(roi) == 2 * len(axes) else rank
                index = position if span == len(axes) else axis
                roi_start, roi_end = roi[index], roi[index + span]
            unchanged = out_size == shape[axis] and scale == 1.0 and (roi_start, roi_end) == (0.0, 1.0)
            if unchanged:
                continue
            plans.append(self._axis_plan(axis, shape[axis], out_size, scale, roi_start, roi_end))
        return tuple(shape[a] if a not in axes else out_sizes[axes.index(a)] for a in range(rank)), plans

    def _axis_plan(self, axis, in_size, out_size, scale, roi_start, roi_end):
        x = _source_coordinates(self.coordinate_mode, out_size, in_size, scale, roi_start, roi_end)
        extrapolated = None
        if self.coordinate_mode == "tf_crop_and_resize":
            outside = (x < 0) | (x > in_size - 1)
            extrapolated = outside if outside.any() else None
        if self.mode == "nearest":
            index = _nearest_index(x, self.nearest_mode, scale < 1)
            taps = np.clip(index, 0, in_size - 1).astype(np.intp)[:, None]
            return _AxisPlan(axis, taps, None, extrapolated)
        kernel, radius = _FILTERS[self.mode]
        # Antialiasing stretches the filter by 1/scale when downsampling, widening its support.
        stretch = min(scale, 1.0) if self.antialias else 1.0
        first = math.floor(-radius / stretch) + 1  # first tap, relative to base
        count = 2 * (1 - first)
        base = np.floor(x)
        base = np.where(base == x, x - 1, base)  # exact hits count from the pixel before
        indices = base[:, None] + np.arange(first, first + count)[None, :]
        weights = kernel((indices - x[:, None]) * stretch, self.cubic_coeff_a)
        if self.antialias:
            weights = weights / weights.sum(axis=1, keepdims=True)
        if self.exclude_outside:
            weights = np.where((indices < 0) | (indices > in_size - 1), 0.0, weights)
            total = weights.sum(axis=1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        taps = np.clip(indices, 0, in_size - 1).astype(np.intp)
        return _AxisPlan(axis, taps, weights, extrapolated)

    # -- running --

    def _resample(self, x, scales, sizes, roi):
        xp = self.xp
        key = (x.shape, scales, sizes, roi)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(x.shape, scales, sizes, roi)
        out_shape, axis_plans = plan
        if any(n == 0 for n in out_shape):
            return xp.empty(out_shape, dtype=x.dtype)
        dtype = x.dtype
        interpolating = self.mode != "nearest"
        if interpolating:
            x = x.astype(_compute_dtype(dtype), copy=False)
        for axis_plan in axis_plans:
            x = self._apply(x, axis_plan)
        if not axis_plans:
            x = x.copy()
        if interpolating and x.dtype != dtype:
            if np.issubdtype(dtype, np.integer):
                info = np.iinfo(dtype)
                x = xp.clip(xp.rint(x), info.min, info.max)
            x = x.astype(dtype)
        return x

    def _apply(self, x, axis_plan):
        xp = self.xp
        axis = axis_plan.axis
        taps = xp.asarray(axis_plan.taps)
        shape = [1] * x.ndim
        shape[axis] = -1
        if axis_plan.weights is None:
            y = xp.take(x, taps[:, 0], axis=axis)
        else:
            weights = xp.asarray(axis_plan.weights.astype(x.dtype))
            y = xp.take(x, taps[:, 0], axis=axis) * weights[:, 0].reshape(shape)
            for t in range(1, taps.shape[1]):
                y += xp.take(x, taps[:, t], axis=axis) * weights[:, t].reshape(shape)
        if axis_plan.extrapolated is not None:
            mask = xp.asarray(axis_plan.extrapolated).reshape(shape)
            y = xp.where(mask, xp.asarray(self.extrapolation_value, dtype=y.dtype), y)
        return y


def _compute_dtype(dtype):
    if dtype in (np.float32, np.float64):
        return dtype
    if np.issubdtype(dtype, np.integer) and dtype.itemsize >= 4:
        return np.float64  # float32 cannot hold every int32/int64
    return np.float32


def _as_tuple(backend, array, kind):
    """A small input (scales, sizes, roi), brought to the host, as a hashable tuple; None when
    omitted or empty."""
    if array is None:
        return None
    values = backend.to_host(array).reshape(-1)
    if values.size == 0:
        return None
    return tuple(kind(v) for v in values.tolist())


class Resize_10(_Resampler):
    """Opset 10: scales only, asymmetric coordinates, ONNX Runtime's "simple" nearest rounding."""

    op_type = "Resize"
    since_version = 10
    coordinate_mode = "asymmetric"
    nearest_mode = "simple"

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.mode = self.attr("mode", "nearest")
        if self.mode == "cubic":
            raise UnsupportedOp(f"Resize '{node.name}': cubic mode arrived in opset 11")
        self._check_attributes()

    def run(self, x, scales):
        return (self._resample(x, _as_tuple(self.backend, scales, float), None, None),)


class Resize(_Resampler):
    """Opsets 11 to 19: every attribute reads its default when its opset does not have it."""

    op_type = "Resize"
    since_version = 11

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.mode = self.attr("mode", "nearest")
        self.coordinate_mode = self.attr("coordinate_transformation_mode", "half_pixel")
        self.nearest_mode = self.attr("nearest_mode", "round_prefer_floor")
        self.cubic_coeff_a = float(self.attr("cubic_coeff_a", -0.75))
        self.exclude_outside = bool(self.attr("exclude_outside", 0))
        self.extrapolation_value = float(self.attr("extrapolation_value", 0.0))
        self.antialias = bool(self.attr("antialias", 0))
        self.axes = self.attr("axes")
        self.aspect_policy = self.attr("keep_aspect_ratio_policy", "stretch")
        if self.coordinate_mode == "tf_half_pixel_for_nn" and opset >= 13:
            raise UnsupportedOp(f"Resize '{node.name}': tf_half_pixel_for_nn was removed in opset 13")
        if self.nearest_mode == "simple":
            raise UnsupportedOp(f"Resize '{node.name}': nearest_mode 'simple' is not an ONNX value")
        self._check_attributes()

    def run(self, x, roi=None, scales=None, sizes=None):
        scales, sizes = _as_tuple(self.backend, scales, float), _as_tuple(self.backend, sizes, int)
        return (self._resample(x, scales, sizes, _as_tuple(self.backend, roi, float)),)


class Upsample_7(_Resampler):
    """Opset 7: scales as an attribute; asymmetric coordinates, nearest truncates."""

    op_type = "Upsample"
    since_version = 7
    coordinate_mode = "asymmetric"
    nearest_mode = "simple"

    def __init__(self, node, opset, backend=numpy_backend):
        super().__init__(node, opset, backend)
        self.mode = self.attr("mode", "nearest")
        if self.mode == "bilinear":  # accepted by opset 7 as another name for linear
            self.mode = "linear"
        if self.mode == "cubic":
            raise UnsupportedOp(f"Upsample '{node.name}': mode must be nearest or linear")
        self.scales = self.attr("scales")
        self._check_attributes()

    def run(self, x):
        return (self._resample(x, tuple(float(s) for s in self.scales), None, None),)


class Upsample(Upsample_7):
    """Opset 9: scales as an input."""

    since_version = 9

    def run(self, x, scales):
        return (self._resample(x, _as_tuple(self.backend, scales, float), None, None),)


KERNELS = [
    Resize_10,
    Resize,
    Upsample_7,
    Upsample,
]
