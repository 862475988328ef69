"""Measure a baseline and a candidate model file in one process, block by block alternately.

Both are opened with the same engine, level, threads and feeds (the candidate's synthesized feeds; a
baseline that takes other inputs cannot be paired and says so), warmed up, and then timed in blocks in
the order A B B A A B … (`paired.pair_order`) until the paired decision (service/domain/paired.py)
is made or the job's budget of pairs or machine seconds is spent (`paired.AdaptiveStop`), and timed
once more in fresh sessions when that ends inconclusive (`with_second_try`). Each block is a few runs,
its level the fastest; the per-run wall time is what is paired (the same clock for both sides).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median_high

from optimizer import DEFAULT_LIMITS, LoadLimits, ModelLoadError, check_model_file
from service.adapters.baseline_process import BaselineProcess
from service.adapters.engines import EngineError, engine_named
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import FeedError, describe_feeds, make_feeds
from service.domain import paired
from service.domain.protocol import Protocol

log = logging.getLogger("fusionwatch.worker")


class CannotPair(RuntimeError):
    """The two files cannot be timed on the same feeds (their inputs differ)."""


@dataclass
class PairedTiming:
    baseline_ms: list[float] = field(default_factory=list)  # each block's fastest run, in pair order
    candidate_ms: list[float] = field(default_factory=list)
    block_runs: int = 1
    machine_s: float = 0.0  # wall time of the timed blocks, warm-up and session creation left out
    stopped: str = ""  # why measuring stopped
    verdict: paired.PairedVerdict | None = None
    # A regression's why: each side's slowest kernels ({"op", "ms"}), profiled alternately after the verdict.
    kernels: dict[str, list[dict]] | None = None

    def to_dict(self, baseline_commit: str | None = None) -> dict:
        assert self.verdict is not None
        return {
            "baseline_commit": baseline_commit,
            "baseline_ms": [round(v, 6) for v in self.baseline_ms],
            "candidate_ms": [round(v, 6) for v in self.candidate_ms],
            "block_runs": self.block_runs,
            "machine_s": round(self.machine_s, 3),
            "stopped": self.stopped,
            "source": "measured",
            **({"kernels": self.kernels} if self.kernels else {}),
            **self.verdict.to_dict(),
        }


def measure_paired(
    baseline_path: str | Path,
    candidate_path: str | Path,
    engine: str,
    level: str,
    protocol: Protocol,
    limits: LoadLimits = DEFAULT_LIMITS,
    custom_ops: CustomOps = NO_CUSTOM_OPS,
    policy: paired.PairedPolicy | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTiming:
    """Raises CannotPair, or EngineError when either file cannot be opened or run."""
    policy = policy or policy_for(protocol)
    runner = engine_named(engine)
    feeds = _feeds(Path(candidate_path), Path(baseline_path), engine, level, protocol, limits)

    timing = with_second_try(lambda: _sessions_alternately(
        runner, ((baseline_path, ()), (candidate_path, ())), level, feeds, protocol, policy, custom_ops, clock))
    if timing.verdict is not None and timing.verdict.word == paired.REGRESSED:
        def profiled(path: str | Path) -> list[dict]:
            return runner.run(Path(path), level, feeds, runs=PROFILED_RUNS, warmup=max(1, protocol.warmup),
                              threads=protocol.threads, custom_ops=custom_ops).top_kernels

        try:
            timing.kernels = kernels_side_by_side(profiled, baseline_path, candidate_path)
        except EngineError as error:  # the verdict stands without its why; the log says what failed
            log.warning("no side-by-side profile", extra={"reason": str(error)[:300]})
    return timing


PROFILED_RUNS = 10  # a profiled session's timed runs, in each of the three rounds a side


def kernels_side_by_side(profiled: Callable[[str | Path], list[dict]], baseline_path: str | Path,
                         candidate_path: str | Path, rounds: int = 3) -> dict[str, list[dict]]:
    """Each side's per-op kernel times ({"op", "ms"}, the median over `rounds` profiled sessions), the
    sides profiled alternately in pair order. The profiler's own cost swamps small kernels' times and
    can hide the change in the whole run, so the verdict stays the unprofiled pairs'; this says which
    kernels moved, measured as the pairs were, at the same moments, which the two jobs' profiles cannot."""
    times: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    paths = {"A": baseline_path, "B": candidate_path}
    for round_ in range(rounds):
        for side in paired.pair_order(round_):
            for kernel in profiled(paths[side]):
                times[side].setdefault(str(kernel["op"]), []).append(float(kernel["ms"]))

    def medians(side: str) -> list[dict]:
        # An op in fewer than half the rounds' top lists is left out: its median would be of a few rounds.
        rows = [{"op": op, "ms": round(median_high(ms), 6)} for op, ms in times[side].items() if 2 * len(ms) >= rounds]
        return sorted(rows, key=lambda row: -row["ms"])

    return {"baseline": medians("A"), "candidate": medians("B")}


WORTH_MAX_SECONDS = 10.0  # a lost fusion's worth is measured while its alert is raised: a bounded wait


def measure_rule_worth(
    path: str | Path, engine: str, level: str, rule: str, protocol: Protocol,
    limits: LoadLimits = DEFAULT_LIMITS, custom_ops: CustomOps = NO_CUSTOM_OPS,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTiming:
    """One model file timed with `rule` (side A, as the level runs it) and without it (side B),
    alternately, as a paired timing is: B / A is what losing the rule's fusion costs. Raises
    EngineError when the file cannot be opened or run."""
    feeds = _model_feeds(Path(path), engine, level, protocol, limits)
    policy = replace(policy_for(protocol), max_seconds=WORTH_MAX_SECONDS)
    return with_second_try(lambda: _sessions_alternately(
        engine_named(engine), ((path, ()), (path, (rule,))), level, feeds, protocol, policy, custom_ops, clock))


def _sessions_alternately(
    runner, sides: tuple[tuple[str | Path, tuple[str, ...]], ...], level: str, feeds: dict, protocol: Protocol,
    policy: paired.PairedPolicy, custom_ops: CustomOps, clock: Callable[[], float],
) -> PairedTiming:
    """Two fresh sessions, (file, rules disabled) for side A then side B, timed alternately."""
    timers = [runner.open_timer(Path(path), level, feeds, threads=protocol.threads, disabled=disabled,
                                custom_ops=custom_ops) for path, disabled in sides]
    baseline, candidate = (_fastest_of(timer) for timer in timers)
    return alternate(baseline, candidate, max(1, protocol.warmup), policy, clock)


def with_second_try(measure: Callable[[], PairedTiming]) -> PairedTiming:
    """`measure()`, and once more in fresh sessions when it ends inconclusive (a job's budget spent in a
    noisy stretch, or a regression that did not hold on its check); the second try's pairs decide, the
    machine seconds are both tries'. An inconclusive job raises nothing, so without it a real step
    met by a noisy stretch would pass unseen; `make bench-detect` replays the same rule."""
    first = measure()
    if first.verdict is not None and first.verdict.decided:
        return first
    second = measure()
    second.machine_s += first.machine_s
    second.stopped = f"{second.stopped} (a second try: the first ended inconclusive, {first.stopped})"
    return second


Block = Callable[[int], float]  # runs a side `k` times and returns its fastest run, in ms


def alternate(
    baseline: Block, candidate: Block, warmup: int, policy: paired.PairedPolicy,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTiming:
    """Warm both sides up, size the blocks on the slower side's settled run, then time pairs of blocks
    in `paired.pair_order` until the decision is made or the budget of pairs or seconds is spent."""
    sides = {"A": baseline, "B": candidate}
    settled = {side: settle(block, warmup, policy, clock) for side, block in sides.items()}
    timing = PairedTiming(block_runs=paired.runs_per_block(max(settled.values()) / 1000, policy))
    started = clock()
    levels: dict[str, list[float]] = {"A": timing.baseline_ms, "B": timing.candidate_ms}
    stop = paired.AdaptiveStop(policy)
    for pair in range(policy.max_pairs):
        for side in paired.pair_order(pair):
            levels[side].append(sides[side](timing.block_runs))
        timing.machine_s = clock() - started
        if (why := stop.after_pair(timing.baseline_ms, timing.candidate_ms, timing.machine_s)) is not None:
            timing.stopped = why
            break
    timing.verdict = stop.verdict
    return timing


def settle(block: Block, warmup: int, policy: paired.PairedPolicy, clock: Callable[[], float] = time.perf_counter) -> float:
    """Run a side `warmup` times, then on until its runs have filled two blocks' time, and return its
    fastest run (ms). A new session's first runs are slow (lazy allocation, cold caches: the first in a
    fresh process takes hundreds of times a settled run, and a few more follow it down). Blocks sized
    on such a run held one run each, and a side still settling was slower for pairs on end: an
    identical model came out "improved" by more than 5%."""
    block(warmup)
    started, runs, fastest = clock(), 1, math.inf
    while True:
        fastest = min(fastest, block(runs))
        if clock() - started >= 2 * policy.block_seconds:
            return fastest
        runs = min(2 * runs, policy.max_block_runs)


def measure_against_environment(
    python: Path, path: Path, engine: str, level: str, protocol: Protocol,
    limits: LoadLimits = DEFAULT_LIMITS, custom_ops: CustomOps = NO_CUSTOM_OPS, policy: paired.PairedPolicy | None = None,
    disabled: tuple[str, ...] = (),
) -> tuple[PairedTiming, str]:
    """The same model file timed in the baseline's Python environment (side A, another engine version)
    and in this one (side B, with the `disabled` rules off), alternately; returns the timing and the
    baseline's engine version."""
    feeds = _model_feeds(path, engine, level, protocol, limits)
    versions: list[str] = []

    def once() -> PairedTiming:
        timer = engine_named(engine).open_timer(path, level, feeds, threads=protocol.threads, disabled=disabled,
                                                custom_ops=custom_ops)
        with BaselineProcess(python, engine, path, level, protocol.threads, feeds) as other, one_core(other.pid):
            versions.append(other.version)
            return alternate(other.block, _fastest_of(timer), max(1, protocol.warmup), policy or policy_for(protocol))

    return with_second_try(once), versions[-1]


@contextmanager
def one_core(other_pid: int) -> Iterator[None]:
    """This thread and the baseline process on one core while they alternate. Left to the scheduler,
    the two processes sit on different cores of a shared machine, each with its own neighbours: on a
    2-core EPYC next to one busy process, an identical model came out tens of percent slower on one side
    for a whole job. One core makes both sides meet the same neighbours, as the in-process pairing does."""
    allowed = os.sched_getaffinity(0)
    core = {min(allowed)}
    os.sched_setaffinity(0, core)
    try:
        os.sched_setaffinity(other_pid, core)
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def _fastest_of(timer: Callable[[], float]) -> Block:
    return lambda runs: min(timer() for _ in range(runs))


def policy_for(protocol: Protocol) -> paired.PairedPolicy:
    return paired.PairedPolicy(min_effect_pct=protocol.timing_threshold_pct, max_seconds=protocol.paired_max_seconds)


def _model_feeds(path: Path, engine: str, level: str, protocol: Protocol, limits: LoadLimits) -> dict:
    try:
        return dict(make_feeds(check_model_file(path, limits), protocol.sequence_length))
    except (FeedError, ModelLoadError) as error:
        raise EngineError(engine, level, path, f"cannot make inputs: {error}") from error


def _feeds(candidate: Path, baseline: Path, engine: str, level: str, protocol: Protocol, limits: LoadLimits) -> dict:
    try:
        feeds = make_feeds(check_model_file(candidate, limits), protocol.sequence_length)
        other = make_feeds(check_model_file(baseline, limits), protocol.sequence_length)
    except FeedError as error:
        raise CannotPair(f"cannot make inputs: {error}") from error
    except ModelLoadError as error:
        raise EngineError(engine, level, candidate, str(error)) from error
    if describe_feeds(feeds) != describe_feeds(other):
        raise CannotPair(f"the baseline takes other inputs ({describe_feeds(other)}) than the candidate "
                         f"({describe_feeds(feeds)}), so they cannot be timed on the same feeds")
    return dict(feeds)
