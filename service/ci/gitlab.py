"""The verdict on GitLab, from the CI job with a token of api scope (CI_JOB_TOKEN may not write these):
a commit status on the commit (`POST /projects/:id/statuses/:sha`, `running` while timings are pending,
then `success` or `failed`) and, in a merge-request pipeline, one note on the merge request
(`/projects/:id/merge_requests/:iid/notes`), found again by a hidden marker and edited in place (`PUT`)
on later pushes, created only when something changed or failed. Failures are `ForgeError`s, which the
caller prints as warnings: reporting never changes the job's exit code."""

from __future__ import annotations

from urllib.parse import quote

from service.ci.environment import GitLabContext
from service.ci.forge_http import TIMEOUT_S, ForgeApi, ForgeError, attempt_each
from service.ci.github import comment_marker
from service.ci.summary import Summary

STATUS_NAME = "fusionwatch"
NOTES_PAGE = 100
MAX_NOTE_PAGES = 30
# A run whose jobs failed has no verdict: GitLab has no "neutral", and passing it would say there was one.
STATES = {"success": "success", "failure": "failed", "neutral": "failed"}


class GitLabReporter:
    def __init__(self, context: GitLabContext, project: str, timeout_s: float = TIMEOUT_S) -> None:
        if not context.token:
            raise ForgeError("GitLab: no token; set FUSIONWATCH_GITLAB_TOKEN (a project access token with api "
                             "scope, as a masked CI/CD variable) or pass --gitlab-token")
        self.context = context
        self.project = project
        self.api = ForgeApi(context.api_url, {"PRIVATE-TOKEN": context.token, "User-Agent": "fusionwatch"}, "GitLab", timeout_s)
        self.base = f"/projects/{quote(context.project_id, safe='')}"
        self.last_state: str | None = None

    def close(self) -> None:
        self.api.close()

    def report(self, summary: Summary, details_url: str, final: bool = True) -> list[str]:
        return attempt_each([lambda: self._status(summary, details_url, final),
                             lambda: self._note(summary, details_url, final)], _permissions_advice)

    def _status(self, summary: Summary, details_url: str, final: bool) -> str | None:
        state = STATES[summary.conclusion] if final else "running"
        if state == self.last_state:
            return None  # GitLab refuses a transition to the state a status already has
        self.api.request("POST", f"{self.base}/statuses/{self.context.sha}", json={
            "state": state, "name": f"{STATUS_NAME}/{self.project}", "target_url": details_url,
            "description": summary.description, "ref": self.context.branch,
        })
        self.last_state = state
        return f"commit status {state}"

    def _note(self, summary: Summary, details_url: str, final: bool) -> str | None:
        iid = self.context.merge_request_iid
        if iid is None:
            return None
        marker = comment_marker(self.project)
        notes = f"{self.base}/merge_requests/{iid}/notes"
        existing = self._find_note(notes, marker)
        body = f"{marker}\n{summary.markdown}"
        if existing is not None:
            self.api.request("PUT", f"{notes}/{existing}", json={"body": body})
            return f"merge request !{iid}: note {existing} edited"
        if not summary.changed:
            return None
        created = self.api.request("POST", notes, json={"body": body})
        return f"merge request !{iid}: note {created['id']} posted"

    def _find_note(self, notes: str, marker: str) -> int | None:
        for page in range(1, MAX_NOTE_PAGES + 1):
            found = self.api.request("GET", notes, params={"per_page": NOTES_PAGE, "page": page, "sort": "asc"}) or []
            for note in found:
                if marker in str(note.get("body") or "") and not note.get("system"):
                    return int(note["id"])
            if len(found) < NOTES_PAGE:
                return None
        return None


def _permissions_advice(errors: list[ForgeError]) -> str:
    if not any(e.status in (401, 403) for e in errors):
        return ""
    return " — the token needs api scope and at least the Developer role on the project"
