"""The timing decision's words (service/domain/verdict_words.py): what the CLI and the pages show."""

from __future__ import annotations

from service.domain import verdict_words
from service.domain.paired import decide_paired
from service.domain.timing import TimingVerdict


def _window(change_pct: float, bar: float, regressed: bool = False) -> TimingVerdict:
    return TimingVerdict(regressed, 1.0, 1 + change_pct / 100, change_pct, 0.001, bar, 2.0, 0.0, True, "why")


def test_a_window_verdict_says_within_noise_improved_or_re_measuring():
    assert verdict_words.from_window(_window(+135.0, 200.0), 4)["word"] == "within noise"  # under its bar: not red
    assert verdict_words.from_window(_window(-12.0, 8.0), 4)["word"] == "improved"
    assert verdict_words.from_window(_window(+12.0, 8.0, regressed=True), 4)["word"] == "inconclusive (re-measuring)"
    shown = verdict_words.from_window(_window(+3.0, 8.0), 4)
    assert shown["statistic"] == "fastest run +3.0% against the window (bar ±8.0%)" and shown["bar_pct"] == 8.0
    too_few = verdict_words.from_window(None, 4)
    assert too_few["word"] == "inconclusive" and "fewer than 4 measured ancestors" in too_few["statistic"]


def test_the_alert_state_decides_the_word_shown_later():
    suspected = verdict_words.from_window(_window(+12.0, 8.0, regressed=True), 4)
    assert verdict_words.shown(suspected, "suspected")["word"] == "inconclusive (re-measuring)"
    assert verdict_words.shown(suspected, "confirmed")["word"] == "regressed"
    assert verdict_words.shown(suspected, None)["word"] == "within noise"  # its re-measurement did not confirm it
    assert verdict_words.shown(None, None) is None
    paired = verdict_words.from_paired(decide_paired([1.0] * 12, [1.12] * 12))
    assert verdict_words.shown(paired, "info")["word"] == "slower at level disabled (information)"


def test_a_paired_verdict_shows_its_ratio_and_interval():
    words = verdict_words.from_paired(decide_paired([1.0] * 12, [1.12] * 12))
    assert words["word"] == "regressed" and words["basis"] == "paired"
    assert words["statistic"] == "candidate / baseline 1.120 [1.120, 1.120] over 12 pairs"
    assert verdict_words.from_paired(decide_paired([1.0] * 3, [1.5] * 3))["statistic"] == (
        "candidate / baseline 1.500 (too few pairs for an interval) over 3 pairs")


def test_an_inconclusive_paired_interval_says_what_it_does_know():
    at_the_bar = verdict_words.from_paired(decide_paired([1.0] * 12, [1.04, 1.045, 1.05, 1.055] * 3))
    assert at_the_bar["word"] == "inconclusive"
    assert at_the_bar["statistic"].endswith("over 12 pairs: slower, but not clearly by 5% or more")
    faster = verdict_words.from_paired(decide_paired([1.0] * 12, [1 / 1.04, 1 / 1.045, 1 / 1.05, 1 / 1.055] * 3))
    assert faster["statistic"].endswith(": faster, but not clearly by 5% or more")
    wide = verdict_words.from_paired(decide_paired([1.0] * 12, [0.8, 1.25, 0.9, 1.1] * 3))
    assert wide["word"] == "inconclusive" and wide["statistic"].endswith(": no change ruled out, nor one of 5%")
    decided = verdict_words.from_paired(decide_paired([1.0] * 12, [1.12] * 12))
    assert decided["statistic"] == "candidate / baseline 1.120 [1.120, 1.120] over 12 pairs"
