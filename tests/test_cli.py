"""The `fusionwatch` commands: the `optimize` contract other tools rely on, and `db` migrations."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from optimizer import LEVEL_NAMES
from service.adapters import migrate
from service.cli import app
from service.core.config import settings
from tests.optimizer.test_driver import mlp_model
from tests.service.db_fixtures import database_url, migrated_database_url  # noqa: F401  (fixtures: a database per test)

runner = CliRunner()


def _save(tmp_path, model, name="m.onnx"):
    import onnx

    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_json_output_has_the_contract_keys(tmp_path):
    path = _save(tmp_path, mlp_model(gelu_domain="", opset=20))
    result = runner.invoke(app, ["optimize", str(path), "--level", "extended", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("level", "nodes_before", "nodes_after", "ops_after", "fusions", "rules", "graph_hash", "near_misses"):
        assert key in data
    assert data["ops_after"] == {"MatMul": 1, "com.microsoft.BiasGelu": 1}
    assert data["fusions"] == {"com.microsoft.BiasGelu": 1}


def test_explain_lists_the_rules_near_misses(tmp_path):
    path = _save(tmp_path, mlp_model(extra_outputs=["a"]))
    result = runner.invoke(app, ["optimize", str(path), "--json", "--explain", "BiasGeluFusion", "--disable", "MatMulAddFusion"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["explain"] == [
        "BiasGeluFusion at /mlp/Gelu: intermediate value 'a' is a graph output"
    ]


def test_table_output_and_offline_file(tmp_path):
    path = _save(tmp_path, mlp_model())
    out = tmp_path / "out.onnx"
    result = runner.invoke(app, ["optimize", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "com.microsoft.BiasGelu" in result.stdout
    assert out.is_file()


def test_bad_inputs_exit_2_with_the_problem_named(tmp_path):
    missing = runner.invoke(app, ["optimize", str(tmp_path / "nope.onnx")])
    assert missing.exit_code == 2 and "no such model file" in missing.output
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not a model")
    bad = runner.invoke(app, ["optimize", str(garbage)])
    assert bad.exit_code == 2 and "garbage.onnx" in bad.output
    level = runner.invoke(app, ["optimize", str(_save(tmp_path, mlp_model())), "--level", "max"])
    assert level.exit_code == 2 and "unknown optimization level" in level.output


def test_db_upgrade_and_downgrade_move_the_configured_database(database_url, monkeypatch):  # noqa: F811
    monkeypatch.setattr(settings, "database_url", database_url)
    upgraded = runner.invoke(app, ["db", "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    head = migrate.head_revision()
    assert migrate.current_revision(database_url) == head
    assert f"is at migration {head}" in upgraded.output

    downgraded = runner.invoke(app, ["db", "downgrade", "base"])
    assert downgraded.exit_code == 0, downgraded.output
    assert migrate.current_revision(database_url) is None
    assert "is at migration none" in downgraded.output


def test_db_commands_exit_2_with_the_problem_named(database_url, monkeypatch):  # noqa: F811
    monkeypatch.setattr(settings, "database_url", database_url)
    unknown = runner.invoke(app, ["db", "upgrade", "nosuchrevision"])
    assert unknown.exit_code == 2 and "nosuchrevision" in unknown.output
    assert migrate.current_revision(database_url) is None

    monkeypatch.setattr(settings, "database_url", "postgresql+psycopg2://u@127.0.0.1:1/x")
    wrong_driver = runner.invoke(app, ["db", "upgrade"])
    assert wrong_driver.exit_code == 2 and "postgresql+psycopg://" in wrong_driver.output


def test_profile_prints_the_table_of_a_trace(tmp_path):
    import numpy as np

    import runtime

    options = runtime.SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "p"))
    session = runtime.InferenceSession(mlp_model(), options)
    for _ in range(2):
        session.run(None, {"x": np.ones((2, 8), np.float32)})
    trace = session.end_profiling()
    result = runner.invoke(app, ["profile", trace, "--skip", "1"])
    assert result.exit_code == 0, result.output
    assert "1 run(s): model_run" in result.stdout
    assert "BiasGelu" in result.stdout and "MatMul" in result.stdout
    missing = runner.invoke(app, ["profile", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "none.json" in missing.output


def test_run_json_has_both_engines_at_each_level():
    from tests.oracle import MODELS

    model = MODELS / "bert_static_dynamo_opset20.onnx"
    args = ["run", str(model), "--engine", "all", "--level", "all-levels", "--runs", "2", "--warmup", "1", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == str(model)
    pairs = [(r["engine"], r["level"]) for r in data["results"]]
    assert pairs == [(engine, level) for level in LEVEL_NAMES for engine in ("fusionwatch", "onnxruntime")]
    extended = {r["engine"]: r for r in data["results"] if r["level"] == "extended"}
    assert extended["fusionwatch"]["fusions"]["com.microsoft.BiasGelu"] == 2
    assert "com.microsoft.BiasGelu" not in extended["onnxruntime"]["fusions"]
    assert all(r["runs"] == 2 and r["execute_ms"]["median"] > 0 for r in data["results"])


def test_run_table_and_bad_inputs(tmp_path):
    from tests.oracle import MODELS

    model = MODELS / "bert_static_dynamo_opset20.onnx"
    table = runner.invoke(app, ["run", str(model), "--level", "extended", "--runs", "2", "--warmup", "1"])
    assert table.exit_code == 0, table.output
    for text in ("fusionwatch", "onnxruntime", "Attention 2", "BiasGelu 2", "Gemm 12", "Execute", "model_run"):
        assert text in table.stdout
    missing = runner.invoke(app, ["run", str(tmp_path / "nope.onnx")])
    assert missing.exit_code == 2 and "nope.onnx: no such model file" in missing.output
    engine = runner.invoke(app, ["run", str(model), "--engine", "tvm"])
    assert engine.exit_code == 2 and "unknown engine 'tvm'" in engine.output
    level = runner.invoke(app, ["run", str(model), "--level", "max"])
    assert level.exit_code == 2 and "unknown optimization level 'max'" in level.output


def test_run_disable_reaches_both_engines_and_takes_several_models(tmp_path):
    first = _save(tmp_path, mlp_model(), "first.onnx")
    second = _save(tmp_path, mlp_model(), "second.onnx")
    # Without MatMulAddFusion, whose Gemm would take the Add BiasGelu needs.
    args = ["run", str(first), str(second), "--level", "extended", "--runs", "1", "--warmup", "0", "--json",
            "--disable", "MatMulAddFusion"]
    kept = json.loads(runner.invoke(app, args).stdout)
    assert [entry["model"] for entry in kept["models"]] == [str(first), str(second)]
    assert all(r["fusions"].get("com.microsoft.BiasGelu") == 1 for e in kept["models"] for r in e["results"])
    disabled = runner.invoke(app, [*args[:2], *args[3:], "--disable", "BiasGeluFusion"])
    assert disabled.exit_code == 0, disabled.output
    data = json.loads(disabled.stdout)
    assert data["model"] == str(first)
    assert {r["engine"]: r["fusions"].get("com.microsoft.BiasGelu", 0) for r in data["results"]} == {
        "fusionwatch": 0, "onnxruntime": 0
    }


def test_run_server_options_go_together(tmp_path):
    path = str(_save(tmp_path, mlp_model()))
    orphan = runner.invoke(app, ["run", path, "--commit", "abc"])
    assert orphan.exit_code == 2 and "--project, --commit and --fail-on-regression need --server" in orphan.output
    incomplete = runner.invoke(app, ["run", path, "--server", "http://127.0.0.1:9", "--project", "p"])
    # Outside CI nothing names the commit; in GitHub Actions or GitLab CI its variables would.
    assert incomplete.exit_code == 2 and "--commit is needed outside GitHub Actions and GitLab CI" in incomplete.output
    bad_url = runner.invoke(app, ["submit", path, "--server", "127.0.0.1:9", "--project", "p", "--commit", "a"])
    assert bad_url.exit_code == 2 and "expected an http:// or https:// URL" in bad_url.output


def test_analyze_reports_every_level_and_engine_with_the_near_misses(tmp_path):
    path = _save(tmp_path, mlp_model(extra_outputs=["a"]))
    args = ["analyze", str(path), "--runs", "2", "--warmup", "0", "--disable", "MatMulAddFusion"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(r["engine"], r["level"]) for r in data["results"]] == [
        (engine, level) for level in LEVEL_NAMES for engine in ("fusionwatch", "onnxruntime")
    ]
    assert all(r["numeric_ok"] and r["execute_median_ms"] > 0 and len(r["execute_ms"]) == 2 for r in data["results"])
    extended = next(r for r in data["results"] if r["level"] == "extended" and r["engine"] == "fusionwatch")
    assert "intermediate value 'a' is a graph output" in [m["reason"] for m in extended["near_misses"]]

    table = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "Near misses" in table.stdout and "intermediate value 'a' is a graph output" in table.stdout
    assert "max abs err" in table.stdout
    missing = runner.invoke(app, ["analyze", str(tmp_path / "nope.onnx")])
    assert missing.exit_code == 2 and "nope.onnx" in missing.output and "no such model file" in missing.output


def test_server_text_is_printed_as_is_not_as_rich_markup():
    from rich.console import Console

    from service.cli_client import print_alerts

    console = Console(record=True, width=200)
    message = "Reshape [/model/Reshape] target [1, -1] has [bold]two[/bold] -1s"
    print_alerts(console, [{"kind": "fusion-regression", "message": message}])
    assert console.export_text().strip() == f"fusion-regression {message}"


def test_a_paired_verdict_shows_its_own_change_and_the_job_medians_only_as_context():
    from rich.console import Console

    from service.cli_client import print_diff

    def entry(model, change_pct, timing):
        return {"model": model, "engine": "fusionwatch", "level": "extended", "baseline_commit": "a" * 40,
                "fusions": {}, "median_ms": {"before": 6.236, "after": 4.383, "change_pct": change_pct}, "timing": timing}

    paired = {"word": "within noise", "basis": "paired", "change_pct": -2.4,
              "statistic": "candidate / baseline 0.976 [0.95, 1.01] over 8 pairs"}
    window = {"word": "within noise", "basis": "window", "statistic": "fastest run +1.0% against the window (bar ±5.0%)"}
    console = Console(record=True, width=240)
    print_diff(console, {"commit": "b" * 40, "branch": "main", "models": [entry("bert", -29.7, paired)]})
    text = console.export_text()
    row = next(line for line in text.splitlines() if "bert" in line)
    # The verdict, then its own change, then the medians marked as context; the medians' -29.7% nowhere.
    assert row.index("within noise") < row.index("-2.4%") < row.index("6.236 → 4.383*")
    assert "29.7" not in text and "* each job's own median, measured at other moments" in text
    console = Console(record=True, width=240)
    print_diff(console, {"commit": "b" * 40, "branch": "main", "models": [entry("bert", 1.2, window)]})
    text = console.export_text()
    assert "+1.2%" in text and "*" not in text  # the window's verdict and the medians come from the same jobs


def test_an_exports_own_op_and_the_fused_op_of_the_same_name_keep_their_domains():
    from rich.console import Console

    from service.cli_client import print_diff

    # An opset-23 export writes ONNX's own Attention, where the opset-20 one was fused into onnxruntime's.
    fusions = {"com.microsoft.Attention": {"before": 2, "after": 0}, "Attention": {"before": 0, "after": 2},
               "com.microsoft.BiasGelu": {"before": 2, "after": 2}}
    console = Console(record=True, width=220)
    print_diff(console, {"commit": "b" * 40, "branch": "main", "models": [
        {"model": "bert", "engine": "fusionwatch", "level": "extended", "baseline_commit": "a" * 40, "fusions": fusions,
         "median_ms": {"before": 0.3, "after": 0.5, "change_pct": 66.7}, "timing": None}]})
    text = console.export_text()
    assert "com.microsoft.Attention 2 → 0" in text and "ai.onnx.Attention 0 → 2" in text and "BiasGelu 2" in text

def test_serve_refuses_custom_ops_it_cannot_import(migrated_database_url, monkeypatch):  # noqa: F811
    monkeypatch.setattr(settings, "database_url", migrated_database_url)
    monkeypatch.setattr(settings, "custom_ops", "no_such_module_for_fusionwatch")
    result = runner.invoke(app, ["serve", "--port", "1"])
    assert result.exit_code == 2
    assert "custom-op module 'no_such_module_for_fusionwatch' (FUSIONWATCH_CUSTOM_OPS) cannot be imported" in result.output
