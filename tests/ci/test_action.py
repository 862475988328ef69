"""Done-when: the Action's own submit step, run as GitHub Actions runs it (its `env:` with the inputs filled
in, the standard GITHUB_* variables, `bash -e`), against a real `fusionwatch serve` and a loopback GitHub that
checks the requests' shapes. A push to main gets a success check run; a pull request whose head loses
BiasGelu a failure check run naming the lost op and its cause, one comment naming BiasGelu, and on the
pull request's next push the same comment edited, not a second one. The step's exit code is the verdict's.

setup-python and `pip install` (the Action's first two steps) are GitHub's and pip's; `fusionwatch` here is
this checkout's."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import onnx
import yaml

from tests.ci.loopback_forges import TOKEN, LoopbackForge, loopback_github
from tests.service.custom_op_plugin import insert_before_gelu
from tests.service.serving import api_post, serving

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "tests/models/bert_torchscript_opset14.onnx"
PLUGIN = "tests.service.custom_op_plugin"
SETTINGS = {"runs": 2, "warmup": 0, "levels": ["disabled", "extended"], "threads": 1, "sequence_length": 16}
MAIN, HEAD_1, HEAD_2 = "1a" * 20, "2b" * 20, "3c" * 20
EXPRESSION = re.compile(r"\$\{\{\s*inputs\.([A-Za-z0-9_-]+)\s*\}\}")


def submit_step() -> dict:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    (step,) = [s for s in action["runs"]["steps"] if "fusionwatch submit" in s.get("run", "") or
               "fusionwatch \"${args[@]}\"" in s.get("run", "")]
    return step


def run_step(step: dict, inputs: dict[str, str], environment: dict[str, str], workspace: Path) -> subprocess.CompletedProcess:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    values = {name: spec.get("default", "") for name, spec in action["inputs"].items()} | inputs
    env = {key: EXPRESSION.sub(lambda m: values[m.group(1)], str(value)) for key, value in step["env"].items()}
    script = workspace / "step.sh"
    script.write_text(step["run"])
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workspace,
                          env=os.environ | environment | env, capture_output=True, text=True, timeout=600)


def fusionwatch_on_path(tmp_path: Path) -> str:
    """`fusionwatch` as pip would install it, running this checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "fusionwatch"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m service.cli \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return f"{bin_dir}:{os.environ['PATH']}"


def actions_environment(api_url: str, event: Path, event_name: str, sha: str, ref_name: str, path: str,
                        head_ref: str = "", base_ref: str = "") -> dict[str, str]:
    return {"GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_API_URL": api_url, "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "org/bert-exports", "GITHUB_SHA": sha, "GITHUB_EVENT_NAME": event_name,
            "GITHUB_EVENT_PATH": str(event), "GITHUB_REF_NAME": ref_name, "GITHUB_HEAD_REF": head_ref,
            "GITHUB_BASE_REF": base_ref, "PATH": path, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def pull_request_event(path: Path, head: str) -> Path:
    path.write_text(json.dumps({"action": "synchronize", "number": 7, "pull_request": {
        "number": 7, "title": "Insert a custom op before the MLP's GELU",
        "base": {"sha": MAIN, "ref": "main", "repo": {"full_name": "org/bert-exports"}},
        "head": {"sha": head, "ref": "custom-gelu", "repo": {"full_name": "org/bert-exports"}}}}))
    return path


def test_the_actions_step_reports_a_push_and_a_pull_request_that_loses_bias_gelu(tmp_path):
    workspace = tmp_path / "workspace"
    (workspace / "models").mkdir(parents=True)
    export = workspace / "models" / "bert.onnx"
    onnx.save(onnx.load(BERT), export)
    path = fusionwatch_on_path(tmp_path)
    step = submit_step()
    forge = LoopbackForge()
    forge.merge_bases[(MAIN, HEAD_1)] = MAIN
    forge.merge_bases[(MAIN, HEAD_2)] = MAIN
    with serving(tmp_path, None, FUSIONWATCH_CUSTOM_OPS=PLUGIN) as (base, _server), loopback_github(forge) as github:
        created = api_post(f"{base}/projects", json={"name": "bert-exports", "settings": SETTINGS})
        assert created.status_code == 201, created.text
        inputs = {"server": base.removesuffix("/api/v1"), "project": "bert-exports", "models": "models/*.onnx",
                  "token": os.environ["FUSIONWATCH_TOKEN"], "github-token": TOKEN}

        push = tmp_path / "push.json"
        push.write_text(json.dumps({"ref": "refs/heads/main", "before": "0" * 40, "after": MAIN,
                                    "head_commit": {"id": MAIN, "message": "BERT export"}}))
        first = run_step(step, inputs, actions_environment(github.url, push, "push", MAIN, "main", path), workspace)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "verdict: ok" in first.stdout
        (check,) = forge.check_runs.values()
        assert check["head_sha"] == MAIN and check["status"] == "completed" and check["conclusion"] == "success"
        assert forge.comments == {}  # not a pull request

        onnx.save(insert_before_gelu(onnx.load(BERT)), export)
        event = pull_request_event(tmp_path / "pr1.json", HEAD_1)
        pr_env = actions_environment(github.url, event, "pull_request", "9" * 40, "7/merge", path, "custom-gelu", "main")
        second = run_step(step, inputs, pr_env, workspace)
        assert second.returncode == 1, second.stdout + second.stderr  # --fail-on-regression: the verdict's code
        assert "verdict: regression" in second.stdout
        failed = [c for c in forge.check_runs.values() if c["head_sha"] == HEAD_1]
        assert len(failed) == 1 and failed[0]["conclusion"] == "failure"
        summary = failed[0]["output"]["summary"]
        lost_rows = [line for line in summary.splitlines() if "| BiasGelu | 2 → 0 |" in line]
        assert len(lost_rows) == 2, summary  # both engines at level extended
        assert all("BiasGeluFusion stopped firing" in row and "Passthrough" in row for row in lost_rows), summary
        assert "BiasGelu" in failed[0]["output"]["title"]
        (comment,) = forge.comments.values()
        assert comment["issue"] == 7 and "BiasGelu" in comment["body"]
        # The head was recorded with its merge base as parent: the baseline is main's measurement.
        assert f"against baseline {MAIN[:12]}" in second.stdout or MAIN[:12] in second.stdout

        third = run_step(step, inputs, pr_env | {"GITHUB_EVENT_PATH": str(pull_request_event(tmp_path / "pr2.json", HEAD_2))},
                         workspace)
        assert third.returncode == 1, third.stdout + third.stderr
        assert len(forge.comments) == 1, forge.comments  # edited, not duplicated
        comment_writes = [r.method for r in forge.writes() if "/comments" in r.path]
        assert comment_writes == ["POST", "PATCH"]
        assert HEAD_2[:12] in next(iter(forge.comments.values()))["body"]
        assert {c["head_sha"] for c in forge.check_runs.values()} == {MAIN, HEAD_1, HEAD_2}
    assert forge.problems == []
