"""`python -m bench.detect_paired --data FILE`: the paired path's false alarms and recall on planted
steps, replayed from null pairs captured on a machine (`bench/paired_capture.py`).

On the paired path each commit's job times the baseline (the previous commit's model file) and the
candidate (this commit's) in one process, so a planted step shows in exactly one job: the step
commit's. Every other commit compares a file with its unchanged twin: a null pair, which is what the
capture recorded. A simulated series of commits therefore draws, at each commit, one recorded null
job (at random, its pairs read from a random even offset onwards, wrapping round, so the A B / B A
order is kept); at the step commit it multiplies the candidate side's block levels (and block times)
by 1 + step. The decision is then made as `service.adapters.paired_measure.measure_paired` makes
it: after each pair, `paired.decide_paired` on the pairs so far with the protocol's policy, stopping
when decided, when the policy's machine seconds are spent, or when the pairs run out (the policy's
60; epyc1's capture recorded 32 a job, so its replayed jobs stop there): a job still inconclusive
then stays so, quiet. A job that ends inconclusive is measured once more (another draw, the same
commit).

Counted: "regressed" on a commit without a step is a false alarm (per 1,000 series-commits); a step
is caught when the step commit's job or its re-measurement says "regressed" ("within 2 commits" can
only mean that commit here: the later commits' jobs compare post-step files with each other). Also
the median pairs and machine seconds (the timed blocks, as `PairedTiming.machine_s`; opening and
warming the two sessions, `open_s` in the capture, is extra) a decided job took.

The draws are deterministic per (job, offset, factor), so their outcomes are cached: the replay is
the share of a capture's null sequences each verdict takes, weighted as the series draw them.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.detect import STEPS
from service.adapters.paired_measure import policy_for
from service.domain import paired
from service.domain.protocol import Protocol

BIG_STEP = 0.10


@dataclass(frozen=True)
class Decision:
    word: str
    pairs: int
    seconds: float


def decide_sequentially(baseline: np.ndarray, candidate: np.ndarray, block_s: np.ndarray,
                        policy: paired.PairedPolicy) -> Decision:
    """measure_paired's loop on recorded blocks (`paired.AdaptiveStop` after each pair), or as far as
    the pairs go. block_s: [pairs] seconds of both blocks."""
    spent = np.cumsum(block_s)
    stop = paired.AdaptiveStop(policy)
    last = min(len(baseline), policy.max_pairs)
    for n in range(1, last + 1):
        # The recorded pairs running out ends the job as its budget would.
        machine_s = math.inf if n == last else float(spent[n - 1])
        if stop.after_pair(baseline[:n], candidate[:n], machine_s) is not None:
            break
    return Decision(stop.verdict.word, n, float(spent[n - 1]))


class Capture:
    """A paired capture's null jobs, and the (cached) decision on any draw of them."""

    def __init__(self, levels_ms: np.ndarray, block_s: np.ndarray, policy: paired.PairedPolicy):
        self.levels, self.block_s, self.policy = levels_ms.astype(np.float64), block_s.astype(np.float64), policy
        self._cache: dict[tuple, Decision] = {}

    @property
    def series(self) -> int:
        return self.levels.shape[0]

    def job(self, source: int, rng: np.random.Generator, factor: float) -> Decision:
        jobs, pairs = self.levels.shape[1:3]
        key = (source, int(rng.integers(jobs)), 2 * int(rng.integers(pairs // 2)), factor)
        if key not in self._cache:
            _, j, offset, _ = key
            order = np.roll(np.arange(pairs), -offset)
            levels, seconds = self.levels[source, j, order], self.block_s[source, j, order]
            self._cache[key] = decide_sequentially(levels[:, 0], levels[:, 1] * factor,
                                                   seconds[:, 0] + seconds[:, 1] * factor, self.policy)
        return self._cache[key]


def replay(levels_ms: np.ndarray, block_s: np.ndarray, series: int, commits: int, seed: int,
           policy: paired.PairedPolicy | None = None) -> dict:
    """Counts of `series` simulated series × `commits` commits drawn from one capture."""
    policy = policy or policy_for(Protocol())
    capture = Capture(levels_ms, block_s, policy)
    rng = np.random.default_rng(seed)
    words: dict[str, int] = defaultdict(int)  # null jobs' verdicts, re-measurements included
    by_step = defaultdict(lambda: {"n": 0, "caught": 0})
    false_alarms, remeasured, decided = 0, 0, []
    false_by_source: dict[int, int] = defaultdict(int)
    for g in range(series):
        source = g % capture.series
        step = STEPS[(g // capture.series) % len(STEPS)]  # every (source, step) equally often, as bench.detect
        step_at = int(rng.integers(1, commits))
        regressed = False
        for c in range(commits):
            factor = 1 + step if c == step_at else 1.0
            for attempt in range(2):  # an inconclusive job is measured once more
                job = capture.job(source, rng, factor)
                remeasured += attempt
                if job.word != paired.INCONCLUSIVE:
                    decided.append((job.pairs, job.seconds))
                if c != step_at:
                    words[job.word] += 1
                    false_alarms += job.word == paired.REGRESSED
                    false_by_source[source] += job.word == paired.REGRESSED
                elif job.word == paired.REGRESSED:
                    regressed = True
                if job.word != paired.INCONCLUSIVE:
                    break
        by_step[step]["n"] += 1
        by_step[step]["caught"] += regressed
    return {"series": series, "commits": commits, "series_commits": series * commits, "false_alarms": false_alarms,
            "false_by_source": dict(false_by_source), "by_step": {s: dict(r) for s, r in sorted(by_step.items())}, "null_words": dict(words),
            "remeasured": remeasured, "decided": decided}


def summarize(counts: dict) -> dict:
    """The figures the table prints from one replay's (or several pooled replays') counts."""
    big = [r for s, r in counts["by_step"].items() if s >= BIG_STEP]
    hits, n = sum(r["caught"] for r in big), sum(r["n"] for r in big)
    decided = np.asarray(counts["decided"]) if counts["decided"] else np.zeros((0, 2))
    nulls = sum(counts["null_words"].values())
    return {
        "false_per_1000": counts["false_alarms"] / counts["series_commits"] * 1000, "false_alarms": counts["false_alarms"],
        "series_commits": counts["series_commits"], "big_caught": hits, "big_steps": n,
        "recall_big": hits / n if n else None,
        "null_inconclusive": counts["null_words"].get(paired.INCONCLUSIVE, 0) / nulls if nulls else None,
        "median_pairs": float(np.median(decided[:, 0])) if len(decided) else None,
        "median_seconds": float(np.median(decided[:, 1])) if len(decided) else None,
        "by_step": {f"{round(s * 100)}%": f"{r['caught']}/{r['n']}" for s, r in counts["by_step"].items()},
        "null_words": counts["null_words"], "remeasured": counts["remeasured"],
        "false_by_source": counts.get("false_by_source"),
    }


def pool(many: list[dict]) -> dict:
    """Several replays' counts as one (sums; the decided jobs concatenated)."""
    by_step: dict[float, dict] = defaultdict(lambda: {"n": 0, "caught": 0})
    words: dict[str, int] = defaultdict(int)
    for counts in many:
        for s, r in counts["by_step"].items():
            by_step[s]["n"] += r["n"]
            by_step[s]["caught"] += r["caught"]
        for w, k in counts["null_words"].items():
            words[w] += k
    return {"series_commits": sum(c["series_commits"] for c in many), "false_alarms": sum(c["false_alarms"] for c in many),
            "by_step": dict(sorted(by_step.items())), "null_words": dict(words),
            "remeasured": sum(c["remeasured"] for c in many), "decided": [d for c in many for d in c["decided"]]}


def load(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    data = np.load(path)
    return data["levels_ms"], data["block_s"], json.loads(str(data["meta"]))


def main() -> None:
    parser = argparse.ArgumentParser(description="the paired path's false alarms and recall, replayed from a capture")
    parser.add_argument("--data", type=Path, required=True, help="a bench/data/paired_noise_*.npz")
    parser.add_argument("--series", type=int, default=320)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args()
    levels, block_s, meta = load(args.data)
    summary = summarize(replay(levels, block_s, args.series, args.commits, args.seed))
    print(f"{args.data.name}: {meta['cpu']}, {meta['measured_at']}, load {meta['load_1min']}; "
          f"{levels.shape[0]} series × {levels.shape[1]} null jobs × {levels.shape[2]} pairs")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
