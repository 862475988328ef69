"""bench/level_savings.py: six sessions timed in turn, each engine's level ratios from its own times."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import level_savings
from bench.small import fastest_alternating, fastest_interleaved

FIXTURE = Path(__file__).resolve().parents[1] / "models" / "bert_torchscript_opset17.onnx"


def test_a_row_has_both_engines_at_each_level_and_their_ratios():
    row = level_savings.measure(FIXTURE, seq=8, blocks=1, runs=1)
    for level in level_savings.LEVELS:
        assert row[f"ours_{level}_ms"] > 0 and row[f"ort_{level}_ms"] > 0
        assert row[f"max_abs_error_{level}"] < 1e-4  # ours computes what onnxruntime does, fused or not
    for engine in ("ours", "ort"):
        assert row[f"{engine}_extended_over_disabled"] == pytest.approx(
            row[f"{engine}_extended_ms"] / row[f"{engine}_disabled_ms"]
        )


def test_interleaved_timing_keeps_each_calls_fastest_run():
    calls = []
    times = fastest_interleaved([lambda: calls.append("a"), lambda: calls.append("b")], blocks=2, runs=3)
    assert len(times) == 2 and all(t >= 0 for t in times)
    assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3  # one warm-up each, then turns
    assert len(fastest_alternating(lambda: None, lambda: None, blocks=1, runs=1)) == 2
