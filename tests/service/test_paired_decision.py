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
    AdaptiveStop,
    PairedPolicy,
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
    """Decide after each pair, as the worker does (AdaptiveStop), until it stops or the pairs run out."""
    stop = AdaptiveStop(policy)
    for n in range(1, len(baseline) + 1):
        if stop.after_pair(baseline[:n], candidate[:n], 0.0) is not None:
            break
    return stop.verdict


def _run(baseline, candidate, policy=DEFAULT_PAIRED_POLICY):
    """(verdict, pairs, why it stopped) of AdaptiveStop over the given pairs, their last ending the job."""
    stop = AdaptiveStop(policy)
    for n in range(1, len(baseline) + 1):
        if (why := stop.after_pair(baseline[:n], candidate[:n], math.inf if n == len(baseline) else 0.0)) is not None:
            return stop.verdict, n, why
    raise AssertionError("the last pair must stop it")


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


def test_a_regression_stands_only_when_the_next_as_many_pairs_repeat_it():
    rng = np.random.default_rng(5)
    wobble = np.exp(rng.normal(0, 0.002, 60))
    verdict, pairs, why = _run(np.ones(60), 1.12 * wobble)
    assert (verdict.word, pairs) == (REGRESSED, 16)
    assert why == "regressed after 8 pairs, and again on the 8 pairs after"
    assert verdict.pairs == 16 and 1.11 < verdict.ratio < 1.13


def test_a_rise_in_the_first_pairs_alone_is_not_a_regression():
    # The first eight candidate blocks drew a scheduler slice each (+15%), the rest did not: called
    # after 8 pairs on the rise, checked on the next 8, which are level, and never regressed after.
    rng = np.random.default_rng(6)
    candidate = np.exp(rng.normal(0, 0.002, 60))
    candidate[:8] *= 1.15
    verdict, pairs, why = _run(np.ones(60), candidate)
    assert decide_paired(np.ones(8), candidate[:8]).word == REGRESSED  # what the old rule stopped on
    assert verdict.word == WITHIN_NOISE and why == f"decided after {pairs} pairs" and pairs > 16


def test_a_budget_that_ends_before_the_check_is_inconclusive():
    short = PairedPolicy(max_pairs=12)
    verdict, pairs, why = _run(np.ones(60), np.full(60, 1.12), short)
    assert (verdict.word, pairs) == (INCONCLUSIVE, 12)
    assert why == ("the job's 12 pairs were measured; the regression called after 8 pairs could not be "
                   "checked on only the 4 pairs after")
    verdict, pairs, why = _run(np.ones(8), np.full(8, 1.12))  # the budget ends at the call itself
    assert verdict.word == INCONCLUSIVE and why.endswith("before the regression called after 8 pairs could be checked")
    assert verdict.ratio == pytest.approx(1.12)


def test_improved_and_within_noise_stop_at_once():
    verdict, pairs, _ = _run(np.ones(60), np.full(60, 0.9))
    assert (verdict.word, pairs) == (IMPROVED, 8)
    assert _run(np.ones(60), np.ones(60))[2] == "decided after 8 pairs"
