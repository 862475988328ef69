"""The words a timing decision is shown in: the CLI's tables, the commit and project pages and the
history chart say what the detector decided, with the statistic it used and its bar, never a bare
change of medians in red (a +135% the detector did not call is a slow moment, and says so).

"regressed" (an alert was raised and confirmed), "improved", "within noise" (the change is under the
bar the series' noise or the paired interval sets), "inconclusive" (too little to decide: a series'
first jobs, a paired job that ran out of time) and "inconclusive (re-measuring)" (a suspected job
whose re-measurement is queued).
"""

from __future__ import annotations

from typing import Any

from service.domain.paired import IMPROVED, INCONCLUSIVE, REGRESSED, WITHIN_NOISE, PairedVerdict
from service.domain.timing import TimingVerdict

RE_MEASURING = "inconclusive (re-measuring)"


def signed_pct(value: float | None) -> str:
    """A change as plain text and tables show it ("+5.6%"); "" where there is none."""
    return "" if value is None else f"{value:+.1f}%"


INFORMATION = "slower at level disabled (information)"  # the export as written: no verdict fails on it
WORDS = (REGRESSED, IMPROVED, WITHIN_NOISE, INCONCLUSIVE, RE_MEASURING, INFORMATION)


def from_paired(verdict: PairedVerdict) -> dict[str, Any]:
    interval = f" [{verdict.low:.3f}, {verdict.high:.3f}]" if verdict.high != float("inf") else " (too few pairs for an interval)"
    return {
        "word": verdict.word, "basis": "paired", "change_pct": round(verdict.change_pct, 2),
        "bar_pct": verdict.min_effect_pct,
        "statistic": f"candidate / baseline {verdict.ratio:.3f}{interval} over {verdict.pairs} pairs{_undecided(verdict)}",
    }  # fmt: skip


def _undecided(verdict: PairedVerdict) -> str:
    """What an inconclusive interval does say: a change known to be there but not to reach the bar
    (1.047 [1.043, 1.052] over 60 pairs: slower, by about the bar) reads otherwise as if nothing were
    known."""
    if verdict.word != INCONCLUSIVE or verdict.high == float("inf"):
        return ""
    bar = f"{verdict.min_effect_pct:g}%"
    if verdict.low > 1:
        return f": slower, but not clearly by {bar} or more"
    if verdict.high < 1:
        return f": faster, but not clearly by {bar} or more"
    return f": no change ruled out, nor one of {bar}"


def from_window(verdict: TimingVerdict | None, min_noise_jobs: int) -> dict[str, Any]:
    if verdict is None:
        return {"word": INCONCLUSIVE, "basis": "window", "change_pct": None, "bar_pct": None,
                "statistic": f"fewer than {min_noise_jobs} measured ancestors: the series' noise is not known yet"}
    if verdict.regressed:
        word = RE_MEASURING
    elif verdict.change_pct <= -verdict.min_effect_pct:
        word = IMPROVED
    else:
        word = WITHIN_NOISE
    return {
        "word": word, "basis": "window", "change_pct": round(verdict.change_pct, 2),
        "bar_pct": round(verdict.min_effect_pct, 2), "noise_pct": round(verdict.noise_pct, 2),
        "statistic": f"fastest run {verdict.change_pct:+.1f}% against the window (bar ±{verdict.min_effect_pct:.1f}%)",
    }  # fmt: skip


def confirming(alerted_sha: str, change_pct: float) -> dict[str, Any]:
    """A result that confirmed the timing regression raised at the commit before it."""
    return {"word": WITHIN_NOISE, "basis": "window", "change_pct": None, "bar_pct": None,
            "statistic": f"confirms the step raised at {alerted_sha[:12]} ({change_pct:+.1f}% against the window before it)"}


def shown(stored: dict[str, Any] | None, alert_state: str | None) -> dict[str, Any] | None:
    """The word to show for a result: its stored decision, as the timing alert at its commit now stands
    (a suspected alert confirmed later is a regression; one dropped is noise)."""
    if alert_state == "info":
        return {**(stored or {}), "word": INFORMATION}
    if alert_state in ("confirmed", "acknowledged", "resolved"):
        return {**(stored or {}), "word": REGRESSED}
    if alert_state == "suspected":
        return {**(stored or {}), "word": RE_MEASURING}
    if stored is not None and stored.get("word") == RE_MEASURING:
        return {**stored, "word": WITHIN_NOISE}  # its re-measurements did not confirm it
    return stored
