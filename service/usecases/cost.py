"""What a lost fusion costs: the baseline's model timed with the lost rule enabled and disabled.

Measured on the baseline's stored model file, by the engine and at the level that lost the op, with
the project's protocol (warm-up, threads, sequence length): our engine disables the rule by name,
onnxruntime through `disabled_optimizers`, which takes the same names. The two sessions are timed
alternately in one job, as a paired timing is (service/adapters/paired_measure.py), and decided the same
way (service/domain/paired.py) — "BiasGelu was worth 0.42 ms of this model's 1.38 ms: without it a run
takes 1.30× as long [1.28, 1.33] over 8 paired blocks" — measured once, when the alert is raised. A
shared machine's slow moments fall on both sides of a pair, so a fusion's worth is told from noise where
two separately timed runs (the range of their runs, one slow run wide) could not tell it.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median_high
from typing import Any

from service.adapters.engines import EngineError
from service.adapters.paired_measure import CannotPair, measure_rule_worth
from service.domain import paired
from service.domain.protocol import Protocol


def lost_fusion_cost(op: str, rule: str, engine: str, level: str, baseline_file: Path, protocol: Protocol) -> dict[str, Any]:
    """{"with_ms", "without_ms", "worth_ms", "ratio", "low", "high", "word", "text", ...}, or {"error"}
    where either session failed."""
    try:
        timing = measure_rule_worth(baseline_file, engine, level, rule, protocol)
    except (EngineError, CannotPair) as error:
        return {"error": f"could not time the baseline with and without {rule}: {error}"}
    verdict = timing.verdict
    # Each block's level is its fastest run; the medians of the blocks are each side's time.
    with_ms, without_ms = median_high(timing.baseline_ms), median_high(timing.candidate_ms)
    worth = without_ms - with_ms
    name = op.rsplit(".", 1)[-1]
    how = (f"{engine} {level}, the baseline timed with and without {rule} alternately, "
           f"{verdict.pairs} paired blocks, {verdict.confidence:.0%} interval")
    # A job whose budget ended before 6 pairs has no interval (its high is infinite, which JSON cannot hold).
    bounds = verdict.to_dict()
    interval = (f"[{bounds['low']:.2f}, {bounds['high']:.2f}]" if bounds["high"] is not None
                else "(too few pairs for an interval)")
    times = f"{verdict.ratio:.2f}× as long {interval}"
    if verdict.word == paired.REGRESSED:
        text = f"{name} was worth {worth:.2f} ms of this model's {with_ms:.2f} ms: without it a run takes {times} ({how})"
    elif verdict.word == paired.IMPROVED:
        text = f"{name} cost time: without it a run takes {times} ({how})"
    elif verdict.word == paired.WITHIN_NOISE:
        text = (f"{name} was worth less than {verdict.min_effect_pct:g}% of this model's {with_ms:.2f} ms: "
                f"without it a run takes {times} ({how})")
    else:
        text = f"{name}'s worth could not be told from noise: without it a run takes {times} ({how})"
    return {
        "rule": rule, "engine": engine, "level": level, "pairs": verdict.pairs, "with_ms": round(with_ms, 4),
        "without_ms": round(without_ms, 4), "worth_ms": round(worth, 4), "word": verdict.word,
        "ratio": round(verdict.ratio, 4), "low": _rounded(bounds["low"]), "high": _rounded(bounds["high"]),
        "machine_s": round(timing.machine_s, 3), "text": text,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
