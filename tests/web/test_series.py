"""Thinning a long series for a chart (service/queries/series.py `thin`): bounded, and nothing a reader
looks for is lost — fused-op steps at their exact commits, alerts, the extremes of the timing."""

from __future__ import annotations

import random

from service.queries.series import Sample, thin


def _series(n: int, step_at: int) -> list[Sample]:
    rng = random.Random(3)
    fused, dropped = {"com.microsoft.BiasGelu": 2}, {}
    return [Sample(seq=i + 1, commit_id=i + 1, median_ms=1.0 + rng.random() * 0.1, p10_ms=None, p90_ms=None,
                   fusions=fused if i < step_at else dropped) for i in range(n)]


def test_a_short_series_is_drawn_whole():
    samples = _series(500, 100)
    assert thin(samples, 1200) is samples


def test_a_long_series_keeps_steps_alerts_and_extremes_within_the_bound():
    samples = _series(10_000, 6_667)
    samples[4321] = samples[4321]._replace(median_ms=9.0)  # one slow commit
    samples[77] = samples[77]._replace(median_ms=0.2)  # one fast one
    kept = thin(samples, 1200, keep={5000})
    assert len(kept) <= 1200 + 4  # two per bucket, plus the step's two sides and the kept commit
    seqs = [s.seq for s in kept]
    assert seqs == sorted(seqs) and seqs[0] == 1 and seqs[-1] == 10_000
    assert {6_667, 6_668} <= set(seqs)  # the last commit with BiasGelu and the first without
    assert 5000 in seqs
    assert 4322 in seqs and 78 in seqs
