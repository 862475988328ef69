"""Done-when 2 of the service issue: an engine's commits, measured where the engine is installed and posted
with `fusionwatch run --server`. The second commit, measured with `--disable BiasGeluFusion` (the seed's
regression, reproduced in both engines), raises a fusion-regression naming BiasGelu; a third commit
measured without it raises none."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from service.cli_client import CommitRef, Server, ServerError
from service.cli_measure import measure_all, results_document
from tests.service.serving import api_get, api_post, fusionwatch_command, serving

BERT = Path("tests/models/bert_torchscript_opset14.onnx")
SMALL = ["--engine", "all", "--level", "extended", "--runs", "2", "--warmup", "0", "--threads", "1",
         "--sequence-length", "16"]


def cli_env() -> dict[str, str]:
    # Read at each call: the token serving makes is in os.environ only while it serves.
    return os.environ | {"COLUMNS": "200"}


def _run(base: str, sha: str, *extra: str) -> subprocess.CompletedProcess:
    args = ["run", str(BERT), "--server", base, "--project", "onnxruntime", "--commit", sha, *SMALL, *extra]
    return subprocess.run(fusionwatch_command(*args), env=cli_env(), capture_output=True, text=True, timeout=600)


def _regressions(alerts: list[dict]) -> list[dict]:
    return [a for a in alerts if a["kind"] == "fusion-regression"]


def test_run_posts_an_engines_commits_and_the_disabled_rule_is_a_regression(tmp_path):
    with serving(tmp_path) as (base, _server):
        api_post(f"{base}/projects", json={"name": "onnxruntime"}).raise_for_status()

        first = _run(base, "e1" * 20)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "posted commit e1e1e1e1e1e1 as run 1" in first.stdout and "no alerts" in first.stdout

        second = _run(base, "e2" * 20, "--parent", "e1" * 20, "--disable", "BiasGeluFusion", "--fail-on-regression")
        assert second.returncode == 1, second.stdout + second.stderr
        [line] = [line for line in second.stdout.splitlines() if line.startswith("fusion-regression")]
        assert "BiasGeluFusion stopped firing: com.microsoft.BiasGelu 2 → 0" in line
        # The cause: the rule did not run. Measured elsewhere, so no model file to diff or cut.
        assert "Cause: BiasGeluFusion did not run at this commit (disabled); it fired 2 time(s) at the baseline." in line
        listed = api_get(f"{base}/alerts", params={"project": "onnxruntime", "kind": "fusion-regression"}).json()
        [alert] = listed["items"]  # one problem: one alert, listing both engines
        assert sorted(e["engine"] for e in alert["engines"]) == ["fusionwatch", "onnxruntime"]
        assert (alert["op"], alert["rule"], alert["commit"], alert["baseline_commit"]) == (
            "com.microsoft.BiasGelu", "BiasGeluFusion", "e2" * 20, "e1" * 20)
        assert alert["repro_url"] is None and alert["repro_error"] == "the model files were measured elsewhere and not stored"
        assert alert["cost"]["error"].startswith("the baseline's model file is not stored")

        third = _run(base, "e3" * 20, "--parent", "e2" * 20, "--json")
        assert third.returncode == 0, third.stderr
        reply = json.loads(third.stdout)
        assert _regressions(reply["alerts"]) == []
        assert {r["engine"]: r["fusions"]["com.microsoft.BiasGelu"] for r in reply["results"]} == {
            "fusionwatch": 2, "onnxruntime": 2
        }
        # BiasGelu came back: information, not a regression, and the alert is resolved.
        assert {a["engine"] for a in reply["alerts"] if a["kind"] == "fusion-change"} == {"fusionwatch", "onnxruntime"}
        assert {a["state"] for a in reply["alerts"] if a["kind"] == "fusion-change"} == {"info"}
        resolved = api_get(f"{base}/alerts/{alert['id']}").json()
        assert (resolved["state"], resolved["resolved_by"]) == ("resolved", "e3" * 20)


def test_posted_measurements_raise_the_regression_on_each_database(client):
    """The same three commits through the CLI's posting code, in-process, on SQLite and PostgreSQL."""
    assert client.post("/api/v1/projects", json={"name": "onnxruntime"}).status_code == 201
    options = (["fusionwatch", "onnxruntime"], ["extended"])
    kept = measure_all([BERT], *options, [], runs=2, warmup=0, threads=1, sequence_length=16)
    disabled = measure_all([BERT], *options, ["BiasGeluFusion"], runs=2, warmup=0, threads=1, sequence_length=16)
    assert {m.engine: m.fusions.get("com.microsoft.BiasGelu", 0) for _, m in disabled} == {
        "fusionwatch": 0, "onnxruntime": 0
    }
    server = Server(client)
    shas = ["f1" * 20, "f2" * 20, "f3" * 20]
    replies = [
        server.post_results(results_document("onnxruntime", CommitRef(sha, "main", parents), measured))
        for sha, parents, measured in ((shas[0], [], kept), (shas[1], [shas[0]], disabled), (shas[2], [shas[1]], kept))
    ]
    assert _regressions(replies[0]["alerts"]) == []
    [regression] = _regressions(replies[1]["alerts"])
    assert (regression["rule"], regression["before"], regression["after"]) == ("BiasGeluFusion", 2, 0)
    assert sorted((c["engine"], c["before"], c["after"]) for c in regression["changes"]) == [
        ("fusionwatch", 2, 0), ("onnxruntime", 2, 0)
    ]
    assert regression["cause_text"].startswith("BiasGeluFusion did not run at this commit (disabled)")
    assert _regressions(replies[2]["alerts"]) == []

    try:
        server.post_results(results_document("nope", CommitRef("f4"), kept))
    except ServerError as error:
        assert "HTTP 404: no project named 'nope'" in str(error)
    else:
        raise AssertionError("posting to an unknown project succeeded")


# Our engine clearly slower on the tiny BERT with these off: far past the 5% minimum effect.
UNFUSED = [arg for rule in ("AttentionFusion", "SkipLayerNormFusion", "BiasGeluFusion", "GeluFusion", "LayerNormFusion",
                            "MatMulAddFusion", "ConstantFolding", "CommonSubexpressionElimination",
                            "EmbedLayerNormFusion", "ReshapeFusion", "EliminateIdentity", "MatMulScaleFusion")
           for arg in ("--disable", rule)]


def test_run_pairs_each_timing_with_the_baseline_environment_block_by_block(tmp_path):
    """`--baseline-python`: the baseline's environment (here this one: the same engine versions) times
    each model in a process of its own, alternately with this one; the server decides on the pairs."""
    python = str(Path(".venv/bin/python").absolute())  # not resolved: the link is what makes it the venv
    with serving(tmp_path) as (base, _server):
        api_post(f"{base}/projects", json={"name": "onnxruntime"}).raise_for_status()
        assert _run(base, "f1" * 20).returncode == 0

        same = _run(base, "f2" * 20, "--parent", "f1" * 20, "--baseline-python", python, "--engine", "onnxruntime",
                    "--fail-on-regression", "--json")
        assert same.returncode == 0, same.stdout + same.stderr
        [result] = json.loads(same.stdout)["results"]
        assert result["baseline"]["commit"] == "f1" * 20
        assert len(result["baseline"]["execute_ms"]) == len(result["execute_ms"]) >= 6
        diff = api_get(f"{base}/commits/{'f2' * 20}/diff", params={"project": "onnxruntime"}).json()
        [entry] = diff["models"]
        assert entry["paired"]["source"] == "posted" and entry["timing"]["basis"] == "paired"
        assert entry["timing"]["word"] != "regressed"

        # Our engine with its fusions off against the baseline environment with them on: a regression.
        slower = _run(base, "f3" * 20, "--parent", "f2" * 20, "--baseline-python", python, "--engine", "fusionwatch",
                      *UNFUSED, "--fail-on-regression")
        assert slower.returncode == 1, slower.stdout + slower.stderr
        lines = [line for line in slower.stdout.splitlines() if line.startswith("timing-regression")]
        assert len(lines) == 1, slower.stdout
        [line] = lines
        assert "against baseline f2f2f2f2f2f2, the two timed alternately, posted with the result" in line
        assert "candidate / baseline = " in line and "regressed against a minimum effect of 5%" in line


def test_run_with_a_baseline_python_that_cannot_start_says_so(tmp_path):
    with serving(tmp_path) as (base, _server):
        api_post(f"{base}/projects", json={"name": "onnxruntime"}).raise_for_status()
        no_parent = _run(base, "f4" * 20, "--baseline-python", "/nonexistent/python")
        assert no_parent.returncode == 2 and "--baseline-python needs --baseline-commit" in no_parent.stderr
        missing = _run(base, "f5" * 20, "--parent", "f4" * 20, "--baseline-python", "/nonexistent/python")
        assert missing.returncode == 2
        assert "could not start the baseline's Python /nonexistent/python" in missing.stderr
