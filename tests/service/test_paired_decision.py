"""The paired timing decision (service/domain/paired.py) on synthetic paired samples with known effects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.domain.paired import (
    DEFAULT_PAIRED_POLICY,
    IMPROVED,
    INCONCLUSIVE,
    REGRESSED,
    WITHIN_NOISE,
    decide_paired,
    hodges_lehmann_interval,
    pair_order,
    runs_per_block,
)


def _pairs(rng, n: int, effect: float, job_slowdown: float = 1.0, noise: float = 0.03):
    """n pairs of block levels: a shared slow-moment factor per pair (both sides), independent noise per block."""
    moment = np.exp(rng.gamma(0.5, 0.2, n))  # lopsided: a shared machine only adds time
    baseline = job_slowdown * moment * np.exp(rng.normal(0, noise, n))
    candidate = job_slowdown * moment * effect * np.exp(rng.normal(0, noise, n))
    return baseline, candidate


def _sequential(baseline, candidate, policy=DEFAULT_PAIRED_POLICY):
    """Decide after each pair, as the worker does, until decided or out of pairs."""
    for n in range(policy.min_pairs, len(baseline) + 1):
        verdict = decide_paired(baseline[:n], candidate[:n], policy)
        if verdict.decided:
            return verdict
    return verdict


def test_a_whole_job_slowdown_of_both_sides_never_alerts():
    rng = np.random.default_rng(1)
    words = [_sequential(*_pairs(rng, 60, 1.0, job_slowdown=2.0)).word for _ in range(300)]
    assert words.count(REGRESSED) == 0 and words.count(IMPROVED) == 0
    assert words.count(WITHIN_NOISE) >= 290


@pytest.mark.parametrize(("effect", "word"), [(1.10, REGRESSED), (1.20, REGRESSED), (1 / 1.10, IMPROVED)])
def test_known_effects_are_called_and_the_interval_covers_them(effect, word):
    rng = np.random.default_rng(2)
    verdicts = [_sequential(*_pairs(rng, 60, effect)) for _ in range(200)]
    assert sum(v.word == word for v in verdicts) >= 195
    covered = sum(v.low <= effect <= v.high for v in verdicts)
    assert covered >= 180  # a 99% interval, checked at every pair: its coverage at the stop is lower


def test_a_change_below_the_minimum_effect_is_within_noise_not_regressed():
    rng = np.random.default_rng(3)
    words = [_sequential(*_pairs(rng, 60, 1.01, noise=0.01)).word for _ in range(100)]
    assert words.count(REGRESSED) == 0 and words.count(WITHIN_NOISE) >= 95


def test_too_few_pairs_or_too_much_noise_is_inconclusive():
    assert decide_paired([1.0] * 5, [1.5] * 5).word == INCONCLUSIVE  # under min_pairs
    rng = np.random.default_rng(4)
    baseline, candidate = _pairs(rng, 8, 1.05, noise=0.3)
    assert decide_paired(baseline, candidate).word == INCONCLUSIVE
    empty = decide_paired([], [])
    assert empty.word == INCONCLUSIVE and empty.pairs == 0 and empty.to_dict()["high"] is None
    with pytest.raises(ValueError, match="differ in length"):
        decide_paired([1.0, 2.0], [1.0])


def test_the_interval_is_the_exact_signed_rank_one():
    # n = 10, 99% two-sided: the critical count is 3 (P(T <= 3) = 5/1024 <= 0.005 < P(T <= 4) = 7/1024).
    values = np.arange(1.0, 11.0)
    estimate, low, high = hodges_lehmann_interval(values, 0.99)
    walsh = np.sort([(values[i] + values[j]) / 2 for i in range(10) for j in range(i, 10)])
    assert estimate == pytest.approx(5.5)
    assert (low, high) == (walsh[3], walsh[-4])
    assert hodges_lehmann_interval(values[:3], 0.99)[1] == -math.inf  # too few for 99%


def test_the_verdict_describes_itself_as_the_alert_quotes_it():
    verdict = decide_paired([1.0] * 12, [1.12] * 12)
    assert verdict.word == REGRESSED
    assert verdict.describe().startswith("candidate / baseline = 1.120 [1.120, 1.120] over 12 paired blocks")


def test_blocks_alternate_and_fill_the_block_time():
    assert [pair_order(p) for p in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    assert runs_per_block(0.0001) == 200 and runs_per_block(0.001) == 50 and runs_per_block(0.02) == 2
    assert runs_per_block(2.0) == 1
