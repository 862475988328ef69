"""An engine's CI step, `fusionwatch run --server` in GitHub Actions: the commit comes from GITHUB_SHA and the
push event, and the verdict goes to the loopback GitHub as a check run — success for the first push, failure
naming BiasGelu for a push measured with BiasGeluFusion disabled; a GitHub that refuses every write is a warning,
and the step's exit code stays the verdict's."""

from __future__ import annotations

import json
import os
import subprocess

from tests.ci.loopback_forges import TOKEN, Behaviour, LoopbackForge, loopback_github
from tests.service.serving import api_post, fusionwatch_command, serving

BERT = "tests/models/bert_torchscript_opset14.onnx"
SMALL = ["--engine", "fusionwatch", "--level", "extended", "--runs", "2", "--warmup", "0", "--threads", "1",
         "--sequence-length", "16"]


def _run(base: str, api: str, tmp_path, sha: str, before: str, *extra: str) -> subprocess.CompletedProcess:
    event = tmp_path / f"{sha[:6]}.json"
    event.write_text(json.dumps({"before": before, "head_commit": {"message": f"engine {sha[:6]}"}}))
    env = os.environ | {"GITHUB_ACTIONS": "true", "GITHUB_API_URL": api, "GITHUB_REPOSITORY": "org/engine",
                        "GITHUB_SHA": sha, "GITHUB_TOKEN": TOKEN, "GITHUB_EVENT_NAME": "push",
                        "GITHUB_EVENT_PATH": str(event), "GITHUB_REF_NAME": "main", "COLUMNS": "200"}
    args = ["run", BERT, "--server", base, "--project", "engine", *SMALL, "--fail-on-regression", *extra]
    return subprocess.run(fusionwatch_command(*args), env=env, capture_output=True, text=True, timeout=600)


def test_run_server_reports_an_engine_commit_as_a_check_run(tmp_path):
    forge = LoopbackForge()
    first_sha, second_sha, third_sha = "a7" * 20, "b8" * 20, "c9" * 20
    with serving(tmp_path) as (base, _server), loopback_github(forge) as github:
        api_post(f"{base}/projects", json={"name": "engine", "kind": "engine"}).raise_for_status()
        first = _run(base, github.url, tmp_path, first_sha, "0" * 40)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"posted commit {first_sha[:12]}" in first.stdout
        second = _run(base, github.url, tmp_path, second_sha, first_sha, "--disable", "BiasGeluFusion")
        assert second.returncode == 1, second.stdout + second.stderr
        by_sha = {run["head_sha"]: run for run in forge.check_runs.values()}
        assert by_sha[first_sha]["conclusion"] == "success"
        assert by_sha[second_sha]["conclusion"] == "failure"
        assert "| BiasGelu | 2 → 0 | BiasGeluFusion stopped firing" in by_sha[second_sha]["output"]["summary"]

        forge.behaviour = Behaviour(read_only=True)
        third = _run(base, github.url, tmp_path, third_sha, second_sha)
        assert third.returncode == 0, third.stdout + third.stderr  # the verdict's code: reporting failed, no more
        assert "warning:" in third.stderr and "Resource not accessible by integration" in third.stderr
    assert forge.problems == []
