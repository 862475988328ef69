"""bench/optimize_time.py: our optimize() next to onnxruntime's session creation, per model and level."""

from __future__ import annotations

from pathlib import Path

from bench import optimize_time

FIXTURE = Path(__file__).resolve().parents[1] / "models" / "bert_dynamo_opset20.onnx"


def test_each_row_times_both_engines_and_names_the_rules_that_ran(monkeypatch, capsys):
    monkeypatch.setattr(optimize_time, "model_path", lambda name: FIXTURE)
    rows = optimize_time.run(levels=["disabled", "all"], repeats=1, models=["bert_tiny"], rules=3)
    assert [(row["model"], row["level"]) for row in rows] == [("bert_tiny", "disabled"), ("bert_tiny", "all")]
    for row in rows:
        assert row["optimize_ms"] > 0 and row["ort_session_ms"] > 0
        assert row["ratio"] == row["optimize_ms"] / row["ort_session_ms"]
    assert rows[0]["rules_ms"] == {}  # disabled runs no rule
    assert {"ConstantFolding", "AttentionFusion"} <= set(rows[1]["rules_ms"])
    printed = capsys.readouterr().out
    # Which rules are the costliest depends on the machine's load: the printed ones are the top of the row's.
    costliest = max(rows[1]["rules_ms"], key=rows[1]["rules_ms"].get)
    assert "CPU " in printed and costliest in printed and "outside the rules" in printed
