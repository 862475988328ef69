"""bench.detect_paired counts what the paired path would say: on a tiny synthetic capture (quiet null
pairs), no commit without a step regresses, and every step of 10% or more is caught at its commit."""

from __future__ import annotations

import numpy as np
import pytest

from bench import detect_paired
from service.domain import paired


def _capture(spread: float, series: int = 2, jobs: int = 3, pairs: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    levels = 2.0 * np.exp(rng.normal(0, spread, size=(series, jobs, pairs, 2)))
    return levels, np.full((series, jobs, pairs, 2), 0.05)


def test_a_quiet_null_is_within_noise_and_a_big_step_regresses_once_repeated():
    levels, block_s = _capture(0.002)
    policy = paired.PairedPolicy()
    a, b = levels[0, 0, :, 0], levels[0, 0, :, 1]
    null = detect_paired.decide_sequentially(a, b, block_s[0, 0].sum(axis=1), policy)
    step = detect_paired.decide_sequentially(a, b * 1.2, block_s[0, 0].sum(axis=1), policy)
    # 8 pairs: the first count whose exact 99% signed-rank interval is finite; a regression called
    # there stands when the next 8 pairs repeat it.
    assert (null.word, null.pairs) == (paired.WITHIN_NOISE, 8)
    assert (step.word, step.pairs) == (paired.REGRESSED, 16)
    assert step.seconds == pytest.approx(16 * 0.1)


def test_the_replay_counts_planted_steps_and_nulls():
    levels, block_s = _capture(0.002)
    counts = detect_paired.replay(levels, block_s, series=32, commits=12, seed=1)
    summary = detect_paired.summarize(counts)
    assert counts["false_alarms"] == 0 and counts["null_words"] == {paired.WITHIN_NOISE: 32 * 11}
    assert summary["big_caught"] == summary["big_steps"] == 16  # 10, 15, 20, 30% × 2 sources × 2 rounds
    assert summary["by_step"]["2%"] == "0/4" and summary["median_pairs"] == 8
    pooled = detect_paired.summarize(detect_paired.pool([counts, counts]))
    assert pooled["series_commits"] == 2 * 32 * 12 and pooled["big_steps"] == 32


def test_a_null_that_runs_out_of_pairs_stays_quiet_and_is_measured_again():
    levels, block_s = _capture(0.06, pairs=8)  # 6% noise: 8 pairs never settle within ±5%
    counts = detect_paired.replay(levels, block_s, series=8, commits=5, seed=2)
    assert counts["null_words"].get(paired.REGRESSED, 0) == counts["false_alarms"]
    assert counts["remeasured"] > 0 and counts["null_words"].get(paired.INCONCLUSIVE, 0) > 0
