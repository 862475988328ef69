"""Timing regressions engineers can trust: the per-commit decision (rank test and minimum effect, the
canary, unchanged code) and the alerts' life over a series (suspected, confirmed, delivered)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from service.domain import timing
from service.domain.stats import (
    excess_over_neighbours,
    mann_whitney_greater,
    successive_mean_spread,
    successive_spread,
)
from service.usecases import timing_alerts
from tests.service.receiver import Receiver

# 30 samples around 1 ms with a within-job spread of a few percent; JOB_WOBBLE moves whole jobs by ±1%.
SHAPE = [1.0 + 0.03 * ((i * 7) % 11 - 5) / 5 for i in range(30)]
JOB_WOBBLE = [1.0, 1.01, 0.99, 1.005, 0.995, 1.01, 0.99, 1.0, 1.008, 0.992]


def job(level: float, i: int = 0, canary: float | None = 2.0) -> timing.Job:
    return timing.Job([level * JOB_WOBBLE[i % len(JOB_WOBBLE)] * s for s in SHAPE], canary)


STEADY_WINDOW = [job(1.0, i) for i in range(12)]


def test_mann_whitney_matches_scipy_asymptotic_with_ties():
    x, y = [1.3, 1.1, 1.25, 1.4, 1.05, 1.2], [1.0, 1.1, 0.9, 1.05, 1.0, 0.95, 1.2, 1.1]
    # scipy.stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic").pvalue, and the reverse
    assert mann_whitney_greater(x, y) == pytest.approx(0.011398423024856226, rel=1e-9)
    assert mann_whitney_greater(y, x) == pytest.approx(0.9919562922451326, rel=1e-9)


def test_successive_spread_is_the_standard_deviation_and_ignores_a_level_shift():
    values = np.random.default_rng(0).normal(10.0, 2.0, 20_000)
    assert successive_spread(values) == pytest.approx(2.0, rel=0.03)
    shifted = np.concatenate([values[:10_000], values[10_000:] + 50])  # a step of 25 standard deviations
    assert successive_spread(shifted) == pytest.approx(2.0, rel=0.03)
    # An alternating sequence: differences of +2 and -2; about their median (+2) the spread would be 0.
    assert successive_spread([1.0, 3.0] * 20) == pytest.approx(1.4826 * 2 / 2**0.5)
    assert successive_spread([1.0]) == 0.0


def test_successive_mean_spread_is_the_standard_deviation_ignores_a_level_shift_and_varies_less():
    rng = np.random.default_rng(0)
    values = rng.normal(10.0, 2.0, 20_000)
    assert successive_mean_spread(values) == pytest.approx(2.0, rel=0.02)
    assert successive_mean_spread(values, trim=0) == pytest.approx(2.0, rel=0.02)  # the scale holds for any trim
    shifted = np.concatenate([values[:10_000], values[10_000:] + 50])  # a step of 25 standard deviations
    assert successive_mean_spread(shifted) == pytest.approx(2.0, rel=0.02)
    stretches = rng.normal(0.0, 1.0, (2_000, 40))  # 40 jobs' levels, 2,000 times
    by_mean = [successive_mean_spread(x) for x in stretches]
    by_median = [successive_spread(x) for x in stretches]
    assert np.mean(by_mean) == pytest.approx(1.0, abs=0.05) and np.std(by_mean) < 0.85 * np.std(by_median)
    assert successive_mean_spread([1.0]) == 0.0


def test_excess_over_neighbours_finds_the_slow_values_and_not_a_step():
    values = [1.0, 1.01, 0.99, 1.2, 1.0, 1.01, 0.99, 1.0]
    excess = excess_over_neighbours(values, neighbours=2)
    assert excess[3] == pytest.approx(1.2 / 1.01 - 1) and abs(excess[[0, 1, 2, 4, 5, 6, 7]]).max() < 0.02
    # A 30% step: only the values right at it see a mixed neighbourhood; the rest are 0.
    stepped = excess_over_neighbours([1.0] * 20 + [1.3] * 20, neighbours=5)
    assert abs(stepped).max() <= 0.3 and np.count_nonzero(stepped) <= 10
    assert list(excess_over_neighbours([2.0])) == [0.0] and len(excess_over_neighbours([])) == 0


def heavy_tailed(jobs: int = 40) -> list[timing.Job]:
    """A series whose jobs wobble by ±1% and 3 jobs in 40 land 5% slow: gpt2 onnxruntime's kind of tail."""
    return [job(1.05 if i % 13 == 5 else 1.0, i) for i in range(jobs)]


def test_a_heavy_tailed_series_bars_its_slow_tail_and_a_10pct_step_still_crosses_it():
    history = heavy_tailed()
    spread_only = dataclasses.replace(timing.DEFAULT_POLICY, tail_k=0)  # the bar before the tail counted
    before = timing.decide(job(1.07), history[:20], threshold_pct=5, history=history, policy=spread_only)
    assert before.regressed and before.min_effect_pct == pytest.approx(5)  # the job-to-job spread is ~1%
    now = timing.decide(job(1.07), history[:20], threshold_pct=5, history=history)
    # The slow jobs sit ~6% above their neighbours, 7.5% of the jobs: the 95th percentile is that excess.
    assert not now.regressed and now.min_effect_pct == pytest.approx(timing.DEFAULT_POLICY.tail_k * 5.85, abs=0.2)
    assert "slow tail 5.9%" in now.why
    assert timing.decide(job(1.10), history[:20], threshold_pct=5, history=history).regressed
    # Too short a history to see a tail in: the spread alone sets the bar, as before.
    short = history[: timing.DEFAULT_POLICY.min_tail_jobs - 1]
    spread = timing.decide(job(1.07), short[:12], threshold_pct=5, history=short)
    assert "slow tail" not in spread.why
    assert spread.min_effect_pct == pytest.approx(max(5, timing.student(timing.DEFAULT_POLICY.noise_k, len(short) - 1) * spread.noise_pct))


def test_a_step_beyond_the_bar_regresses_and_one_inside_does_not():
    verdict = timing.decide(job(1.2), STEADY_WINDOW, threshold_pct=5)
    assert verdict.regressed and verdict.change_pct == pytest.approx(20, abs=1)
    assert verdict.min_effect_pct == pytest.approx(5)  # the window is quiet: the set percentage is the bar
    assert not timing.decide(job(1.04), STEADY_WINDOW, threshold_pct=5).regressed


def test_the_bar_follows_the_windows_own_noise():
    noisy = [job(level) for level in (1.0, 1.12, 0.9, 1.08, 0.93, 1.1, 0.88, 1.05, 0.95, 1.0, 1.15, 0.9)]
    verdict = timing.decide(job(1.2), noisy, threshold_pct=5)
    k = timing.student(timing.DEFAULT_POLICY.noise_k, len(noisy) - 1)  # the noise of 12 jobs: Student's t at 11
    assert verdict.noise_pct > 8 and verdict.min_effect_pct == pytest.approx(k * verdict.noise_pct)
    assert not verdict.regressed  # +20% is inside this series' job-to-job wobble
    assert timing.decide(job(1.6), noisy, threshold_pct=5).regressed


def test_unchanged_graph_and_engine_raise_the_bar_and_a_short_window_too():
    assert timing.decide(job(1.08), STEADY_WINDOW, threshold_pct=5, code_changed=True).regressed
    same = timing.decide(job(1.08), STEADY_WINDOW, threshold_pct=5, code_changed=False)
    assert not same.regressed and same.min_effect_pct == pytest.approx(10)
    assert timing.decide(job(1.3), STEADY_WINDOW, threshold_pct=5, code_changed=False).regressed
    short = timing.decide(job(1.08), STEADY_WINDOW[:2], threshold_pct=5, history=STEADY_WINDOW)
    assert not short.regressed and short.min_effect_pct == pytest.approx(10)


def test_no_verdict_before_the_series_noise_is_known():
    # Three measured ancestors: their spread says little, and a 20% jump on a series that turns out to
    # wobble by 5% would be alerted on the threshold alone.
    few = STEADY_WINDOW[: timing.DEFAULT_POLICY.min_noise_jobs - 1]
    assert timing.decide(job(1.3), few, threshold_pct=5) is None
    assert timing.decide(job(1.3), STEADY_WINDOW[: timing.DEFAULT_POLICY.min_noise_jobs], threshold_pct=5).regressed


# Jobs that wobble by ~4% from one to the next: the bar is the noise's, not the threshold's.
NOISY = [job(level) for level in [1.0, 1.025, 0.98, 1.02, 0.975, 1.015, 0.985, 1.03, 0.97, 1.01] * 3]


def test_jobs_pooled_face_the_noise_of_their_mean_and_the_screen_is_lower_than_the_bar():
    one = timing.decide(job(1.10), NOISY, threshold_pct=5, history=NOISY)
    noise, k = one.noise_pct, timing.student(timing.DEFAULT_POLICY.noise_k, len(NOISY) - 1)
    assert noise > 3 and one.min_effect_pct == pytest.approx(k * noise)
    assert not one.regressed  # +9.5% is inside 2.5 noises
    two = timing.decide([job(1.10, 1), job(1.10, 2)], NOISY, threshold_pct=5, history=NOISY)
    assert two.min_effect_pct == pytest.approx(k * noise / 2**0.5)
    assert two.regressed and "mean fastest run of 2 jobs" in two.why
    assert two.change_pct == pytest.approx(one.change_pct)
    # The screen that buys a re-measurement: suspect_k noises for a single job.
    screen = timing.decide(job(1.10), NOISY, threshold_pct=5, history=NOISY, screening=True)
    assert screen.min_effect_pct == pytest.approx(timing.student(timing.DEFAULT_POLICY.suspect_k, len(NOISY) - 1) * noise)
    assert screen.min_effect_pct < one.min_effect_pct
    assert screen.regressed
    # A pool's canary discount is its jobs' mean: one job 20% slow in two, half of 10% on the bar.
    slow = timing.decide([job(1.10, 1, canary=2.4), job(1.10, 2)], NOISY, threshold_pct=5, history=NOISY)
    assert slow.min_effect_pct == pytest.approx(two.min_effect_pct + timing.DEFAULT_POLICY.canary_weight * 10)


def test_a_pooled_mean_bars_the_slow_tail_of_as_many_jobs_in_a_row():
    lone = heavy_tailed()  # one slow job in 13: a pair holds at most one, so its tail is about half
    single = timing.decide(job(1.0), lone[:20], threshold_pct=1, history=lone)
    pair = timing.decide([job(1.0), job(1.0, 1)], lone[:20], threshold_pct=1, history=lone)
    assert pair.min_effect_pct == pytest.approx(single.min_effect_pct / 2, rel=0.2)
    # Slow jobs in runs of three: a pair of them is as slow as one, and the bar stays up.
    runs = [job(1.05 if i % 26 in (5, 6, 7) else 1.0, i) for i in range(40)]
    single = timing.decide(job(1.0), runs[:20], threshold_pct=1, history=runs)
    pair = timing.decide([job(1.0), job(1.0, 1)], runs[:20], threshold_pct=1, history=runs)
    assert pair.min_effect_pct == pytest.approx(single.min_effect_pct, rel=0.1)


def test_a_job_whose_canary_ran_slow_must_beat_the_bar_by_part_of_the_canarys_excess_and_slow_window_jobs_are_left_out():
    # Canary 20% slow: the bar is 5% + half of 20%; +12% could be the slow moment, +18% is more than it explains.
    weight = timing.DEFAULT_POLICY.canary_weight
    slow = timing.decide(job(1.12, canary=2.4), STEADY_WINDOW, threshold_pct=5)
    assert not slow.regressed and slow.canary_slow_pct == pytest.approx(20) and "canary" in slow.why
    assert slow.min_effect_pct == pytest.approx(5 + weight * 20)
    assert timing.decide(job(1.18, canary=2.4), STEADY_WINDOW, threshold_pct=5).regressed
    # Within the slack (+4%) the canary changes nothing.
    assert timing.decide(job(1.08, canary=2.08), STEADY_WINDOW, threshold_pct=5).min_effect_pct == pytest.approx(5)
    # Window jobs timed in a slow moment (canary +50%, the model +40%) neither lift the level nor the noise.
    window = STEADY_WINDOW[:8] + [job(1.4, canary=3.0) for _ in range(4)]
    verdict = timing.decide(job(1.2), window, threshold_pct=5)
    assert verdict.before_ms == pytest.approx(timing.decide(job(1.2), STEADY_WINDOW[:8], 5).before_ms)
    assert verdict.regressed


def test_the_noise_comes_from_the_whole_history_and_a_step_in_it_does_not_inflate_it():
    wobbly = [job(level) for level in (1.0, 1.06, 0.95, 1.05, 0.96, 1.07, 0.94, 1.04, 0.97, 1.06, 0.95, 1.05)]
    # The window since the last step is quiet by chance; the series' history says jobs wobble by ~5%.
    quiet = timing.decide(job(1.09), STEADY_WINDOW, threshold_pct=5)
    history = timing.decide(job(1.09), STEADY_WINDOW, threshold_pct=5, history=STEADY_WINDOW[:4] + wobbly + wobbly)
    assert quiet.regressed and quiet.noise_pct < 1.5
    assert not history.regressed and history.noise_pct > 4
    # A history that stepped by 30% once and is otherwise steady: the noise stays that of a steady series.
    stepped = STEADY_WINDOW + [job(1.3, i) for i in range(12)]
    assert timing.decide(job(1.09), STEADY_WINDOW, threshold_pct=5, history=stepped).noise_pct < 1.6


def test_a_noise_from_few_jobs_faces_students_t_and_from_many_the_normal_bar():
    assert timing.student(2.5, 3) == pytest.approx(5.40, rel=0.03)  # the exact one-sided quantiles
    assert timing.student(2.5, 9) == pytest.approx(3.113, rel=0.005)
    assert timing.student(2.0, 19) == pytest.approx(2.140, rel=0.005)
    assert timing.student(2.5, 10_000) == pytest.approx(2.5, rel=0.001)
    # The same +12% job against the same quiet window: with 4 jobs of history it is inside the bar, with 30 not.
    few = timing.decide(job(1.12), NOISY[:4], threshold_pct=5, history=NOISY[:4])
    many = timing.decide(job(1.12), NOISY[:4], threshold_pct=5, history=NOISY)
    assert not few.regressed and many.regressed and few.min_effect_pct > 1.5 * many.min_effect_pct


def test_a_confirmation_must_agree_in_size():
    first = timing.decide(job(1.2), STEADY_WINDOW, threshold_pct=5)
    assert timing.agree(first, timing.decide(job(1.21, 3), STEADY_WINDOW, threshold_pct=5))
    assert not timing.agree(first, timing.decide(job(2.5), STEADY_WINDOW, threshold_pct=5))  # another slow moment
    assert not timing.agree(first, timing.decide(job(1.0), STEADY_WINDOW, threshold_pct=5))


def test_a_slow_moment_before_a_step_is_told_from_the_step_by_the_re_measurement():
    later = timing.decide(job(1.24, 2), STEADY_WINDOW, threshold_pct=5)

    def again(level):
        return timing.decide(job(level, 1), STEADY_WINDOW, threshold_pct=5)

    assert timing.slow_moment_before(again(1.0), later)  # back at the old level: the next commit's step
    assert timing.slow_moment_before(again(1.03), later)  # under the bar and nearer the old level than the step
    # Under the bar, but past half the next commit's change: the same step, measured once low.
    assert not timing.slow_moment_before(timing.decide(job(1.14, 1), STEADY_WINDOW, threshold_pct=16), later)
    assert not timing.slow_moment_before(again(1.12), later)  # it crossed the bar itself: nothing to tell apart


def test_the_screen_pools_a_job_with_the_previous_commits_when_neither_passes_alone():
    def result(commit, level):
        return SimpleNamespace(commit_id=commit, execute_ms=job(level).samples, canary_ms=2.0, graph_hash=None,
                               engine_version=None)

    older = [result(19 - i, noisy.samples[0] / SHAPE[0]) for i, noisy in enumerate(NOISY[:20])]  # nearest first
    screen_only_one = dataclasses.replace(timing.DEFAULT_POLICY, screen_jobs=1)
    alone = timing_alerts.screen(result(21, 1.085), [result(20, 1.085), *older], {}, 5, screen_only_one)
    assert not alone.verdict.regressed  # +8.0%: under the screen of one job (2 noises, 8.3%)
    pooled = timing_alerts.screen(result(21, 1.085), [result(20, 1.085), *older], {}, 5, timing.DEFAULT_POLICY)
    assert pooled.verdict.regressed and "mean fastest run of 2 jobs" in pooled.verdict.why  # 2.5 noises / √2: 7.4%
    assert pooled.window[0].commit_id == 19  # the window the pool is measured against ends before it
    assert pooled.verdict.min_effect_pct < alone.verdict.min_effect_pct
    # A previous commit with an alert of its own is followed by that alert, not pooled again.
    held = timing_alerts.screen(result(21, 1.085), [result(20, 1.085), *older], {20: SimpleNamespace(confirmed_at=None)}, 5,
                                 timing.DEFAULT_POLICY)
    assert not held.verdict.regressed


def _stand_in(commit, level, i=0):
    return SimpleNamespace(commit_id=commit, execute_ms=job(level, i).samples, canary_ms=2.0, graph_hash=None,
                           engine_version=None)


# The 20 commits before c20 of a series whose jobs wobble by ~4% (nearest first).
NOISY_ANCESTRY = [_stand_in(19 - i, noisy.samples[0] / SHAPE[0]) for i, noisy in enumerate(NOISY[:20])]


def test_a_confirmation_pools_every_job_since_the_alert_but_not_the_alerted_one():
    alerted = _stand_in(20, 1.12)  # +11.4%: past the screen, under the bar of one job
    policy = timing.DEFAULT_POLICY

    def confirms(remeasured, later):
        return timing_alerts.confirmation(alerted, NOISY_ANCESTRY, {}, [_stand_in(20, x, 1) for x in remeasured],
                                          [_stand_in(21 + k, x, k) for k, x in enumerate(later)], 5, policy)

    assert confirms([1.07], []) is None  # +7.5%: one job faces the whole bar
    assert confirms([1.07], [1.07]) is None  # two jobs' mean +7.0%: under the bar of two
    three = confirms([1.07, 1.07], [1.07])  # two re-measurements and the next commit: the bar of three
    assert three.regressed and "mean fastest run of 3 jobs" in three.why
    assert confirms([1.075, 1.075], []).regressed  # two re-measurements at +7.5%: past the bar of two


def test_a_re_measurement_between_the_levels_asks_for_one_more():
    alerted = _stand_in(20, 1.12)  # +11.4%

    def again(*levels):
        remeasured = [_stand_in(20, x, k + 1) for k, x in enumerate(levels)]
        return timing_alerts.measure_again(alerted, NOISY_ANCESTRY, {}, remeasured, 5, timing.DEFAULT_POLICY)

    one_more = again(1.09)
    assert one_more.why == timing_alerts.NEAR_THE_NEW_LEVEL
    assert one_more.verdict.change_pct == pytest.approx(9.5, abs=0.1)  # nearer +11.4% than the window, under 10.4%
    assert again(1.05) is None  # +5.5%: nearer the window's level, a slow moment's re-measurement
    assert again(1.09, 1.08) is None  # two re-measurements already (`remeasures`)
    assert timing_alerts.measure_again(alerted, NOISY_ANCESTRY, {}, [_stand_in(20, 1.09, 1)], 5,
                                       dataclasses.replace(timing.DEFAULT_POLICY, remeasures=1)) is None


def _slow_canary(commit, level, i=0):
    return SimpleNamespace(**{**vars(_stand_in(commit, level, i)), "canary_ms": 2.5})  # the window's canary: 2.0


def test_a_job_timed_in_a_slow_moment_neither_confirms_nor_lets_a_step_go():
    alerted = _stand_in(20, 1.12)  # +11.4%
    window = [timing_alerts.as_job(r) for r in NOISY_ANCESTRY]
    assert timing.in_slow_moment(timing_alerts.as_job(_slow_canary(20, 1.0)), window)  # canary +25%
    assert not timing.in_slow_moment(timing_alerts.as_job(_stand_in(20, 1.0)), window)
    assert not timing.in_slow_moment(timing_alerts.as_job(SimpleNamespace(**{**vars(_stand_in(20, 1.0)), "canary_ms": None})),
                                     window)  # no canary: nothing says the machine was slow

    def confirms(remeasured):
        return timing_alerts.confirmation(alerted, NOISY_ANCESTRY, {}, remeasured, [], 5, timing.DEFAULT_POLICY)

    # Two re-measurements at the alerted job's +11.4%: calm, they confirm; with one in a slow moment the calm
    # one alone decides (past the bar of one job, 10.4%); both in slow moments, nothing does.
    assert confirms([_stand_in(20, 1.12, 1), _stand_in(20, 1.12, 2)]).regressed
    assert confirms([_slow_canary(20, 1.12, 1), _stand_in(20, 1.12, 2)]).regressed
    assert confirms([_slow_canary(20, 1.12, 1), _slow_canary(20, 1.12, 2)]) is None
    # The calm one alone is what is tested: at +7.5% it faces the bar of one job, whatever the slow one said.
    assert confirms([_slow_canary(20, 1.12, 1), _stand_in(20, 1.075, 2)]) is None

    # A re-measurement in a slow moment asks for one more, while it may, and says why.
    one_more = timing_alerts.measure_again(alerted, NOISY_ANCESTRY, {}, [_slow_canary(20, 1.12, 1)], 5,
                                           timing.DEFAULT_POLICY)
    assert one_more.why == timing_alerts.SLOW_MOMENT
    assert timing_alerts.measure_again(alerted, NOISY_ANCESTRY, {}, [_slow_canary(20, 1.12, 1), _slow_canary(20, 1.12, 2)],
                                       5, timing.DEFAULT_POLICY) is None  # `remeasures` spent


def test_the_code_counts_as_changed_while_the_nearest_window_jobs_ran_other_code():
    def result(graph):
        return SimpleNamespace(graph_hash=graph, engine_version="1.0")

    window = [result("g2"), result("g1"), result("g1")]  # the graph changed at the nearest job's commit
    assert timing_alerts.code_changed(result("g2"), window)
    assert not timing_alerts.code_changed(result("g2"), [result("g2"), result("g2"), result("g1")])
    assert timing_alerts.code_changed(result(None), [result(None)])  # unknown: assume it changed


# --- over a series, through POST /results ---------------------------------------------------------


def _post(client, sha, parents, level, i=0, canary=2.0, graph_hash=None, engine_version=None, libraries=None):
    document = {
        "project": "engine",
        "commit": {"sha": sha, "parents": parents},
        "machine": {"machine_class": "cpu", "cpu": "test cpu", "cores": 2},
        "results": [{
            "model": "bert.onnx", "engine": "fusionwatch", "engine_version": engine_version or f"0.{sha}",
            "level": "all", "fusions": {"com.microsoft.BiasGelu": 2}, "graph_hash": graph_hash,
            "execute_ms": list(job(level, i).samples), "canary_ms": canary, "kernel_libraries": libraries or {},
        }],
    }
    reply = client.post("/api/v1/results", json=document)
    assert reply.status_code == 201, reply.text
    return reply.json()


@pytest.fixture
def history(client):
    """A project with a hook and 25 quiet commits b0..b14, c0..c9: enough history that two jobs as slow as
    none of its 25 confirm a step (`timing.null_chance`; a younger series needs a third)."""
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    with Receiver() as receiver:
        client.post("/api/v1/projects/engine/hooks", json={"url": receiver.url}).raise_for_status()
        shas = [f"b{i}" for i in range(15)] + [f"c{i}" for i in range(10)]
        for i, sha in enumerate(shas):
            assert _post(client, sha, [shas[i - 1]] if i else [], 1.0, i)["alerts"] == []
        yield receiver


def _timing_alerts(client):
    return client.get("/api/v1/alerts", params={"kind": "timing-regression"}).json()["items"]


def test_a_step_is_suspected_then_confirmed_by_the_next_commit_and_only_then_delivered(client, history):
    slow = _post(client, "c10", ["c9"], 1.25, 0)
    [alert] = slow["alerts"]
    assert alert["state"] == "suspected" and alert["commit"] == "c10" and alert["baseline_commit"] == "c9"
    assert history.bodies == []  # suspected: not delivered
    assert client.get(slow["run_url"]).json()["verdict"] == "ok"
    confirmed = _post(client, "c11", ["c10"], 1.25, 1)
    [same] = confirmed["alerts"]
    assert same["id"] == alert["id"] and same["state"] == "confirmed" and same["confirmed_by"] == "c11"
    assert "Confirmed by the next commit c11" in same["message"]
    assert [b["alert"]["id"] for b in history.bodies] == [alert["id"]]
    assert client.get(slow["run_url"]).json()["verdict"] == "regression"
    # The series' level changed at c10: later commits at that level are compared with it and stay quiet.
    for i in range(12, 16):
        assert _post(client, f"c{i}", [f"c{i - 1}"], 1.25, i)["alerts"] == []
    assert len(_timing_alerts(client)) == 1


def test_one_slow_job_stays_suspected_and_leaves_the_window(client, history):
    [alert] = _post(client, "c10", ["c9"], 1.4, 0)["alerts"]
    assert _post(client, "c11", ["c10"], 1.0, 1)["alerts"] == []
    assert _post(client, "c12", ["c11"], 1.0, 2)["alerts"] == []
    [still] = _timing_alerts(client)
    assert (still["id"], still["state"]) == (alert["id"], "suspected") and history.bodies == []


def test_a_re_measurement_of_the_commit_confirms_it(client, history):
    [alert] = _post(client, "c10", ["c9"], 1.25, 0)["alerts"]
    [again] = _post(client, "c10", ["c9"], 1.25, 1)["alerts"]
    assert again["id"] == alert["id"] and again["state"] == "confirmed"
    assert "Confirmed by a re-measurement" in again["message"]
    assert _post(client, "c10", ["c9"], 1.25, 2)["alerts"] == []  # confirmed once, never raised twice


def test_a_re_measurement_in_a_slow_moment_asks_for_another_and_a_calm_one_confirms(client, history):
    [alert] = _post(client, "c10", ["c9"], 1.25, 0)["alerts"]
    [again] = _post(client, "c10", ["c9"], 1.25, 1, canary=2.6)["alerts"]  # canary +30%: the machine was slow
    assert again["id"] == alert["id"] and again["state"] == "suspected" and history.bodies == []
    assert "the machine was in a slow moment (the canary ran slow), which cannot confirm a step" in again["message"]
    [confirmed] = _post(client, "c10", ["c9"], 1.25, 2)["alerts"]
    assert confirmed["id"] == alert["id"] and confirmed["state"] == "confirmed"
    assert [b["alert"]["id"] for b in history.bodies] == [alert["id"]]


def test_a_re_measurement_repeats_no_fusion_alert(client, history):
    def post(sha, parents, level, i):
        document = {
            "project": "engine", "commit": {"sha": sha, "parents": parents},
            "machine": {"machine_class": "cpu", "cpu": "test cpu", "cores": 2},
            "results": [{
                "model": "bert.onnx", "engine": "fusionwatch", "engine_version": f"0.{sha}", "level": "all",
                "fusions": {}, "execute_ms": list(job(level, i).samples), "canary_ms": 2.0,
            }],
        }
        return sorted((a["kind"], a["state"]) for a in client.post("/api/v1/results", json=document).json()["alerts"])

    # BiasGelu dropped together with a timing step: the re-measurement confirms the timing alert only.
    assert post("c10", ["c9"], 1.25, 0) == [("fusion-regression", "open"), ("timing-regression", "suspected")]
    assert post("c10", ["c9"], 1.25, 1) == [("timing-regression", "confirmed")]
    fusion = client.get("/api/v1/alerts", params={"kind": "fusion-regression"}).json()["items"]
    assert [a["commit"] for a in fusion] == ["c10"]


def test_a_slow_job_just_before_a_step_is_not_confirmed_by_it(client, history):
    [slow] = _post(client, "c10", ["c9"], 1.22, 0)["alerts"]
    assert _post(client, "c10", ["c9"], 1.0, 1)["alerts"] == []  # its re-measurement: the old level
    [step] = _post(client, "c11", ["c10"], 1.24, 2)["alerts"]
    assert step["commit"] == "c11" and step["state"] == "suspected" and step["id"] != slow["id"]
    [confirmed] = _post(client, "c11", ["c10"], 1.24, 3)["alerts"]
    assert confirmed["id"] == step["id"] and confirmed["state"] == "confirmed"
    states = {a["commit"]: a["state"] for a in _timing_alerts(client)}
    assert states == {"c10": "suspected", "c11": "confirmed"}


def test_a_step_raised_one_commit_late_is_confirmed_at_the_commit_it_began(client, history):
    """The step's first job (+22%) disagrees in size with its re-measurement and the next commit's (+30%),
    so the next commit raises its own alert; once that is confirmed, the re-measurement at the step's
    commit, already at the new level, moves the confirmation back to where the step began."""
    [step] = _post(client, "c10", ["c9"], 1.22, 0)["alerts"]
    assert _post(client, "c10", ["c9"], 1.30, 1)["alerts"] == []  # crossed, but too far from +22% to agree
    [late] = _post(client, "c11", ["c10"], 1.30, 2)["alerts"]
    assert late["commit"] == "c11" and late["state"] == "suspected"
    [confirmed] = _post(client, "c11", ["c10"], 1.30, 3)["alerts"]
    assert (confirmed["id"], confirmed["commit"], confirmed["state"]) == (step["id"], "c10", "confirmed")
    assert "the step began here" in confirmed["message"]
    by_commit = {a["commit"]: a for a in _timing_alerts(client)}
    assert {c: a["state"] for c, a in by_commit.items()} == {"c10": "confirmed", "c11": "suspected"}
    assert "the step began at the previous commit" in by_commit["c11"]["message"]
    assert [b["alert"]["id"] for b in history.bodies] == [step["id"]]  # only the step's own alert is delivered


def test_a_step_whose_re_measurement_came_out_low_is_still_confirmed_at_its_commit(client):
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 15}}).raise_for_status()
    for i in range(10):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0, i)
    [alert] = _post(client, "c10", ["c9"], 1.22, 0)["alerts"]
    [again] = _post(client, "c10", ["c9"], 1.14, 2)["alerts"]  # +12.9%: under the 15% bar, past half the step
    assert (again["id"], again["state"]) == (alert["id"], "suspected")  # so it asks for one more
    [same] = _post(client, "c11", ["c10"], 1.22, 0)["alerts"]
    assert (same["id"], same["commit"], same["state"]) == (alert["id"], "c10", "confirmed")


def test_a_step_under_the_bar_twice_is_confirmed_by_the_two_jobs_together(client):
    """On a series whose jobs wobble by ~4% the bar is ~10%: a 9% step's re-measurement and the next
    commit's job each stay under it, and neither would confirm alone; their mean faces the noise of a
    mean of two (~7%) and does."""
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    for i, noisy in enumerate(NOISY[:20]):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], noisy.samples[0] / SHAPE[0])
    [alert] = _post(client, "c20", ["c19"], 1.12)["alerts"]  # past the screen (2 noises), under the bar
    assert alert["state"] == "suspected"
    assert _post(client, "c20", ["c19"], 1.06)["alerts"] == []  # the re-measurement: under the bar, nearer the old level
    [confirmed] = _post(client, "c21", ["c20"], 1.10)["alerts"]
    assert (confirmed["id"], confirmed["commit"], confirmed["state"]) == (alert["id"], "c20", "confirmed")
    assert "Confirmed by the next commit c21" in confirmed["message"]


def test_a_re_measurement_between_the_levels_gets_one_more_and_the_two_confirm_together(client):
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    for i, noisy in enumerate(NOISY[:20]):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], noisy.samples[0] / SHAPE[0])
    [alert] = _post(client, "c20", ["c19"], 1.12)["alerts"]
    [again] = _post(client, "c20", ["c19"], 1.09, 1)["alerts"]  # +9.5%: under the bar, nearer the new level
    assert (again["id"], again["state"]) == (alert["id"], "suspected") and "measured once more" in again["message"]
    [confirmed] = _post(client, "c20", ["c19"], 1.08, 2)["alerts"]  # the two re-measurements' mean: bar of two
    assert (confirmed["id"], confirmed["state"]) == (alert["id"], "confirmed")
    assert "Confirmed by a re-measurement" in confirmed["message"]


def test_a_slow_canary_raises_the_bar_by_part_of_its_excess(client, history):
    assert _post(client, "c10", ["c9"], 1.17, 0, canary=2.6)["alerts"] == []  # canary +30%: the bar is 5% + 15%
    [alert] = _post(client, "c11", ["c10"], 1.3, 1, canary=2.6)["alerts"]
    assert alert["state"] == "suspected" and "canary ran 30.0% slow" in alert["message"]


def test_a_step_on_other_kernel_libraries_says_so(client):
    # The session's measured library choice (runtime/kernel_choice.py) flipped at c10: the alert
    # names the change, which may be the step; at c11 (same libraries as c10) nothing is added.
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    mkl = {"gemm": "mkl-packed", "conv": "onednn", "wait": "spin"}
    for i in range(10):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0, i, libraries=mkl)
    [alert] = _post(client, "c10", ["c9"], 1.25, 0, libraries={**mkl, "gemm": "onednn"})["alerts"]
    assert "other kernel libraries than the baseline (gemm mkl-packed → onednn)" in alert["message"]
    assert "conv" not in alert["message"].split("kernel libraries")[1]
    results = client.get("/api/v1/alerts", params={"kind": "timing-regression"}).json()["items"]
    assert [a["id"] for a in results] == [alert["id"]]


def test_a_step_on_the_same_kernel_libraries_names_none(client, history):
    [alert] = _post(client, "c10", ["c9"], 1.25, 0, libraries={"gemm": "onednn"})["alerts"]  # baseline recorded none
    assert "kernel libraries" not in alert["message"]


def test_kernel_libraries_are_bounded(client, history):
    reply = client.post("/api/v1/results", json={
        "project": "engine", "commit": {"sha": "c10", "parents": ["c9"]},
        "results": [{"model": "bert.onnx", "engine": "fusionwatch", "engine_version": "1", "level": "all",
                     "fusions": {}, "kernel_libraries": {"gemm": "x" * 33}}],
    })
    assert reply.status_code == 422 and "kernel_libraries" in reply.text


def test_unchanged_graph_and_engine_need_a_larger_step(client):
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    for i in range(10):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0, i, graph_hash="g", engine_version="1.0")
    assert _post(client, "c10", ["c9"], 1.08, 0, graph_hash="g", engine_version="1.0")["alerts"] == []
    [alert] = _post(client, "c11", ["c10"], 1.08, 0, graph_hash="g2", engine_version="1.0")["alerts"]
    assert alert["state"] == "suspected"


def test_the_commit_after_a_graph_change_still_counts_as_changed(client):
    """A step's own job stayed under the bar; the next commit has the step's graph, but the window's
    level was measured on the old one, so its bar is not doubled."""
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    for i in range(10):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], 1.0, i, graph_hash="g", engine_version="1.0")
    assert _post(client, "c10", ["c9"], 1.03, 0, graph_hash="g2", engine_version="1.0")["alerts"] == []
    [alert] = _post(client, "c11", ["c10"], 1.08, 1, graph_hash="g2", engine_version="1.0")["alerts"]
    assert alert["state"] == "suspected" and "unchanged" not in alert["message"]


# --- change points over history ---------------------------------------------------------------------


def test_the_energy_statistic_matches_its_definition():
    """best_split's prefix sums against the formula written out for every split."""
    import numpy as np

    from service.domain.change_points import MIN_SIDE, best_split

    x = np.array([0.1, 0.3, 0.2, 0.25, 0.9, 1.1, 0.95, 1.0, 0.2, 0.85, 1.05])
    n = len(x)
    best_q, best_tau = -np.inf, None
    for tau in range(MIN_SIDE, n - MIN_SIDE + 1):
        left, right = x[:tau], x[tau:]
        cross = np.abs(left[:, None] - right[None, :]).mean()
        within_l = np.abs(left[:, None] - left[None, :]).sum() / (tau * (tau - 1))
        within_r = np.abs(right[:, None] - right[None, :]).sum() / ((n - tau) * (n - tau - 1))
        q = tau * (n - tau) / n * (2 * cross - within_l - within_r)
        if q > best_q:
            best_q, best_tau = q, tau
    tau, q = best_split(np.abs(x[:, None] - x[None, :])[None])
    assert (int(tau[0]), float(q[0])) == (best_tau, pytest.approx(best_q))


def test_change_points_find_planted_steps_and_nothing_in_noise():
    import numpy as np

    from service.domain.change_points import change_points

    rng = np.random.default_rng(1)
    quiet = np.exp(rng.normal(0, 0.03, 120))
    assert change_points(quiet) == []
    stepped = quiet.copy()
    stepped[40:] *= 1.15
    stepped[90:] /= 1.15
    found = change_points(stepped)
    assert [cp.index for cp in found] == [40, 90]
    assert found[0].after / found[0].before == pytest.approx(1.15, rel=0.03) and found[0].p_value <= 0.001


def test_history_returns_change_points_and_where_they_disagree_with_alerts(client):
    client.post("/api/v1/projects", json={"name": "engine", "settings": {"timing_threshold_pct": 5}}).raise_for_status()
    levels = [1.0] * 20 + [1.25] * 20 + [1.0] * 20  # a step up at c20 (alerted), back down at c40
    for i, level in enumerate(levels):
        _post(client, f"c{i}", [f"c{i - 1}"] if i else [], level, i)
    [series] = client.get("/api/v1/projects/engine/history").json()["series"]
    points = {cp["commit"]: cp for cp in series["change_points"]}
    assert set(points) == {"c20", "c40"}
    assert points["c20"]["change_pct"] == pytest.approx(25, abs=2) and points["c20"]["alert"]["state"] == "confirmed"
    assert points["c40"]["change_pct"] < 0 and points["c40"]["alert"] is None  # faster: no alert, no disagreement
    assert series["disagreements"] == []
    # A step the per-commit decision cannot see (under its 5% bar, then raised by a 2× bar on unchanged code)
    # shows up as a change point without an alert.
    for i in range(60, 100):
        _post(client, f"c{i}", [f"c{i - 1}"], 1.0 if i < 80 else 1.04, i, graph_hash="g", engine_version="1")
    [series] = client.get("/api/v1/projects/engine/history").json()["series"]
    assert [(d["commit"], d["what"]) for d in series["disagreements"]] == [("c80", "change point without a timing alert")]


def test_every_measurement_carries_its_canary():
    from pathlib import Path

    from service.adapters.measure import measure
    from service.domain.protocol import Protocol

    model = Path(__file__).resolve().parents[1] / "models" / "resnet_tiny_opset17.onnx"
    measured = measure(model, "onnxruntime", "basic", Protocol(runs=2, warmup=1))
    assert measured.canary_ms is not None and measured.canary_ms > 0


def test_a_confirmation_too_common_in_the_series_own_history_is_refused():
    quiet = [job(1.0, i) for i in range(30)]  # nearest first; the nearest five are not counted
    assert timing.null_chance(quiet, [40.0, 40.0]) == pytest.approx((0.5 / 26) ** 2)
    assert not timing.too_common(quiet, [40.0, 40.0])
    # Every tenth job 50% slow (a shared machine's slow mode: 3 of the 25 counted): two jobs 40% slow are
    # too common, three are not ((3.5 / 26)³ = 2.4e-3 ... no: still too common), four are.
    bimodal = [job(1.5 if i % 10 == 7 else 1.0, i) for i in range(30)]
    assert timing.null_chance(bimodal, [40.0, 40.0]) == pytest.approx((3.5 / 26) ** 2)
    assert timing.too_common(bimodal, [40.0, 38.0]) and timing.too_common(bimodal, [40.0] * 3)
    assert not timing.too_common(bimodal, [40.0] * 4)
    # A step smaller than the slow mode is counted against the jobs at least that slow.
    assert timing.null_chance(bimodal, [20.0, 20.0]) == timing.null_chance(bimodal, [40.0, 40.0])
    # The suspected jobs the history no longer holds (their re-measurements took their commits) count.
    assert timing.too_common(quiet, [40.0, 40.0], replaced=[45.0, 50.0])
    # A step that began a commit before the alerted one is not the series' slowness.
    stepped = [job(1.3, 0), job(1.3, 1)] + quiet[2:]
    assert timing.null_chance(stepped, [30.0, 30.0]) == timing.null_chance(quiet, [30.0, 30.0])


def test_a_confirmation_too_common_on_the_machine_is_refused_young_series_or_old():
    # Three other series of the machine (levels nearest first), each with every tenth job 50% slow: of
    # each one's 25 counted jobs (the nearest five left out) 3 are slow, 9 of 75 pooled.
    slow_mode = [np.array([1.5 if i % 10 == 7 else 1.0 for i in range(30)]) for _ in range(3)]
    quiet_machine = [np.ones(30) for _ in range(3)]
    young = [job(1.0, i) for i in range(10)]  # no count of its own: the machine's says it
    assert timing.null_chance(young, [40.0, 40.0], machine=slow_mode) == pytest.approx((9.5 / 76) ** 2)
    assert timing.too_common(young, [40.0] * 3, machine=slow_mode)  # (9.5 / 76)³ = 2.0e-3
    assert not timing.too_common(young, [40.0] * 4, machine=slow_mode)
    assert not timing.too_common(young, [40.0, 40.0], machine=quiet_machine)
    # A series whose own 25 jobs never ran that slow is still judged by the machine's: the larger holds.
    quiet = [job(1.0, i) for i in range(30)]
    assert timing.null_chance(quiet, [40.0, 40.0], machine=slow_mode) == pytest.approx((9.5 / 76) ** 2)
    assert timing.null_chance(quiet, [40.0, 40.0], machine=quiet_machine) == pytest.approx((0.5 / 26) ** 2)
    # An engine's commit that slowed every series at once sits in their nearest jobs: not the machine's.
    stepped = [np.array([1.4] * 3 + [1.0] * 27) for _ in range(3)]
    assert timing.null_chance(quiet, [40.0, 40.0], machine=stepped) == pytest.approx((0.5 / 26) ** 2)
    # Too few jobs on the machine as well: no chance at all.
    assert timing.null_chance(young, [40.0, 40.0], machine=[np.ones(8)]) == 0.0


def test_the_machine_is_every_series_on_the_machine_class_before_the_result(client, session):
    from sqlalchemy import select

    from service.models import Result

    def post(sha, parents, machine_class, levels):
        reply = client.post("/api/v1/results", json={
            "project": "engine", "commit": {"sha": sha, "parents": parents},
            "machine": {"machine_class": machine_class, "cpu": "test cpu", "cores": 2},
            "results": [{"model": model, "engine": "fusionwatch", "engine_version": "1", "level": "all",
                         "fusions": {}, "execute_ms": [level * 1.1, level, level * 1.2]} for model, level in levels.items()],
        })
        assert reply.status_code == 201, reply.text

    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    for i in range(3):
        post(f"c{i}", [f"c{i - 1}"] if i else [], "cpu", {"bert.onnx": 1.0 + i, "gpt2.onnx": 10.0 + i})
        post(f"c{i}", [f"c{i - 1}"] if i else [], "cuda", {"gpt2.onnx": 100.0 + i})
    post("c3", ["c2"], "cpu", {"bert.onnx": 9.0, "gpt2.onnx": 99.0})
    now, later = session.scalars(select(Result).where(Result.machine_class == "cpu").order_by(Result.id)).all()[-2:]
    levels = timing_alerts.machine_levels(session, now, timing.DEFAULT_POLICY)
    # Every series of the class measured before, nearest first; not the other class, not what came after.
    assert sorted(list(series) for series in levels) == [[3.0, 2.0, 1.0], [12.0, 11.0, 10.0]]
    assert later.id > now.id
    few = timing_alerts.machine_levels(session, now, dataclasses.replace(timing.DEFAULT_POLICY, machine_jobs=3))
    assert sorted(list(series) for series in few) == [[3.0], [12.0, 11.0]]  # the latest 3 jobs of the class


def test_a_young_series_has_no_null_chance_and_its_own_steps_suspicions_are_not_its_slowness():
    young = [job(1.0, i) for i in range(19)]  # fewer than min_tail_jobs: the history cannot say
    assert timing.null_chance(young, [40.0, 40.0]) == 0.0 and not timing.too_common(young, [40.0, 40.0])
