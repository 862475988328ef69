"""Summaries of timing samples, the same for results measured here and posted from elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

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
