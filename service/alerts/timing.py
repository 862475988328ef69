"""The timing decision: did a result's SequentialExecutor time regress against its baseline?

A plain rule for now, kept in this one function so a statistical test can replace it: the median
rose by at least `threshold_pct`, and the rise is beyond both series' spread — the current p10
is above the baseline's p90 — so one noisy run does not raise an alert.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.stats import summarize


@dataclass(frozen=True)
class TimingVerdict:
    regressed: bool
    before_ms: float
    after_ms: float
    change_pct: float
    why: str


def decide(current: list[float], baseline: list[float], threshold_pct: float) -> TimingVerdict | None:
    now, then = summarize(current), summarize(baseline)
    if now is None or then is None or then.median <= 0:
        return None
    change = (now.median - then.median) / then.median * 100
    beyond_spread = now.p10 > then.p90
    regressed = change >= threshold_pct and beyond_spread
    if regressed:
        why = (
            f"median {then.median:.3f} → {now.median:.3f} ms (+{change:.1f}%, threshold {threshold_pct:g}%); "
            f"every run but the fastest tenth is slower than the baseline's p90 {then.p90:.3f} ms"
        )
    elif change >= threshold_pct:
        why = f"median +{change:.1f}% but within the spread (p10 {now.p10:.3f} ≤ baseline p90 {then.p90:.3f} ms)"
    else:
        why = f"median {change:+.1f}%, under the {threshold_pct:g}% threshold"
    return TimingVerdict(regressed, then.median, now.median, change, why)
