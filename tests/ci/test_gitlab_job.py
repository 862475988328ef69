"""The GitLab CI job's own script (ci/fusionwatch.gitlab-ci.yml), run as a runner runs it — its variables
and GitLab's predefined ones in the environment, `sh -e` — against a real `fusionwatch serve` and a loopback
GitLab that checks the requests' shapes: the default branch's pipeline sets a success commit status, a
merge request whose head loses BiasGelu a failed status and one note naming it with its cause, and the
merge request's next pipeline edits that note. The job's exit code is the verdict's.

The image and `pip install` (before_script) are GitLab's and pip's; `fusionwatch` here is this checkout's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import onnx
import yaml

from tests.ci.loopback_forges import GITLAB_TOKEN, LoopbackForge, loopback_gitlab
from tests.ci.test_action import BERT, PLUGIN, ROOT, SETTINGS, fusionwatch_on_path
from tests.service.custom_op_plugin import insert_before_gelu
from tests.service.serving import api_post, serving

MAIN, HEAD_1, HEAD_2 = "4d" * 20, "5e" * 20, "6f" * 20


def run_job(job: dict, variables: dict[str, str], workspace: Path) -> subprocess.CompletedProcess:
    script = "\n".join(job["script"])
    return subprocess.run(["sh", "-e", "-c", script], cwd=workspace, env=os.environ | job["variables"] | variables,
                          capture_output=True, text=True, timeout=600)


def predefined(api: str, path: str, sha: str, merge_request: bool) -> dict[str, str]:
    env = {"GITLAB_CI": "true", "CI": "true", "CI_API_V4_URL": f"{api}/api/v4", "CI_PROJECT_ID": "42",
           "CI_PROJECT_URL": "https://gitlab.example.com/org/bert-exports", "CI_COMMIT_SHA": sha,
           "CI_COMMIT_BEFORE_SHA": "0" * 40, "CI_COMMIT_MESSAGE": "BERT export", "CI_DEFAULT_BRANCH": "main",
           "PATH": path, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "FUSIONWATCH_GITLAB_TOKEN": GITLAB_TOKEN}
    if merge_request:
        return env | {"CI_PIPELINE_SOURCE": "merge_request_event", "CI_COMMIT_REF_NAME": "custom-gelu",
                      "CI_MERGE_REQUEST_IID": "5", "CI_MERGE_REQUEST_SOURCE_BRANCH_SHA": sha,
                      "CI_MERGE_REQUEST_DIFF_BASE_SHA": MAIN, "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "custom-gelu",
                      "CI_MERGE_REQUEST_TITLE": "Custom op before GELU"}
    return env | {"CI_PIPELINE_SOURCE": "push", "CI_COMMIT_BRANCH": "main", "CI_COMMIT_REF_NAME": "main"}


def test_the_gitlab_job_reports_the_default_branch_and_a_merge_request_that_loses_bias_gelu(tmp_path):
    job = yaml.safe_load((ROOT / "ci/fusionwatch.gitlab-ci.yml").read_text())[".fusionwatch"]
    workspace = tmp_path / "workspace"
    (workspace / "models").mkdir(parents=True)
    export = workspace / "models" / "bert.onnx"
    onnx.save(onnx.load(BERT), export)
    path = fusionwatch_on_path(tmp_path)
    forge = LoopbackForge()
    with serving(tmp_path, None, FUSIONWATCH_CUSTOM_OPS=PLUGIN) as (base, _server), loopback_gitlab(forge) as gitlab:
        assert api_post(f"{base}/projects", json={"name": "bert-exports", "settings": SETTINGS}).status_code == 201
        variables = {"FUSIONWATCH_SERVER": base.removesuffix("/api/v1"), "FUSIONWATCH_PROJECT": "bert-exports"}

        first = run_job(job, variables | predefined(gitlab.url, path, MAIN, merge_request=False), workspace)
        assert first.returncode == 0, first.stdout + first.stderr
        assert [(s["sha"], s["state"]) for s in forge.statuses] == [(MAIN, "success")]
        assert forge.comments == {}

        onnx.save(insert_before_gelu(onnx.load(BERT)), export)
        second = run_job(job, variables | predefined(gitlab.url, path, HEAD_1, merge_request=True), workspace)
        assert second.returncode == 1, second.stdout + second.stderr
        assert forge.statuses[-1]["sha"] == HEAD_1 and forge.statuses[-1]["state"] == "failed"
        (note,) = forge.comments.values()
        assert note["issue"] == 5
        lost = [line for line in note["body"].splitlines() if "| BiasGelu | 2 → 0 |" in line]
        assert len(lost) == 2 and all("Passthrough" in line for line in lost), note["body"]

        third = run_job(job, variables | predefined(gitlab.url, path, HEAD_2, merge_request=True), workspace)
        assert third.returncode == 1, third.stdout + third.stderr
        assert len(forge.comments) == 1 and HEAD_2[:12] in next(iter(forge.comments.values()))["body"]
        assert [r.method for r in forge.writes() if "/notes" in r.path] == ["POST", "PUT"]
    assert forge.problems == []
