"""The GitHub reporter against a loopback GitHub that checks request shapes: the check run and its
conclusion, the fallback to a commit status, the pull-request comment found again by its marker, a fork's
read-only token, Retry-After and a timeout. The run and diff are the server's JSON shapes."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from service.ci.environment import github_context
from service.ci.forge_http import ForgeError
from service.ci.github import GitHubReporter, comment_marker
from service.ci.report import ci_step
from service.ci.summary import Links, summarize
from tests.ci.loopback_forges import TOKEN, Behaviour, LoopbackForge, loopback_github

BASE, HEAD, MERGE_BASE = "a" * 40, "b" * 40, "c" * 40
LINKS = Links("https://github.com/org/models/commit/" + HEAD, "http://fw/projects/p/commits/" + HEAD, "http://fw/api/v1/runs/2")


def run_and_diff(lost: bool) -> tuple[dict, dict]:
    after = 0 if lost else 2
    alerts = [{
        "kind": "fusion-regression", "state": "open", "model": "bert.onnx", "engine": "native", "level": "extended",
        "changes": [{"op": "com.microsoft.BiasGelu", "rule": "BiasGeluFusion", "before": 2, "after": 0}],
        "near_misses": [{"rule": "BiasGeluFusion", "anchor": "Add_7",
                         "reason": "consumer of Add_7 is ai.onnx.contrib.Passthrough, not Gelu"}],
        "message": "BiasGeluFusion stopped firing",
    }] if lost else []
    run = {"id": 2, "verdict": "regression" if lost else "ok", "alerts": alerts,
           "jobs": [{"id": 1, "model": "bert.onnx", "engine": "native", "level": "extended", "state": "done", "error": None}]}
    diff = {"commit": HEAD, "branch": "feature", "models": [{
        "model": "bert.onnx", "engine": "native", "level": "extended", "baseline_commit": MERGE_BASE,
        "fusions": {"com.microsoft.BiasGelu": {"before": 2, "after": after}, "com.microsoft.Attention": {"before": 1, "after": 1}},
        "median_ms": {"before": 10.0, "after": 10.4, "change_pct": 4.0, "p10": 10.1, "p90": 10.9},
    }]}
    return run, diff


def environment(tmp_path, api_url: str, event_name: str = "pull_request", **extra: str) -> dict[str, str]:
    event = tmp_path / "event.json"
    if event_name == "pull_request":
        event.write_text(json.dumps({"pull_request": {
            "number": 7, "title": "Swap the MLP's activation",
            "base": {"sha": BASE, "ref": "main"},
            "head": {"sha": HEAD, "ref": "feature", "repo": {"full_name": extra.pop("head_repo", "org/models")}}}}))
    else:
        event.write_text(json.dumps({"before": "0" * 40, "head_commit": {"message": "export A"}}))
    return {"GITHUB_ACTIONS": "true", "GITHUB_API_URL": api_url, "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "org/models", "GITHUB_SHA": "d" * 40, "GITHUB_TOKEN": TOKEN,
            "GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": str(event), "GITHUB_REF_NAME": "7/merge",
            "GITHUB_HEAD_REF": "feature", "GITHUB_BASE_REF": "main"} | extra


def test_a_pull_request_gets_a_failing_check_run_and_one_comment_edited_on_the_next_push(tmp_path):
    forge = LoopbackForge()
    forge.merge_bases[(BASE, HEAD)] = MERGE_BASE
    with loopback_github(forge) as github:
        context = github_context(environment(tmp_path, github.url))
        assert context.sha == HEAD and context.branch == "feature" and context.pull_request.number == 7
        reporter = GitHubReporter(context, "bert-exports")
        assert reporter.merge_base() == MERGE_BASE
        summary = summarize("bert-exports", *run_and_diff(lost=True), LINKS)
        done = reporter.report(summary, LINKS.dashboard)
        assert done[0].startswith("check run") and "failure" in done[0]
        assert "comment" in done[1] and "posted" in done[1]
        (check,) = forge.check_runs.values()
        assert check["head_sha"] == HEAD and check["conclusion"] == "failure" and check["status"] == "completed"
        assert "| bert.onnx | native | extended | BiasGelu | 2 → 0 | BiasGeluFusion stopped firing: " in check["output"]["summary"]
        assert "ai.onnx.contrib.Passthrough" in check["output"]["summary"]
        assert "| 10.000 | 10.400 | +4.0% | 10.100–10.900 | no timing alert |" in check["output"]["summary"]
        assert LINKS.commit in check["output"]["summary"]
        (comment,) = forge.comments.values()
        assert comment["issue"] == 7 and comment["body"].startswith(comment_marker("bert-exports"))

        # The next push: a new reporter (a new workflow run) finds the comment and edits it in place.
        fixed = GitHubReporter(context, "bert-exports")
        fixed.report(summarize("bert-exports", *run_and_diff(lost=False), LINKS), LINKS.dashboard)
        assert len(forge.comments) == 1
        assert "unchanged" in next(iter(forge.comments.values()))["body"]
        assert [r.method for r in forge.requests if "/comments" in r.path].count("PATCH") == 1
    assert forge.problems == []


def test_nothing_changed_posts_no_comment(tmp_path):
    forge = LoopbackForge()
    with loopback_github(forge) as github:
        reporter = GitHubReporter(github_context(environment(tmp_path, github.url)), "p")
        done = reporter.report(summarize("p", *run_and_diff(lost=False), LINKS), LINKS.dashboard)
    assert len(done) == 1 and forge.comments == {}
    assert next(iter(forge.check_runs.values()))["conclusion"] == "success"
    assert forge.problems == []


def test_a_token_without_checks_write_falls_back_to_a_commit_status(tmp_path):
    forge = LoopbackForge(Behaviour(refuse_check_runs=True))
    with loopback_github(forge) as github:
        reporter = GitHubReporter(github_context(environment(tmp_path, github.url, "push")), "p")
        summary = summarize("p", *run_and_diff(lost=True), LINKS)
        done = reporter.report(summary, LINKS.dashboard)
    assert forge.check_runs == {} and done == ["commit status failure (the token may not create check runs)"]
    (status,) = forge.statuses
    assert status["sha"] == "d" * 40 and status["state"] == "failure" and status["context"] == "fusionwatch/p"
    assert "BiasGelu" in status["description"] and status["target_url"] == LINKS.dashboard
    assert forge.problems == []


def test_a_forks_read_only_token_is_a_warning_and_the_retry_after_is_honoured(tmp_path, capsys):
    forge = LoopbackForge(Behaviour(read_only=True))
    with loopback_github(forge) as github:
        env = environment(tmp_path, github.url, head_repo="someone/models")
        step = ci_step("p", Console(stderr=True, width=300), environ=env)
        assert step.context.pull_request.from_fork
        step.report("http://fw", *run_and_diff(lost=True))  # raises nothing: a warning
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "Resource not accessible by integration" in captured.err
    assert "fork" in captured.err
    assert captured.out.startswith("::warning title=fusionwatch::")

    limited = LoopbackForge(Behaviour(rate_limit_first_write=True))
    with loopback_github(limited) as github:
        reporter = GitHubReporter(github_context(environment(tmp_path, github.url, "push")), "p")
        reporter.report(summarize("p", *run_and_diff(lost=False), LINKS), LINKS.dashboard)
    assert [r.method for r in limited.requests].count("POST") == 2 and len(limited.check_runs) == 1


def test_a_hanging_github_is_a_timeout_named_in_the_error(tmp_path):
    forge = LoopbackForge(Behaviour(hang_s=1.5))
    with loopback_github(forge) as github:
        reporter = GitHubReporter(github_context(environment(tmp_path, github.url, "push")), "p", timeout_s=0.3)
        with pytest.raises(ForgeError, match=r"POST /repos/org/models/check-runs timed out after 0.3 s"):
            reporter.report(summarize("p", *run_and_diff(lost=False), LINKS), LINKS.dashboard)


def test_the_event_payload_sets_the_commit_and_its_baseline(tmp_path):
    push = github_context(environment(tmp_path, "http://x", "push") | {"GITHUB_REF_NAME": "main"})
    assert (push.sha, push.branch, push.parents, push.message) == ("d" * 40, "main", [], "export A")
    assert push.pull_request is None
    event = tmp_path / "push.json"
    event.write_text(json.dumps({"before": BASE}))
    again = github_context(environment(tmp_path, "http://x", "push") | {"GITHUB_EVENT_PATH": str(event)})
    assert again.parents == [BASE]
    assert github_context({"CI": "true"}) is None


def test_the_fusion_verdict_first_completes_the_check_run_then_the_timings_update_it(tmp_path):
    """`submit --wait-for all`: the check run shows the fusion verdict in progress, with the drops the
    counts taken before timing found (no cause yet), then completes when the timings are in."""
    forge = LoopbackForge()
    forge.merge_bases[(BASE, HEAD)] = MERGE_BASE
    run, diff = run_and_diff(lost=True)
    early_run = {**run, "alerts": [], "jobs": [{**run["jobs"][0], "state": "queued"}], "verdict": "regression",
                 "fusions": {"done": True, "verdict": "regression", "lost": [
                     {"model": "bert.onnx", "engine": "native", "level": "extended", "op": "com.microsoft.BiasGelu",
                      "rule": "BiasGeluFusion", "before": 2, "after": 0, "pending": True}]}}
    early_diff = {**diff, "models": []}  # no result recorded yet
    with loopback_github(forge) as github:
        reporter = GitHubReporter(github_context(environment(tmp_path, github.url)), "bert-exports")
        early = summarize("bert-exports", early_run, early_diff, LINKS, timings_pending=True)
        assert early.conclusion == "failure" and "lost fused ops: BiasGelu" in early.title
        assert "timings pending" in early.title
        reporter.report(early, LINKS.dashboard, final=False)
        (check,) = forge.check_runs.values()
        assert check["status"] == "in_progress" and "conclusion" not in check
        assert ("| bert.onnx | native | extended | BiasGelu | 2 → 0 | BiasGeluFusion stopped firing; its cause is "
                "explained when this job's result is in |") in check["output"]["summary"]
        assert "**Timings**: still being measured" in check["output"]["summary"]

        reporter.report(summarize("bert-exports", run, diff, LINKS), LINKS.dashboard)
        (check,) = forge.check_runs.values()  # the same check run, completed
        assert check["status"] == "completed" and check["conclusion"] == "failure"
        assert "ai.onnx.contrib.Passthrough" in check["output"]["summary"]
        assert [r.method for r in forge.requests if "/check-runs" in r.path] == ["POST", "PATCH"]
    assert forge.problems == []


def test_a_paired_timing_row_shows_the_paired_change_and_marks_the_medians_as_context():
    run, diff = run_and_diff(lost=False)
    diff["models"][0]["median_ms"] = {"before": 6.236, "after": 4.383, "change_pct": -29.7, "p10": 4.3, "p90": 4.5}
    diff["models"][0]["timing"] = {"word": "within noise", "basis": "paired", "change_pct": -2.4,
                                   "statistic": "candidate / baseline 0.976 [0.950, 1.010] over 8 pairs"}
    summary = summarize("bert-exports", run, diff, LINKS).markdown
    assert ("| 6.236* | 4.383* | -2.4% (paired) | 4.300–4.500 | no timing alert: candidate / baseline 0.976 "
            "[0.950, 1.010] over 8 pairs |") in summary
    assert "-29.7" not in summary and "\\* each job's own median, measured at other moments" in summary
