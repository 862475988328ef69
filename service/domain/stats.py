"""Summaries of timing samples, the same for results measured here and posted from elsewhere."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class SampleStats:
    median: float
    p10: float
    p90: float
    mad: float  # median absolute deviation: the spread, robust to one slow run


def summarize(samples: list[float]) -> SampleStats | None:
    if not samples:
        return None
    values = np.asarray(samples, dtype=np.float64)
    median = float(np.median(values))
    return SampleStats(
        median=median,
        p10=float(np.percentile(values, 10)),
        p90=float(np.percentile(values, 90)),
        mad=float(np.median(np.abs(values - median))),
    )


def mann_whitney_greater(x: list[float] | np.ndarray, y: list[float] | np.ndarray) -> float:
    """One-sided p-value of the Mann-Whitney U test that `x` tends to be larger than `y`.

    The normal approximation with the tie correction and a continuity correction, as scipy's
    `mannwhitneyu(x, y, alternative="greater", method="asymptotic")`; with 30 samples a side, as the
    protocol takes, the approximation is within a few percent of the exact p-value where it matters.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = np.concatenate([x, y])
    ranks = _ranks(pooled)
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    _, counts = np.unique(pooled, return_counts=True)
    n = n1 + n2
    tie = float((counts**3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    variance = n1 * n2 / 12 * ((n + 1) - tie)
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    for start, end in zip(starts, ends, strict=True):
        if end - start > 1:
            ranks[order[start:end]] = (start + 1 + end) / 2
    return ranks


def successive_spread(values: list[float] | np.ndarray) -> float:
    """The spread of a sequence from its successive differences: 1.4826 × their median absolute value / √2,
    the standard deviation for independent normal values, moved by neither an outlier nor a level shift.
    The differences are taken about zero, not about their median: a sequence that alternates (low,
    high, low) has differences of both signs, and the spread about their median would be near zero."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(np.diff(values))) / math.sqrt(2))


def successive_mean_spread(values: list[float] | np.ndarray, trim: float = 0.1) -> float:
    """The spread of a sequence from the mean of its successive differences' absolute values, the largest
    `trim` of them left out (a level shift makes one large difference, a lone outlier two), scaled to
    the standard deviation of independent normal values. A mean of the differences varies much less
    from one stretch of a sequence to the next than their median (`successive_spread`) does, whose
    estimate from 20–100 values swings by a factor of two: a series whose jobs wobble by 4.5% can read
    1.9% or 8.7%, and its bar with it."""
    ordered = np.sort(np.abs(np.diff(np.asarray(values, dtype=np.float64))))
    if len(ordered) == 0:
        return 0.0
    kept = len(ordered) - int(len(ordered) * trim)
    share = kept / len(ordered)
    # E|d| over the kept share of d ~ N(0, 2σ²): √2 σ × E[|Z|; |Z| < z] / share, z the share's quantile of |Z|.
    cut = NormalDist().inv_cdf((1 + share) / 2) if share < 1 else math.inf
    per_sigma = math.sqrt(2) * math.sqrt(2 / math.pi) * (1 - math.exp(-cut * cut / 2)) / share
    return float(ordered[:kept].mean() / per_sigma)


def excess_over_neighbours(values: list[float] | np.ndarray, neighbours: int = 5) -> np.ndarray:
    """Each value's excess over the median of itself and its `neighbours` on either side, as a fraction of
    that median. A level shift moves only the few medians that straddle it, so a sequence's own tail
    survives a step in it; at the ends the sequence is mirrored to fill the neighbourhood."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return values
    reach = min(neighbours, len(values) - 1)
    padded = np.pad(values, reach, mode="reflect") if reach else values
    local = np.median(np.lib.stride_tricks.sliding_window_view(padded, 2 * reach + 1), axis=1)
    return values / local - 1
