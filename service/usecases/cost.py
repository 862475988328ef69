"""What a lost fusion costs: the baseline's model timed with the lost rule enabled and disabled.

Measured on the baseline's stored model file, by the engine and at the level that lost the op, with
the project's protocol (runs, warm-up, threads, sequence length): our engine disables the rule by
name, onnxruntime through `disabled_optimizers`, which takes the same names. The difference of the
fastest runs is what the fusion was worth on this model — "BiasGelu was worth 0.42 ms of this
model's 1.38 ms" — measured once, when the alert is raised; a difference inside the runs' spread is
said to be noise rather than given as a worth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.adapters.engines import EngineError, run_engine
from service.domain.protocol import Protocol


def lost_fusion_cost(op: str, rule: str, engine: str, level: str, baseline_file: Path, protocol: Protocol) -> dict[str, Any]:
    """{"with_ms", "without_ms", "worth_ms", "text", ...}, or {"error"} where either run failed."""
    settings = dict(runs=protocol.runs, warmup=protocol.warmup, threads=protocol.threads,
                    sequence_length=protocol.sequence_length)
    try:
        kept = run_engine(engine, baseline_file, level, **settings)
        lost = run_engine(engine, baseline_file, level, disabled=[rule], **settings)
    except EngineError as error:
        return {"error": f"could not time the baseline with and without {rule}: {error}"}
    # The fastest runs: what load on the machine adds only ever slows a run down.
    with_ms, without_ms = kept.execute_ms.min, lost.execute_ms.min
    noise = max(kept.execute_ms.max - kept.execute_ms.min, lost.execute_ms.max - lost.execute_ms.min)
    worth = without_ms - with_ms
    name = op.rsplit(".", 1)[-1]
    how = f"{engine} {level}, fastest Execute of {kept.runs} runs of the baseline with and without {rule}"
    if worth > noise:
        text = f"{name} was worth {worth:.2f} ms of this model's {with_ms:.2f} ms ({how})"
    else:
        text = (f"{name}'s worth could not be told from noise: {with_ms:.2f} ms with it, {without_ms:.2f} ms "
                f"without, runs varying by {noise:.2f} ms ({how})")
    return {
        "rule": rule, "engine": engine, "level": level, "runs": kept.runs, "with_ms": round(with_ms, 4),
        "without_ms": round(without_ms, 4), "worth_ms": round(worth, 4), "noise_ms": round(noise, 4),
        "text": text,
    }
