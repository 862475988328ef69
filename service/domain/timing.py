"""The timing decision: did a result's SequentialExecutor time regress against its baseline window?

Per-commit performance alerts are abandoned when they cry wolf, so a regression needs all of:

- a rank test: the result's samples are larger than the window's (one-sided Mann-Whitney U,
  p < `alpha`). Samples inside one job are correlated, so on its own this test fires on every
  slow moment of the machine; it guards the effect below against a few wild samples.
- a minimum effect: the job's level rose by at least max(`threshold_pct`, `noise_k` × the series'
  own noise, `tail_k` × its slow tail), the noise being the job-to-job wobble of this series on this
  machine, which is what a new job's level has to beat. It is estimated from the successive
  differences of the levels of all the measured ancestors the window is drawn from (five windows'
  worth), not from the window alone: a window is short after a confirmed step or early in a series,
  and the spread of a few jobs underestimates the real one, while a step moves one difference.
  The differences are summarized by their mean absolute value, the largest `noise_trim` (10%) left out
  (`stats.successive_mean_spread`): a median varies more from one stretch of history to the next, and
  on series whose jobs wobble by 5% it swings the bar from too low (false alarms) to too high
  (misses). A noise estimated from few jobs is uncertain, so the `noise_k` and `suspect_k` noises are
  read as Student's t at the history's jobs − 1 degrees of freedom (`student`: 2.5 becomes 5.3 with
  4 jobs, 3.1 with 10, 2.6 with 40); a series' first commits are where a low estimate would alert.
  The slow tail is the `tail_percentile` (95th) of those jobs' excess over their neighbours' median
  (`stats.excess_over_neighbours`: a step in the history moves only the few medians that straddle
  it), from `min_tail_jobs` (20) jobs on. A spread treats both sides alike, but a shared machine's
  wobble is lopsided: a series whose jobs land up to 19% slow with a spread of 2.5% sees two slow
  jobs in a row cross 2.5 spreads often; the tail bar puts such a series' bar near 8% while series
  with a light slow side keep theirs.

- a screen and a bar. A single job is suspected when its level rose past the bar with `suspect_k` (2)
  noises instead of `noise_k` (2.4): a suspicion is not delivered, it only buys a re-measurement. The
  bar proper is faced by the jobs measured after the suspected one, pooled: their mean level against
  `noise_k` × the noise / √jobs and `tail_k` × the slow tail of as many jobs in a row (a mean of two
  hides a lone slow job but not two in a row). The suspected job itself stays out of the pool: it was
  picked for crossing the screen. The screen pools too (`timing_alerts.screen`): a job under it alone is
  suspected when its mean with the previous commit's job crosses the bar for two, against the window
  before both. This is for series noisier than the step: on a series that wobbles by 5–7% job to job
  one job has to rise 12–17% to cross 2.5 noises, so a 10% step would be caught only when two single
  jobs happened to; two jobs' mean has 1/√2 of one job's noise, and the lower screen costs
  re-measurements, which `bench.detect_replay` counts. It pools up to `screen_jobs` (3) commits: the
  mean of three commits' jobs is what still shows a 10% step on those series.
  A re-measurement that stays under the bar but lands nearer the alerted job's level than the
  window's asks for one more (`timing_alerts.measure_again`, at most `remeasures` (2) in all): the
  two are pooled against the bar of two, within the same CI round, instead of a step's single
  re-measurement facing the bar of one job. The constants are chosen on the replay of several seeds
  of both noise measurements (docs/detection.md), with seeds held out, not on one seed.

- too few: with fewer than `min_noise_jobs` measured ancestors the series' noise is not known, so no
  verdict is given (a second commit's job 10% off the first says nothing on a series that wobbles by 5%).

- too common to tell: the jobs that would confirm a suspicion (the suspected one, its re-measurements,
  the next commit's) are each at least so much slower than the window, and the series' own history,
  or its machine's (the latest `machine_jobs` jobs of every series on its machine class), has had
  jobs that slow often enough that so many of them would come without any change more often than
  `null_budget` (1 in 1,000: issue 29's false-alarm target; `null_chance`). A shared machine's slow
  moments can be a mode of their own, a share of jobs far slower than the rest, which a spread or a
  95th percentile does not bound; counting them does (the series' own from 20 measured ancestors on,
  as the slow tail; the machine's from a series' first commits, and ten times as many jobs see the
  rarer, larger slow moments). The alert then asks for another re-measurement while it may, and stays
  suspected ("inconclusive") when it may not: the unpaired path cannot tell such a step from the
  machine, the paired path (service/domain/paired.py) can.

- when the optimized graph's hash and the engine version are both unchanged, nothing in the code
  moved: the bar is `same_code_factor` times higher, and persistence (the confirmation in
  `timing_alerts.py`) still has to follow.

A job's level is its fastest run (`quantile` 0). Contention on a shared machine only adds time, and
a job of the protocol's 100 runs almost always has a few runs no other process got in the way of
(`python -m bench.detect_measure` on a shared 2-core Xeon at load average 5–8: 0–6% of jobs had their
10th percentile 10% slow or worse, 0–1% their fastest run). Fewer slow jobs is what lets the bar sit
at 2.4 noises rather than 3 (`make bench-detect` measures what that costs in false alarms).

The canary (`service/adapters/canary.py`) marks a job that ran in a slow moment: its canary more than
`canary_slack_pct` slower than the window's median canary. Such window jobs are left out of the level
and the noise, and such a current job must beat the bar by `canary_weight` (half) of its canary's
excess as well: a slow moment may explain part of its change, not more. The canary explains little
of a model's job-to-job wobble (correlation 0.0–0.55 with the jobs' levels on the shared Xeon;
slow-canary jobs' levels only 1–2% higher on average), so it discounts, it does not rescale (dividing
every job by its canary ratio adds noise), and a suspicion is raised whatever the canary said: 8–17%
of jobs have a canary over the slack, and ignoring them would drop steps whose commit ran in such a
moment. A confirmation, though, rests on calm jobs only (`timing_alerts.confirmation`; a re-measurement
in a slow moment asks for another): where slow moments are common (epyc1's capture: a sixth of all
jobs 30–100% slow, two thirds of those with a slow canary), two slow jobs in a row were most of the
false alarms left.

The decision is pure (lists of numbers in, a verdict out) so `make bench-detect` and the tests can
drive it without a database; `timing_alerts.py` gathers the window and keeps the alert states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.domain.stats import excess_over_neighbours, mann_whitney_greater, successive_mean_spread


@dataclass(frozen=True)
class Job:
    """One result's timings as the decision sees them."""

    samples: Sequence[float]
    canary_ms: float | None = None


@dataclass(frozen=True)
class TimingPolicy:
    window: int = 20  # measured ancestors in the baseline window
    alpha: float = 0.01  # the rank test's level
    noise_k: float = 2.4  # the effect must beat this many times the window's job-to-job noise (÷ √jobs pooled)
    suspect_k: float = 2.0  # a single job is suspected past this many noises: the screen that buys a re-measurement
    screen_jobs: int = 3  # the screen also pools the job with those of this many commits in all (timing_alerts.screen)
    remeasures: int = 2  # at most this many re-measurements of a suspected commit (timing_alerts.measure_again)
    same_code_factor: float = 2.0  # unchanged graph hash and engine version: the bar is this much higher
    same_code_jobs: int = 2  # "unchanged" means equal to the code of this many nearest window jobs
    noise_trim: float = 10.0  # the noise leaves out this percentage of the largest successive differences
    min_noise_jobs: int = 4  # fewer measured ancestors: no verdict (see "too few" above); fewer in the window: the bar doubles
    canary_slack_pct: float = 5.0  # a canary this much slower than the window's marks a slow moment
    canary_weight: float = 0.5  # such a job's bar rises by this fraction of its canary's excess (see above)
    agree_k: float = 3.0  # a confirmation's change must be within this many noises (or half the bar) of the first's
    rank_part: float = 50.0  # the rank test compares each job's fastest this-many percent of samples
    quantile: float = 0.0  # each job's level: this percentile of its samples, 0 its fastest run (see above)
    tail_percentile: float = 95.0  # the history's slow tail: this percentile of its jobs' excess over their neighbours
    tail_k: float = 1.3  # the effect must beat this many times that tail (see above)
    tail_neighbours: int = 5  # a job's excess is over the median of it and this many jobs either side
    min_tail_jobs: int = 20  # fewer measured ancestors: the tail is not estimated, the noise alone sets the bar
    null_budget: float = 0.001  # a confirmation this likely from the series' own history alone is inconclusive (see above)
    machine_jobs: int = 1000  # the null chance also reads this many of the machine class's latest jobs (see above)


DEFAULT_POLICY = TimingPolicy()


@dataclass(frozen=True)
class TimingVerdict:
    regressed: bool
    before_ms: float  # the window's level: the median of its jobs' levels
    after_ms: float  # this job's level
    change_pct: float
    p_value: float
    min_effect_pct: float  # the bar the change had to reach
    noise_pct: float  # the window's job-to-job noise, percent of its level
    canary_slow_pct: float  # this job's canary was this much slower than the window's (0: within the slack)
    code_changed: bool
    why: str


def decide(
    current: Job | Sequence[Job],
    window: Sequence[Job],
    threshold_pct: float,
    code_changed: bool = True,
    policy: TimingPolicy = DEFAULT_POLICY,
    history: Sequence[Job] | None = None,
    screening: bool = False,
) -> TimingVerdict | None:
    """None when there is nothing to compare (no samples on either side, or too few measured ancestors
    to know the series' noise). `current` is one job or
    several at the level under test (see "pooled" above); `screening` bars a single job for suspicion
    with `suspect_k` instead of `noise_k`."""
    jobs = [job for job in ([current] if isinstance(current, Job) else current) if len(job.samples)]
    window = [job for job in window if len(job.samples)]
    if not jobs or not window:
        return None
    reference = canary_reference(window)

    def slowness(job: Job) -> float:
        return canary_slowness(job, reference, policy)

    calm = [job for job in window if not slowness(job)]
    if len(calm) >= 2:
        window = calm  # jobs timed in a slow moment say little about the series' level or noise
    pooled = len(jobs)
    discount = float(np.mean([slowness(job) for job in jobs]))
    now = [np.asarray(job.samples, dtype=np.float64) for job in jobs]
    then = [np.asarray(job.samples, dtype=np.float64) for job in window]
    levels = np.array([_level(s, policy.quantile) for s in then])
    level = float(np.median(levels))
    if level <= 0:
        return None
    after = float(np.mean([_level(s, policy.quantile) for s in now]))
    change = (after - level) / level * 100
    history_levels = _levels([job for job in (history if history is not None else window) if not slowness(job)], policy)
    if len(history_levels) < policy.min_noise_jobs:
        return None  # the series' noise is not known yet (see "too few" above)
    noise = successive_mean_spread(history_levels, policy.noise_trim / 100) / level * 100
    tail = _slow_tail(history_levels, policy, pooled)
    noise_k = student(policy.suspect_k if screening and pooled == 1 else policy.noise_k, len(history_levels) - 1)
    bar = max(threshold_pct, noise_k * noise / math.sqrt(pooled), policy.tail_k * tail)
    if len(window) < policy.min_noise_jobs:
        bar *= 2
    if not code_changed:
        bar *= policy.same_code_factor
    p_value = mann_whitney_greater(np.concatenate([_fast_part(s, policy.rank_part) for s in now]),
                                   np.concatenate([_fast_part(s, policy.rank_part) for s in then]))
    bar += policy.canary_weight * discount  # a slow moment may explain part of the change (see above)
    regressed = change >= bar and p_value < policy.alpha
    discounted = (f"; the bar includes {policy.canary_weight * discount:.1f}% because {'these jobs' if pooled > 1 else 'this job'}'s "
                  f"canary ran {discount:.1f}% slow" if discount else "")
    same = "graph and engine unchanged, so the bar is higher; " if not code_changed else ""
    what = f"mean fastest run of {pooled} jobs" if pooled > 1 else "fastest run"
    why = (
        f"{what} {level:.3f} → {after:.3f} ms ({change:+.1f}%) against {len(window)} measured ancestor(s); "
        f"{same}needs ≥ {bar:.1f}% (threshold {threshold_pct:g}%, series noise {noise:.1f}%"
        f"{f', slow tail {tail:.1f}%' if tail else ''}) "
        f"and rank-test p < {policy.alpha:g} (p = {p_value:.2g}){discounted}"
    )
    return TimingVerdict(regressed, level, after, change, p_value, bar, noise, discount, code_changed, why)


def null_chance(history: Sequence[Job], changes_pct: Sequence[float], policy: TimingPolicy = DEFAULT_POLICY,
                replaced: Sequence[float] = (), machine: Sequence[Sequence[float]] = ()) -> float:
    """How likely the series, with nothing changed, is to give as many jobs as `changes_pct` each at least
    the smallest of those changes slow: per job (k + ½) / (n + 1), k of n jobs whose excess over their
    neighbours (`stats.excess_over_neighbours`) reached it, and the jobs taken as independent draws.
    Every job counts, slow canary or not: the question is how often this machine made a series that slow.
    Judged twice, and the larger chance holds:
    - by the series' own history, from `min_tail_jobs` measured jobs on (before, a handful of jobs cannot
      say how common slow ones are). `replaced`: the changes of jobs the history no longer holds,
      suspected jobs whose commit's re-measurement took their place (the slow jobs, so the history
      alone would undercount exactly them);
    - by its machine's (`machine`: the levels of each series measured on this machine class, nearest
      first, pooled by `machine_excess`). A shared machine's slow moments are the machine's: a young
      series has no count of its own, and a series' hundred jobs have not seen the rare slow moment
      twice as long as any before, which the machine's thousand may have.
    0 (never too common) when neither has the jobs."""
    least = min(changes_pct)
    levels = _levels(history, policy)
    own = _chance(_away_from_now(levels, policy), least, len(changes_pct), replaced) \
        if len(levels) >= policy.min_tail_jobs else 0.0
    pooled = machine_excess(machine, policy)
    shared = _chance(pooled, least, len(changes_pct)) if len(pooled) >= policy.min_tail_jobs else 0.0
    return max(own, shared)


def _chance(excess: np.ndarray, least_pct: float, jobs: int, replaced: Sequence[float] = ()) -> float:
    slow = int(np.sum(excess * 100 >= least_pct)) + sum(change >= least_pct for change in replaced)
    return ((slow + 0.5) / (len(excess) + len(replaced) + 1)) ** jobs


def machine_excess(machine: Sequence[Sequence[float]], policy: TimingPolicy = DEFAULT_POLICY) -> np.ndarray:
    """The excess over their neighbours of every series' jobs on one machine class, pooled: a shared
    machine's slow moments are the machine's, so where one series is too young to say how often it ran
    slow, the others that ran there say it. Each series' nearest jobs are left out as in its own count,
    so that a change that slowed every series at once (an engine's commit) is not read as the machine."""
    pooled = [_away_from_now(np.asarray(levels, dtype=np.float64), policy) for levels in machine]
    return np.concatenate(pooled) if pooled else np.empty(0)


def _away_from_now(levels: np.ndarray, policy: TimingPolicy) -> np.ndarray:
    """The excess over their neighbours of a series' levels (nearest first) but its `tail_neighbours`
    nearest: their neighbourhoods are mirrored, and a step that began a commit or two before the
    alerted one would read as their slowness."""
    return excess_over_neighbours(levels, policy.tail_neighbours)[policy.tail_neighbours:]


def changes(jobs: Sequence[Job], before_ms: float, policy: TimingPolicy = DEFAULT_POLICY) -> list[float]:
    """Each job's level against `before_ms`, in percent."""
    return [(level / before_ms - 1) * 100 for level in _levels(jobs, policy)] if before_ms > 0 else []


def too_common(history: Sequence[Job], changes_pct: Sequence[float], policy: TimingPolicy = DEFAULT_POLICY,
               replaced: Sequence[float] = (), machine: Sequence[Sequence[float]] = ()) -> bool:
    """Would the series' history or its machine's alone give these jobs more often than
    `policy.null_budget`?"""
    return null_chance(history, changes_pct, policy, replaced, machine) > policy.null_budget


def student(k: float, df: int) -> float:
    """`k` normal standard deviations as as many of Student's t at `df` degrees of freedom: the same
    one-sided level, for a noise estimated from `df` + 1 jobs rather than known (Cornish-Fisher's
    expansion, Abramowitz & Stegun 26.7.5: 5.25 for the exact 5.40 at 3 degrees of freedom, within 0.5% from 5).
    With 4 jobs 2.5 noises become 5.3, with 10 3.1, with 40 2.6: early in a series, or after too few
    jobs, a noise that came out small by chance does not let a lone slow job through."""
    if df <= 0:
        return math.inf
    z = k
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def canary_reference(window: Sequence[Job]) -> float | None:
    """The window's median canary, ms; None when no job of it timed one."""
    canaries = [job.canary_ms for job in window if job.canary_ms]
    return float(np.median(canaries)) if canaries else None


def canary_slowness(job: Job, reference: float | None, policy: TimingPolicy = DEFAULT_POLICY) -> float:
    """How much slower than `reference` this job's canary ran, in percent; 0 within `canary_slack_pct`
    (not a slow moment) or when either is unknown."""
    if reference is None or not job.canary_ms:
        return 0.0
    excess = (job.canary_ms / reference - 1) * 100
    return excess if excess > policy.canary_slack_pct else 0.0


def in_slow_moment(job: Job, window: Sequence[Job], policy: TimingPolicy = DEFAULT_POLICY) -> bool:
    """Did `job`'s canary run more than `canary_slack_pct` slower than the window's median canary?"""
    return canary_slowness(job, canary_reference(window), policy) > 0


def agree(first: TimingVerdict, second: TimingVerdict, policy: TimingPolicy = DEFAULT_POLICY) -> bool:
    """Does `second` confirm `first`? Both crossed the bar, and by about the same amount: a real step
    moves every later job by one factor, while slow moments of a shared machine come in all sizes
    (measured here: 1.2× to 7×), so two of them rarely match."""
    if not (first.regressed and second.regressed):
        return False
    spread = max(policy.agree_k * max(first.noise_pct, second.noise_pct), first.min_effect_pct / 2)
    return abs(math.log1p(second.change_pct / 100) - math.log1p(first.change_pct / 100)) * 100 <= spread


def slow_moment_before(again: TimingVerdict, later: TimingVerdict) -> bool:
    """Was an alerted job a slow moment just before a step at the next commit, rather than that step's
    first job? `again` is the alerted commit's re-measurement, `later` the next commit's job that would
    confirm the alert. The alerted job itself says little (it crossed the bar either way); its
    re-measurement does: after a step it sits at the new level, after a slow moment at the old one. So
    when it stayed under the bar and nearer the old level than the next commit's change, the step is
    the next commit's, which raises its own alert instead of confirming this one (confirming it was one
    false alarm and, for the step, an alert at the wrong commit). A step whose re-measurement came out
    under the bar but past half the step is still confirmed at its own commit."""
    return not again.regressed and not at_the_new_level(again, later)


def at_the_new_level(again: TimingVerdict, later: TimingVerdict) -> bool:
    """Does a re-measurement sit nearer the level `later` confirmed than the window's?"""
    return again.change_pct >= later.change_pct / 2


def _fast_part(samples: np.ndarray, percent: float) -> np.ndarray:
    """The fastest `percent` of a job's samples: on a shared machine the rest wait on other processes."""
    keep = max(1, int(round(len(samples) * percent / 100)))
    return np.sort(samples)[:keep]


def level(samples: Sequence[float], policy: TimingPolicy = DEFAULT_POLICY) -> float:
    """A job's level from its timed samples (`TimingPolicy.quantile`)."""
    return _level(np.asarray(samples, dtype=np.float64), policy.quantile)


def _levels(jobs: Sequence[Job], policy: TimingPolicy) -> np.ndarray:
    """The jobs' levels in their order (nearest first)."""
    return np.array([_level(np.asarray(job.samples, dtype=np.float64), policy.quantile) for job in jobs if len(job.samples)])


def _slow_tail(levels: np.ndarray, policy: TimingPolicy, pooled: int = 1) -> float:
    """How far above its neighbours a slow job of this series lands, in percent: `tail_percentile` of the
    jobs' excess over their neighbourhood's median; 0 with too few jobs to tell. For the mean of `pooled`
    jobs, the same percentile of the mean excess of every `pooled` jobs in a row: measured, so slow jobs
    that come in runs keep the bar of a pooled mean up, and lone ones let it fall."""
    if len(levels) < policy.min_tail_jobs:
        return 0.0
    excess = excess_over_neighbours(levels, policy.tail_neighbours)
    if pooled > 1:
        excess = np.convolve(excess, np.full(pooled, 1 / pooled), mode="valid")
    return float(np.percentile(excess, policy.tail_percentile)) * 100


def _level(samples: np.ndarray, quantile: float) -> float:
    """A job's level (`TimingPolicy.quantile`): np.percentile's linear interpolation between the two order
    statistics around it, found by a partial sort (a decision reads a hundred jobs' levels)."""
    if quantile == 0:
        return float(samples.min())
    position = quantile / 100 * (len(samples) - 1)
    low = int(position)
    high = min(low + 1, len(samples) - 1)
    ordered = np.partition(samples, (low, high))
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
