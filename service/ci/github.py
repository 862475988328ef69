"""The verdict on GitHub, from the Actions step with the job's own token (no token on the server).

A check run on the commit (`POST /repos/{owner}/{repo}/check-runs`, later `PATCH`ed when the timings
arrive); where the token may not create check runs (403: a workflow without `checks: write`) a commit
status instead (`POST /repos/{owner}/{repo}/statuses/{sha}`). On a pull request, one comment, found again by
a hidden marker and edited in place on later pushes, created only when something changed or failed. A
pull request's baseline is its merge base (`GET /repos/{owner}/{repo}/compare/{base}...{head}`).

Nothing here changes the step's exit code: every failure is a `ForgeError` the caller prints as a warning
(a fork's read-only token is the common one).
"""

from __future__ import annotations

from service.ci.environment import GitHubContext
from service.ci.forge_http import TIMEOUT_S, ForgeApi, ForgeError, attempt_each
from service.ci.summary import Summary

CHECK_NAME = "fusionwatch"
COMMENTS_PAGE = 100
MAX_COMMENT_PAGES = 30


def comment_marker(project: str) -> str:
    """Hidden in the comment's markdown; one comment per fusionwatch project on a pull request."""
    return f"<!-- fusionwatch:{project} -->"


class GitHubReporter:
    def __init__(self, context: GitHubContext, project: str, timeout_s: float = TIMEOUT_S) -> None:
        if not context.token:
            raise ForgeError("GitHub: no token; pass --github-token or set GITHUB_TOKEN "
                             "(`env: GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}` in the workflow step)")
        self.context = context
        self.project = project
        self.api = ForgeApi(context.api_url, {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {context.token}",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "fusionwatch",
        }, "GitHub", timeout_s)
        self.check_run_id: int | None = None
        self.statuses_only = False  # set once check runs were refused: a workflow without `checks: write`
        self.repo = f"/repos/{context.repository}"

    def close(self) -> None:
        self.api.close()

    def merge_base(self) -> str:
        """The pull request's merge base with its base branch."""
        pull = self.context.pull_request
        assert pull is not None
        compared = self.api.request("GET", f"{self.repo}/compare/{pull.base_sha}...{pull.head_sha}")
        sha = ((compared or {}).get("merge_base_commit") or {}).get("sha")
        if not isinstance(sha, str) or not sha:
            raise ForgeError(f"GitHub: compare {pull.base_sha[:12]}...{pull.head_sha[:12]} named no merge_base_commit")
        return sha

    def report(self, summary: Summary, details_url: str, final: bool = True) -> list[str]:
        """Check run (or status) and pull-request comment; what was done, one line each (ForgeError: see
        forge_http.attempt_each)."""
        return attempt_each([lambda: self._check(summary, details_url, final),
                             lambda: self._comment(summary, details_url, final)], _permissions_advice)

    def _check(self, summary: Summary, details_url: str, final: bool) -> str:
        if self.statuses_only:
            return self._status(summary, details_url, final)
        try:
            return self._check_run(summary, details_url, final)
        except ForgeError as error:
            if error.status != 403 or self.check_run_id is not None:
                raise
        self.statuses_only = True
        return self._status(summary, details_url, final)

    def _check_run(self, summary: Summary, details_url: str, final: bool) -> str:
        body: dict = {
            "name": f"{CHECK_NAME} ({self.project})",
            "head_sha": self.context.sha,
            "details_url": details_url,
            "external_id": self.project,
            "output": {"title": summary.title[:200], "summary": summary.markdown},
        }
        if final:
            body |= {"status": "completed", "conclusion": summary.conclusion}
        else:
            body["status"] = "in_progress"
        if self.check_run_id is None:
            created = self.api.request("POST", f"{self.repo}/check-runs", json=body)
            self.check_run_id = int(created["id"])
            return f"check run {self.check_run_id} created: {body.get('conclusion', 'in progress')}"
        del body["head_sha"]
        self.api.request("PATCH", f"{self.repo}/check-runs/{self.check_run_id}", json=body)
        return f"check run {self.check_run_id} updated: {body.get('conclusion', 'in progress')}"

    def _status(self, summary: Summary, details_url: str, final: bool) -> str:
        state = {"success": "success", "failure": "failure", "neutral": "error"}[summary.conclusion] if final else "pending"
        self.api.request("POST", f"{self.repo}/statuses/{self.context.sha}", json={
            "state": state, "target_url": details_url, "description": summary.description,
            "context": f"{CHECK_NAME}/{self.project}",
        })
        return f"commit status {state} (the token may not create check runs)"

    def _comment(self, summary: Summary, details_url: str, final: bool) -> str | None:
        pull = self.context.pull_request
        if pull is None:
            return None
        marker = comment_marker(self.project)
        existing = self._find_comment(pull.number, marker)
        body = f"{marker}\n{summary.markdown}"
        if existing is not None:
            self.api.request("PATCH", f"{self.repo}/issues/comments/{existing}", json={"body": body})
            return f"pull request #{pull.number}: comment {existing} edited"
        if not summary.changed:
            return None
        created = self.api.request("POST", f"{self.repo}/issues/{pull.number}/comments", json={"body": body})
        return f"pull request #{pull.number}: comment {created['id']} posted"

    def _find_comment(self, number: int, marker: str) -> int | None:
        for page in range(1, MAX_COMMENT_PAGES + 1):
            comments = self.api.request("GET", f"{self.repo}/issues/{number}/comments",
                                        params={"per_page": COMMENTS_PAGE, "page": page}) or []
            for comment in comments:
                if marker in str(comment.get("body") or ""):
                    return int(comment["id"])
            if len(comments) < COMMENTS_PAGE:
                return None
        return None


def _permissions_advice(errors: list[ForgeError]) -> str:
    if not any(e.status in (403, 404) for e in errors):
        return ""
    return (" — the token may not write here (a pull request from a fork gets a read-only GITHUB_TOKEN; "
            "otherwise give the workflow `permissions: checks: write, statuses: write, pull-requests: write`)")
