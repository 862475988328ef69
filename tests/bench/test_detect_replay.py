"""bench.detect_replay is how the detection rules are tuned, so it must decide exactly as the service
does: the same small bench through POST /results (bench.detect, SQLite) and through the replay must
confirm, miss and re-measure the same."""

from __future__ import annotations

import argparse

import pytest

from bench import detect, detect_replay

pytestmark = pytest.mark.slow


def _args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    detect.add_series_arguments(parser)
    args = parser.parse_args([])
    args.data = detect.DATA.with_name("detect_noise_zen5.npz")  # the noisier measurement: more suspicions to follow
    args.diagnose = args.explain = False
    args.policy = None
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def test_the_replay_decides_as_the_service_does():
    args = _args(projects=2, series=24, commits=40, seed=3)  # series 24-47 carry the steps of 10-30%
    report = detect.run(args)
    truth, replays, remeasured = detect_replay.replay(args)
    by_step, false_alarms, _, suspected, _ = detect_replay.tally(truth, replays)
    timing = report["timing"]
    assert remeasured == report["remeasured"] > 0
    assert suspected == timing["suspected_never_confirmed"]
    assert false_alarms == timing["false_alarms"]
    replayed = {f"{round(s * 100)}%": (r["within2"] / r["n"], r["any"] / r["n"]) for s, r in by_step.items()}
    served = {s: (r["recall_within_2"], r["recall_within_10"]) for s, r in timing["by_step"].items()}
    assert replayed == served and any(within2 for within2, _ in served.values())
