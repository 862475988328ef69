"""`python -m bench.detect_replay`: `make bench-detect`'s series without the database, in a minute.

The same random stream draws the same jobs (`bench.detect.Series`) in the same order, re-measurements
included, and each result goes through `service.domain.timing.decide`/`agree` and
`timing_alerts.baseline_window`/`code_changed`; only the walk `timing_alerts.evaluate` makes over the
database (confirm the alert at this commit or the previous one, unless that commit's re-measurement
says it was a slow moment, moving the confirmation one commit earlier when the step began there; else
decide against the window) is repeated here on plain objects. While that walk is unchanged the replay
prints `make bench-detect`'s numbers exactly (checked: seed 10 before and after the canary and noise
changes, seed 11 after, seed 10 again after the slow-tail bar: 14 false alarms, 116 of 120, 565
re-measurements), so it is the way to iterate on the decision and to try other seeds; `make
bench-detect` remains the measurement. `tests/bench/test_detect_replay.py` holds the two to the same
counts on a small bench.
Fusion alerts are not replayed (they are exact: 240 of 240 in every run).

`--explain` prints, for each step of 10% or more missed within two commits and each false alarm, every
result from the commit before to the confirming one: its change against the window the service had
then, the bar, the noise, the canary's excess, and the alerts' states after it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from bench import detect_captures
from bench.detect import MATCH_AFTER, Series, add_series_arguments, plan
from service.domain import timing
from service.usecases import timing_alerts


@dataclass
class Posted:
    """A result as timing_alerts reads it (`as_job`, `code_changed`, `baseline_window`)."""

    commit_id: int
    execute_ms: list[float]
    canary_ms: float
    engine_version: str
    graph_hash: str


@dataclass
class Suspicion:
    commit_id: int
    result: Posted
    change_pct: float  # the suspected job's change (Alert.change_pct)
    confirmed_by: int | None = None

    @property
    def confirmed_at(self) -> int | None:  # baseline_window's test for "confirmed"
        return self.confirmed_by

    @property
    def state(self) -> str:  # timing_alerts.pending's
        return "suspected" if self.confirmed_by is None else "confirmed"


@dataclass
class MachineLog:
    """Every series' jobs on the replay's one machine, in the order they were posted: what
    timing_alerts.machine_levels reads of the results table (the latest `policy.machine_jobs`)."""

    policy: timing.TimingPolicy = timing.DEFAULT_POLICY
    jobs: list[tuple[object, float]] = field(default_factory=list)

    def add(self, series: object, result: Posted) -> None:
        self.jobs.append((series, timing.level(result.execute_ms, self.policy)))

    def levels(self) -> list[np.ndarray]:
        series: dict[object, list[float]] = {}
        for key, level in reversed(self.jobs[max(0, len(self.jobs) - self.policy.machine_jobs):]):
            series.setdefault(key, []).append(level)
        return [np.asarray(levels) for levels in series.values()]


@dataclass
class SeriesReplay:
    threshold_pct: float
    policy: timing.TimingPolicy = timing.DEFAULT_POLICY
    explain: bool = True  # keep the log --explain prints (it decides every result twice)
    machine: MachineLog = field(default_factory=MachineLog)
    latest: dict[int, Posted] = field(default_factory=dict)
    posted: dict[int, list[Posted]] = field(default_factory=lambda: defaultdict(list))  # every result by commit
    alerts: dict[int, Suspicion] = field(default_factory=dict)
    log: list[tuple[int, str]] = field(default_factory=list)

    def ancestry(self, commit: int) -> list[Posted]:
        found = [self.latest[c] for c in sorted(self.latest, reverse=True) if c < commit]
        return found[: self.policy.window * 5]

    def decide(self, result: Posted, ancestry: list[Posted]) -> timing.TimingVerdict | None:
        screened = timing_alerts.screen(result, ancestry, self.alerts, self.threshold_pct, self.policy)
        return None if screened is None else screened.verdict

    def confirm(self, alert: Suspicion, result: Posted) -> bool:
        """timing_alerts._confirm_if_agrees: `result` a re-measurement of the alerted commit or the next
        commit's result."""
        ancestry = self.ancestry(alert.commit_id)
        remeasured = [r for r in self.posted[alert.commit_id] if r is not alert.result]
        here = result.commit_id == alert.commit_id
        remeasured, later = ([*remeasured, result], []) if here else (remeasured, [result])
        verdict = timing_alerts.confirmation(alert.result, ancestry, self.alerts, remeasured, later,
                                             self.threshold_pct, self.policy, self.machine.levels)
        if verdict is None:
            return False
        earlier = self._step_began_before(ancestry, verdict)
        (earlier or alert).confirmed_by = result.commit_id
        return True

    def _step_began_before(self, ancestry: list[Posted], verdict: timing.TimingVerdict) -> Suspicion | None:
        """timing_alerts._step_began_before: the previous commit's suspicion, when its re-measurement sat
        nearer the confirmed level than the old one."""
        if not ancestry:
            return None
        previous = ancestry[0]
        earlier = self.alerts.get(previous.commit_id)
        if earlier is None or earlier.confirmed_by is not None or earlier.result is previous:
            return None
        earlier_ancestry = self.ancestry(earlier.commit_id)
        window = timing_alerts.baseline_window(earlier_ancestry, self.alerts, self.policy.window)
        if not window:
            return None
        again = timing.decide(timing_alerts.as_job(previous), [timing_alerts.as_job(r) for r in window], self.threshold_pct,
                              timing_alerts.code_changed(previous, window, self.policy), self.policy,
                              [timing_alerts.as_job(r) for r in earlier_ancestry])
        return earlier if again is not None and timing.at_the_new_level(again, verdict) else None

    def post(self, result: Posted) -> bool:
        """Record and evaluate `result` as timing_alerts.evaluate does; True when it raised a suspicion."""
        ancestry = self.ancestry(result.commit_id)
        verdict = self.decide(result, ancestry) if ancestry and self.explain else None
        raised = self._evaluate(result, ancestry)
        self.machine.add(id(self), result)
        self.latest[result.commit_id] = result
        self.posted[result.commit_id].append(result)
        if self.explain:
            self.log.append((result.commit_id, _explain(verdict, raised, self.alerts, result.commit_id)))
        return raised

    def _evaluate(self, result: Posted, ancestry: list[Posted]) -> bool:
        if not ancestry:
            return False  # no baseline: detect() is not called
        here = self.alerts.get(result.commit_id)
        if here is not None:
            if here.confirmed_by is None and not self.confirm(here, result):
                remeasured = [*[r for r in self.posted[here.commit_id] if r is not here.result], result]
                return timing_alerts.measure_again(here.result, self.ancestry(here.commit_id), self.alerts, remeasured,
                                                   self.threshold_pct, self.policy, self.machine.levels) is not None
            return False
        pending = timing_alerts.pending(ancestry, self.alerts)
        if pending is not None and self.confirm(pending, result):
            return False
        verdict = self.decide(result, ancestry)
        if verdict is None or not verdict.regressed:
            return False
        self.alerts[result.commit_id] = Suspicion(result.commit_id, result, verdict.change_pct)
        return True


def _explain(verdict, raised: bool, alerts: dict[int, Suspicion], commit: int) -> str:
    if verdict is None:
        return "no window"
    states = " ".join(f"{c}:{'confirmed by ' + str(a.confirmed_by) if a.confirmed_by is not None else 'suspected'}"
                      for c, a in alerts.items() if c >= commit - 3)
    return (f"{verdict.change_pct:+.1f}% vs bar {verdict.min_effect_pct:.1f}% (noise {verdict.noise_pct:.1f}%, "
            f"canary +{verdict.canary_slow_pct:.0f}%, code {'changed' if verdict.code_changed else 'same'}) "
            f"{'crossed' if verdict.regressed else 'no'}{', suspected' if raised else ''} [{states}]")


def replay(args) -> tuple[dict, dict, int]:
    data = np.load(args.data)
    measured, canaries = data["execute_ms"], data["canary_ms"]
    rng = np.random.default_rng(args.seed)
    policy = getattr(args, "policy", None) or timing.DEFAULT_POLICY
    truth, replays, remeasured = {}, {}, 0
    machine = MachineLog(policy)  # one machine for every project, as bench.detect's one app
    for p in range(args.projects):
        kind = "engine" if p % 2 == 0 else "model"
        plans = plan(rng, p * args.series, args.series, args.commits, measured.shape[0])
        graph_changes = rng.random((args.series, args.commits)) < 0.2
        series = {}
        for s, planned in enumerate(plans):
            source = (p * args.series + s) % measured.shape[0]
            name = f"m{s:02d}"
            series[name] = Series(name, kind, **planned, graph_changes=graph_changes[s], measured=measured[source],
                                  canary=canaries[source], rng=rng)
            truth[(f"p{p}", name)] = {**planned, "kind": kind, "source": source}
            replays[(f"p{p}", name)] = SeriesReplay(args.threshold_pct, policy=policy, explain=args.explain,
                                                    machine=machine)
        for c in range(args.commits):
            again = [name for name, x in series.items() if replays[(f"p{p}", name)].post(_posted(x.result(c), c))]
            while again:  # as bench.detect re-measures: every series asking for one, in one round
                remeasured += len(again)
                again = [name for name in sorted(again) if replays[(f"p{p}", name)].post(_posted(series[name].result(c), c))]
    return truth, replays, remeasured


def _posted(result: dict, commit: int) -> Posted:
    return Posted(commit, result["execute_ms"], result["canary_ms"], result["engine_version"], result["graph_hash"])


def tally(truth: dict, replays: dict) -> tuple[dict, int, dict, int, list]:
    """As bench.detect.score counts: by step size the series and the steps confirmed within 2 and 10
    commits; false alarms (in all and by project kind); suspicions never confirmed; and the series and
    commits --explain prints."""
    by_step = defaultdict(lambda: {"n": 0, "within2": 0, "any": 0})
    false_alarms, by_kind, suspected, explained = 0, defaultdict(int), 0, []
    for key, t in truth.items():
        alerts = replays[key].alerts.values()
        suspected += sum(a.confirmed_by is None for a in alerts)
        confirmed = [a for a in alerts if a.confirmed_by is not None]
        matched = [a for a in confirmed if t["step_at"] <= a.commit_id <= t["step_at"] + MATCH_AFTER]
        for a in confirmed:
            if a not in matched:
                false_alarms += 1
                by_kind[t["kind"]] += 1
                explained.append((key, "false alarm", a.commit_id - 1, a.confirmed_by))
        row = by_step[t["step"]]
        row["n"] += 1
        delay = min(a.confirmed_by for a in matched) - t["step_at"] if matched else None
        row["any"] += delay is not None
        row["within2"] += delay is not None and delay <= 2
        if t["step"] >= 0.10 and (delay is None or delay > 2):
            explained.append((key, "missed", t["step_at"] - 1, t["step_at"] + 2))
    return by_step, false_alarms, by_kind, suspected, explained


def report(truth: dict, replays: dict, remeasured: int, args) -> None:
    by_step, false_alarms, by_kind, suspected, explained = tally(truth, replays)
    series_commits = len(truth) * args.commits
    big = [r for s, r in by_step.items() if s >= 0.10]
    hits, n = sum(r["within2"] for r in big), sum(r["n"] for r in big)
    print(f"replay of bench.detect, seed {args.seed}: {len(truth)} series × {args.commits} commits")
    print(f"timing: false alarms {false_alarms} = {false_alarms / series_commits * 1000:.2f} per 1,000 series-commits "
          f"(by project kind {dict(by_kind)}); {suspected} suspected never confirmed; {remeasured} re-measurements")
    print(f"steps ≥ 10% within 2 commits: {hits} of {n} ({hits / n:.1%})" if n else "no steps ≥ 10%")
    print("  " + "  ".join(f"{round(s * 100)}%: {r['within2']}/{r['n']} within 2, {r['any']} within 10"
                           for s, r in sorted(by_step.items())))
    if args.explain:
        for key, what, first, last in explained:
            t = truth[key]
            print(f"{what}: {key[0]}/{key[1]} ({t['kind']}, noise source {t['source']}), step {t['step']:.0%} at {t['step_at']}")
            for c, line in replays[key].log:
                if first <= c <= last:
                    print(f"    commit {c}: {line}")


def _policy(overrides: list[str], parser: argparse.ArgumentParser) -> timing.TimingPolicy:
    """The service's timing policy with `overrides` ("noise_k=2.2") applied, each as its field's type."""
    types = {f.name: type(getattr(timing.DEFAULT_POLICY, f.name)) for f in dataclasses.fields(timing.TimingPolicy)}
    changes = {}
    for override in overrides:
        name, _, value = override.partition("=")
        if name not in types or not value:
            parser.error(f"--policy {override!r}: give FIELD=VALUE with FIELD one of {', '.join(types)}")
        changes[name] = types[name](value)
    return dataclasses.replace(timing.DEFAULT_POLICY, **changes)


def sweep(args) -> None:
    """`--capture`: each capture's unpaired noise (bench/detect_captures.py) over every seed of `--seeds`,
    two at a time, and one line a capture: a false-alarm rate near 1 per 1,000 needs more series-commits
    than one seed of `make bench-detect`'s size gives (one false alarm there is 0.21)."""
    from concurrent.futures import ProcessPoolExecutor

    captures = [c for c in detect_captures.named(args.capture or None) if c.unpaired]
    jobs = [(c.label, argparse.Namespace(**{**vars(args), "data": detect_captures.DATA / c.unpaired, "seed": seed,
                                            "explain": False}))
            for c in captures for seed in args.seeds]
    with ProcessPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(_counts, [job for _, job in jobs]))
    print(f"replay of bench.detect, seeds {' '.join(map(str, args.seeds))}: {args.projects * args.series} series × "
          f"{args.commits} commits a seed")
    print("| capture | false alarms / 1,000 (in series-commits) | per seed | steps ≥ 10% within 2 |")
    print("|---|---|---|---|")
    for capture in captures:
        mine = [c for (label, _), c in zip(jobs, counts, strict=True) if label == capture.label]
        alarms, commits = sum(c[0] for c in mine), sum(c[1] for c in mine)
        hits, big = sum(c[2] for c in mine), sum(c[3] for c in mine)
        name = f"**{capture.label} (held out)**" if capture.held_out else capture.label
        print(f"| {name} | {alarms / commits * 1000:.2f} ({alarms} in {commits:,}) | "
              f"{', '.join(f'{c[0] / c[1] * 1000:.2f}' for c in mine)} | "
              f"{f'{hits / big:.1%} ({hits} of {big})' if big else 'no such steps'} |")


def _counts(args) -> tuple[int, int, int, int]:
    """False alarms, series-commits, steps ≥ 10% caught within 2 commits, and such steps."""
    truth, replays, _ = replay(args)
    by_step, false_alarms, *_ = tally(truth, replays)
    big = [r for s, r in by_step.items() if s >= 0.10]
    return false_alarms, len(truth) * args.commits, sum(r["within2"] for r in big), sum(r["n"] for r in big)


def main() -> None:
    parser = argparse.ArgumentParser(description="bench.detect's timing alerts replayed without the database")
    add_series_arguments(parser)
    parser.add_argument("--explain", action="store_true", help="print the results around each miss and false alarm")
    parser.add_argument("--policy", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="TimingPolicy fields to try other values of, e.g. noise_k=2.2 tail_k=1.0")
    parser.add_argument("--capture", nargs="*", help="replay these captures of bench/detect_captures.py (no label: "
                        "all) over every seed of --seeds instead of --data, one line a capture")
    parser.add_argument("--seeds", nargs="+", type=int, default=[10, 11, 12, 13])
    args = parser.parse_args()
    args.policy = _policy(args.policy, parser)
    if args.capture is not None:
        sweep(args)
    else:
        report(*replay(args), args)


if __name__ == "__main__":
    main()
