"""The paired timing decision: baseline and candidate measured in one job, block by block, alternately.

A shared machine's slow moments last seconds and hit every process on it: a job timed in one is slow
as a whole, and no threshold on job levels tuned on one noise capture holds on the next (issue 29:
25.8 false alarms per 1,000 series-commits on a fresh capture). Chromium's Pinpoint answers this with
A/B runs interleaved on one machine; so do we when the baseline's model file is stored. The worker
opens both models with the same engine, feeds and threads, and times short blocks in the order
A B B A A B B A … (`pair_order`): a slow moment then lands on both sides of a pair about equally,
and a drift within the job cancels out.

Each pair gives one ratio, candidate block over baseline block, a block's level being its fastest run
(as in domain/timing.py: contention only adds time). The decision is on the log ratios: the
Hodges-Lehmann estimate (the median of the Walsh averages) and its distribution-free confidence
interval from the exact Wilcoxon signed-rank distribution. With `confidence` 99% and six pairs or
more it says:

- "regressed": the interval lies above 1 and the estimate is at least 1 + the minimum effect;
- "improved": the interval lies below 1 and the estimate at most 1 / (1 + the minimum effect);
- "within noise": the interval lies inside (1 / (1 + effect), 1 + effect): whatever changed is smaller
  than the least change that counts;
- "inconclusive": none of these yet. Measuring goes on (`AdaptiveStop`) until one holds or the job's
  budget of pairs or machine seconds is spent; a job that ends inconclusive raises nothing.

Deciding after every pair looks at the data up to 55 times, and a few early pairs whose candidate
blocks drew a scheduler slice can read as a 5% rise with an interval above 1 (epyc1's capture: 35
false alarms in 32,000 null jobs, all called within the first pairs). So a "regressed" called after n
pairs stands only when the next n pairs, on their own, say "regressed" too: a replication, paid for
only by jobs that regress (`AdaptiveStop`).

A whole-job slowdown multiplies both sides of every pair and leaves each ratio as it was, which is the
point. The decision is pure (numbers in, a verdict out) for the tests and `make bench-detect`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

import numpy as np

REGRESSED, IMPROVED, WITHIN_NOISE, INCONCLUSIVE = "regressed", "improved", "within noise", "inconclusive"


@dataclass(frozen=True)
class PairedPolicy:
    min_effect_pct: float = 5.0  # the least change that counts (the protocol's timing_threshold_pct)
    confidence: float = 0.99  # two-sided coverage of the ratio's interval
    min_pairs: int = 6  # no decision on fewer pairs, however clear they look
    max_pairs: int = 60  # measuring stops here, decided or not
    max_seconds: float = 60.0  # ... or after this much machine time on the timed runs
    block_seconds: float = 0.05  # a block is as many runs as fill this (at least one, see runs_per_block)
    max_block_runs: int = 200


DEFAULT_PAIRED_POLICY = PairedPolicy()


@dataclass(frozen=True)
class PairedVerdict:
    word: str  # REGRESSED, IMPROVED, WITHIN_NOISE or INCONCLUSIVE
    ratio: float  # candidate / baseline: the Hodges-Lehmann estimate of the pairs' ratio
    low: float  # its confidence interval
    high: float
    pairs: int
    confidence: float
    min_effect_pct: float

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1) * 100

    @property
    def decided(self) -> bool:
        return self.word != INCONCLUSIVE

    def describe(self) -> str:
        """"candidate / baseline = 1.12 [1.09, 1.15] over 12 paired blocks" and what that means."""
        interval = f"[{self.low:.3f}, {self.high:.3f}]" if math.isfinite(self.high) else "(too few pairs for an interval)"
        return (f"candidate / baseline = {self.ratio:.3f} {interval} over {self.pairs} paired blocks "
                f"({self.confidence:.0%} interval; {self.word} against a minimum effect of {self.min_effect_pct:g}%)")

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in ("low", "high"):
            data[key] = data[key] if math.isfinite(data[key]) else None
        return data


def decide_paired(baseline: Sequence[float], candidate: Sequence[float], policy: PairedPolicy = DEFAULT_PAIRED_POLICY) -> PairedVerdict:
    """The verdict on paired block levels (baseline[i] measured next to candidate[i])."""
    if len(baseline) != len(candidate):
        raise ValueError(f"paired samples differ in length: {len(baseline)} baseline, {len(candidate)} candidate")
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    keep = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b)
    logs = np.log(b[keep] / a[keep])
    n = len(logs)
    if n == 0:
        return PairedVerdict(INCONCLUSIVE, 1.0, 0.0, math.inf, 0, policy.confidence, policy.min_effect_pct)
    estimate, low, high = hodges_lehmann_interval(logs, policy.confidence)
    ratio, low, high = math.exp(estimate), math.exp(low), math.exp(high)
    effect = 1 + policy.min_effect_pct / 100
    word = INCONCLUSIVE
    if n >= policy.min_pairs and math.isfinite(high):
        if low > 1 and ratio >= effect:
            word = REGRESSED
        elif high < 1 and ratio <= 1 / effect:
            word = IMPROVED
        elif 1 / effect < low and high < effect:
            word = WITHIN_NOISE
    return PairedVerdict(word, ratio, low, high, n, policy.confidence, policy.min_effect_pct)


class AdaptiveStop:
    """When the adaptive loop stops, and its verdict: after each pair, `after_pair` with every pair so
    far and the machine seconds spent returns why measuring stops, or None to time another pair.

    "within noise" and "improved" stop at once. "regressed" called after n pairs is checked on the next
    n pairs alone (fewer where the budget ends first): it stands when they say "regressed" too, and the
    pairs together still do; otherwise measuring goes on as before, and a regression called again later
    is checked the same way. A job whose budget ends on an unchecked or failed check is inconclusive."""

    def __init__(self, policy: PairedPolicy = DEFAULT_PAIRED_POLICY):
        self.policy = policy
        self.called_at: int | None = None  # pairs when "regressed" was called and not yet checked
        self.verdict: PairedVerdict | None = None

    def after_pair(self, baseline: Sequence[float], candidate: Sequence[float], machine_s: float) -> str | None:
        policy, n = self.policy, len(baseline)
        spent = n >= policy.max_pairs or machine_s >= policy.max_seconds
        budget = (f"the job's {policy.max_pairs} pairs were measured" if n >= policy.max_pairs else
                  f"the job's {policy.max_seconds:g} s of machine time were spent ({n} pairs)")
        if not spent and (n < policy.min_pairs or (self.called_at is not None and n < 2 * self.called_at)):
            return None  # nothing could be decided yet: spare the interval's cost
        whole = decide_paired(baseline, candidate, policy)
        self.verdict = whole
        if self.called_at is not None:
            called = self.called_at
            self.called_at = None
            fresh = decide_paired(baseline[called:], candidate[called:], policy)
            if fresh.word == REGRESSED and whole.word == REGRESSED:
                return f"regressed after {called} pairs, and again on the {n - called} pairs after"
            if spent:
                self.verdict = replace(whole, word=INCONCLUSIVE) if whole.word == REGRESSED else whole
                checked = ("did not hold on" if n - called >= policy.min_pairs else "could not be checked on only")
                return f"{budget}; the regression called after {called} pairs {checked} the {n - called} pairs after"
        if whole.word == REGRESSED:
            if spent:
                self.verdict = replace(whole, word=INCONCLUSIVE)
                return f"{budget} before the regression called after {n} pairs could be checked"
            self.called_at = n
            return None
        if whole.decided:
            return f"decided after {n} pairs"
        return budget if spent else None


def with_decision(pairs: dict, policy: PairedPolicy) -> dict:
    """A paired measurement as stored ({"baseline_ms", "candidate_ms", ...}) with the decision on it
    added: how posted pairs are judged, by the server's policy, whatever the poster thought."""
    verdict = decide_paired(pairs["baseline_ms"], pairs["candidate_ms"], policy)
    return {**pairs, **verdict.to_dict()}


def stored_verdict(pairs: dict | None) -> PairedVerdict | None:
    """The verdict a stored paired measurement carries (None: not paired)."""
    if not pairs or "word" not in pairs:
        return None
    return PairedVerdict(
        word=pairs["word"], ratio=pairs["ratio"], low=pairs["low"] if pairs["low"] is not None else 0.0,
        high=pairs["high"] if pairs["high"] is not None else math.inf, pairs=pairs["pairs"],
        confidence=pairs["confidence"], min_effect_pct=pairs["min_effect_pct"],
    )


def hodges_lehmann_interval(values: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """(estimate, low, high) of the centre of `values`' distribution: the median of the Walsh averages
    (x_i + x_j) / 2, i ≤ j, and the interval between the (c+1)-th smallest and largest of them, c the
    largest count with P(T ≤ c) ≤ (1 − confidence) / 2 under the signed-rank statistic's exact
    distribution. (-inf, inf) when there are too few values for that coverage."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    i, j = np.triu_indices(n)
    walsh = np.sort((values[i] + values[j]) / 2)
    estimate = float(np.median(walsh))
    c = _signed_rank_critical(n, (1 - confidence) / 2)
    if c < 0:
        return estimate, -math.inf, math.inf
    return estimate, float(walsh[c]), float(walsh[len(walsh) - 1 - c])


@lru_cache(maxsize=256)
def _signed_rank_critical(n: int, tail: float) -> int:
    """The largest c with P(T ≤ c) ≤ tail for the Wilcoxon signed-rank statistic T of n values
    (exact, by counting the subsets of 1..n with each sum), or -1 when even P(T = 0) exceeds it."""
    top = n * (n + 1) // 2
    counts = np.zeros(top + 1, dtype=np.float64)
    counts[0] = 1.0
    for k in range(1, n + 1):
        counts[k:] = counts[k:] + counts[:-k].copy()
    cumulative = np.cumsum(counts) / 2.0**n
    below = np.flatnonzero(cumulative <= tail)
    return int(below[-1]) if len(below) else -1


def pair_order(pair: int) -> tuple[str, str]:
    """The sides of pair `pair` (from 0) in the order they are timed: A B, B A, A B, … ("A B B A A B …"
    in all), so neither side is always timed first (a warm cache, a clock ramping up) and a drift
    through the job cancels out."""
    return ("A", "B") if pair % 2 == 0 else ("B", "A")


def runs_per_block(run_seconds: float, policy: PairedPolicy = DEFAULT_PAIRED_POLICY) -> int:
    """As many runs as fill `block_seconds` (a block's level is its fastest run: a few runs let it
    skip a slow moment within the block), at least one, at most `max_block_runs`."""
    if run_seconds <= 0:
        return policy.max_block_runs
    return max(1, min(policy.max_block_runs, int(policy.block_seconds / run_seconds)))
