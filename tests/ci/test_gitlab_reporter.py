"""The GitLab reporter against a loopback GitLab that checks request shapes: the commit status's state
(running while timings are pending, then success/failed), one merge-request note found again by its marker
and edited with PUT, the job's CI variables read as GitLab sets them, and a token that may not write."""

from __future__ import annotations

from rich.console import Console

from service.ci.environment import gitlab_context
from service.ci.github import comment_marker
from service.ci.gitlab import GitLabReporter
from service.ci.report import ci_step
from service.ci.summary import Links, summarize
from tests.ci.loopback_forges import GITLAB_TOKEN, Behaviour, LoopbackForge, loopback_gitlab
from tests.ci.test_github_reporter import HEAD, MERGE_BASE, run_and_diff

LINKS = Links("https://gitlab.example.com/org/models/-/commit/" + HEAD, "http://fw/projects/p/commits/" + HEAD,
              "http://fw/api/v1/runs/2")


def environment(api: str, merge_request: bool = True) -> dict[str, str]:
    env = {"GITLAB_CI": "true", "CI_API_V4_URL": f"{api}/api/v4", "CI_PROJECT_ID": "42",
           "CI_PROJECT_URL": "https://gitlab.example.com/org/models", "CI_COMMIT_SHA": "e" * 40,
           "CI_COMMIT_REF_NAME": "custom-gelu", "CI_COMMIT_BEFORE_SHA": "0" * 40, "CI_COMMIT_MESSAGE": "export B\n",
           "FUSIONWATCH_GITLAB_TOKEN": GITLAB_TOKEN}
    if merge_request:
        env |= {"CI_MERGE_REQUEST_IID": "5", "CI_MERGE_REQUEST_SOURCE_BRANCH_SHA": HEAD,
                "CI_MERGE_REQUEST_DIFF_BASE_SHA": MERGE_BASE, "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "custom-gelu",
                "CI_MERGE_REQUEST_TITLE": "Custom op before GELU"}
    return env


def test_a_merge_request_gets_a_failed_status_and_one_note_edited_later():
    forge = LoopbackForge()
    with loopback_gitlab(forge) as gitlab:
        context = gitlab_context(environment(gitlab.url))
        assert (context.sha, context.parents, context.merge_request_iid) == (HEAD, [MERGE_BASE], 5)
        reporter = GitLabReporter(context, "bert-exports")
        pending = summarize("bert-exports", *run_and_diff(lost=True), LINKS, timings_pending=True)
        reporter.report(pending, LINKS.dashboard, final=False)
        reporter.report(summarize("bert-exports", *run_and_diff(lost=True), LINKS), LINKS.dashboard)
        assert [(s["sha"], s["state"]) for s in forge.statuses] == [(HEAD, "running"), (HEAD, "failed")]
        assert forge.statuses[-1]["name"] == "fusionwatch/bert-exports" and "BiasGelu" in forge.statuses[-1]["description"]
        (note,) = forge.comments.values()
        assert note["issue"] == 5 and note["body"].startswith(comment_marker("bert-exports"))
        assert "| BiasGelu | 2 → 0 | BiasGeluFusion stopped firing" in note["body"]

        GitLabReporter(context, "bert-exports").report(summarize("bert-exports", *run_and_diff(lost=False), LINKS),
                                                        LINKS.dashboard)
        assert len(forge.comments) == 1 and "unchanged" in next(iter(forge.comments.values()))["body"]
        assert [r.method for r in forge.writes() if "/notes" in r.path] == ["POST", "PUT", "PUT"]
        assert forge.statuses[-1]["state"] == "success"
    assert forge.problems == []


def test_a_branch_pipeline_reads_its_commit_and_a_token_that_may_not_write_is_a_warning(capsys):
    push = gitlab_context(environment("http://x", merge_request=False))
    assert (push.sha, push.branch, push.parents, push.message, push.merge_request_iid) == (
        "e" * 40, "custom-gelu", [], "export B", None)
    forge = LoopbackForge(Behaviour(read_only=True))
    with loopback_gitlab(forge) as gitlab:
        step = ci_step("p", Console(stderr=True, width=300), environ=environment(gitlab.url))
        step.report("http://fw", *run_and_diff(lost=True))
    err = capsys.readouterr().err
    assert "warning:" in err and "HTTP 403" in err and "api scope" in err
    no_token = ci_step("p", Console(stderr=True, width=300),
                       environ=environment("http://x") | {"FUSIONWATCH_GITLAB_TOKEN": ""})
    assert no_token.reporter is None and "FUSIONWATCH_GITLAB_TOKEN" in capsys.readouterr().err
