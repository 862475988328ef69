"""What a CI job's environment says about the commit it builds: GitHub Actions' and GitLab CI's standard
variables, read once into plain records the reporters and `submit` use.

A pull request's commit is its head (where GitHub shows checks), not the merge commit Actions checks out by
default, and its baseline is the merge base with the base branch: the head is recorded with that one parent,
so the server compares it with what the base branch measured where the pull request forked off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NO_COMMIT = "0" * 40  # a push's "before" when the branch is new
MAX_EVENT_BYTES = 25 * 1024 * 1024  # GitHub's webhook payloads are capped at 25 MB


class CiEnvironmentError(Exception):
    """The CI system's variables or event file cannot be read; the message names which."""


@dataclass(frozen=True)
class PullRequest:
    number: int
    base_sha: str
    head_sha: str
    base_ref: str
    head_ref: str
    from_fork: bool


@dataclass(frozen=True)
class GitHubContext:
    api_url: str
    server_url: str
    repository: str  # owner/name
    event_name: str
    sha: str  # the commit the verdict is about: the pull request's head, else GITHUB_SHA
    branch: str
    parents: list[str]  # a push's previous head; a pull request's parents are its merge base, found later
    message: str
    token: str
    pull_request: PullRequest | None

    @property
    def commit_url(self) -> str:
        return f"{self.server_url}/{self.repository}/commit/{self.sha}"


@dataclass(frozen=True)
class GitLabContext:
    api_url: str  # CI_API_V4_URL
    project_id: str
    project_url: str
    sha: str
    branch: str
    parents: list[str]
    message: str
    token: str
    merge_request_iid: int | None

    @property
    def commit_url(self) -> str:
        return f"{self.project_url}/-/commit/{self.sha}"


def github_context(environ: Mapping[str, str], token: str | None = None) -> GitHubContext | None:
    """None outside GitHub Actions (GITHUB_ACTIONS=true). `token` (--github-token) wins over GITHUB_TOKEN."""
    if environ.get("GITHUB_ACTIONS") != "true":
        return None
    repository = _required(environ, "GITHUB_REPOSITORY")
    if repository.count("/") != 1:
        raise CiEnvironmentError(f"GITHUB_REPOSITORY {repository[:100]!r} is not owner/name")
    event_name = environ.get("GITHUB_EVENT_NAME", "")
    event = _event(environ.get("GITHUB_EVENT_PATH", ""))
    pull = _pull_request(event, repository) if event_name in ("pull_request", "pull_request_target") else None
    if pull is not None:
        sha, branch, parents = pull.head_sha, environ.get("GITHUB_HEAD_REF") or pull.head_ref, []
        message = str((event.get("pull_request") or {}).get("title") or "")
    else:
        sha, branch = _required(environ, "GITHUB_SHA"), environ.get("GITHUB_REF_NAME") or "main"
        before = event.get("before")
        parents = [before] if isinstance(before, str) and before and before != NO_COMMIT else []
        head = event.get("head_commit")
        message = str(head.get("message") or "") if isinstance(head, dict) else ""
    return GitHubContext(
        api_url=(environ.get("GITHUB_API_URL") or "https://api.github.com").rstrip("/"),
        server_url=(environ.get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/"),
        repository=repository, event_name=event_name, sha=sha, branch=branch, parents=parents,
        message=message, token=(token or environ.get("GITHUB_TOKEN") or "").strip(), pull_request=pull,
    )


def gitlab_context(environ: Mapping[str, str], token: str | None = None) -> GitLabContext | None:
    """None outside GitLab CI (GITLAB_CI=true). The token is one with api scope (a project access token
    in FUSIONWATCH_GITLAB_TOKEN, or --gitlab-token): CI_JOB_TOKEN may not write notes or statuses."""
    if environ.get("GITLAB_CI") != "true":
        return None
    iid = environ.get("CI_MERGE_REQUEST_IID", "")
    sha = _required(environ, "CI_COMMIT_SHA")
    if iid:
        # Merged-results pipelines build a merge commit; the merge request's head is where its status belongs.
        sha = environ.get("CI_MERGE_REQUEST_SOURCE_BRANCH_SHA") or sha
        base = environ.get("CI_MERGE_REQUEST_DIFF_BASE_SHA", "")
        parents = [base] if base else []
        branch = environ.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME") or environ.get("CI_COMMIT_REF_NAME", "main")
        message = environ.get("CI_MERGE_REQUEST_TITLE", "")
    else:
        before = environ.get("CI_COMMIT_BEFORE_SHA", "")
        parents = [before] if before and before != NO_COMMIT else []
        branch = environ.get("CI_COMMIT_BRANCH") or environ.get("CI_COMMIT_REF_NAME") or "main"
        message = environ.get("CI_COMMIT_MESSAGE", "")
    return GitLabContext(
        api_url=_required(environ, "CI_API_V4_URL").rstrip("/"), project_id=_required(environ, "CI_PROJECT_ID"),
        project_url=environ.get("CI_PROJECT_URL", "").rstrip("/"), sha=sha, branch=branch, parents=parents,
        message=message.strip(), token=(token or environ.get("FUSIONWATCH_GITLAB_TOKEN") or "").strip(),
        merge_request_iid=int(iid) if iid.isdigit() else None,
    )


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise CiEnvironmentError(f"{name} is not set; the CI system sets it for every job")
    return value


def _event(path: str) -> dict[str, Any]:
    if not path:
        return {}
    event_file = Path(path)
    try:
        if event_file.stat().st_size > MAX_EVENT_BYTES:
            raise CiEnvironmentError(f"GITHUB_EVENT_PATH {path}: larger than {MAX_EVENT_BYTES} bytes")
        event = json.loads(event_file.read_bytes())
    except OSError as error:
        raise CiEnvironmentError(f"GITHUB_EVENT_PATH {path}: {error.strerror or error}") from error
    except json.JSONDecodeError as error:
        raise CiEnvironmentError(f"GITHUB_EVENT_PATH {path}: not JSON ({error.msg} at character {error.pos})") from error
    if not isinstance(event, dict):
        raise CiEnvironmentError(f"GITHUB_EVENT_PATH {path}: not a JSON object")
    return event


def _pull_request(event: dict[str, Any], repository: str) -> PullRequest:
    pull = event.get("pull_request")
    if not isinstance(pull, dict):
        raise CiEnvironmentError("GITHUB_EVENT_PATH: a pull_request event without its pull_request object")
    try:
        base, head = pull["base"], pull["head"]
        head_repo = (head.get("repo") or {}).get("full_name")
        return PullRequest(
            number=int(pull["number"]), base_sha=str(base["sha"]), head_sha=str(head["sha"]),
            base_ref=str(base.get("ref") or ""), head_ref=str(head.get("ref") or ""),
            from_fork=bool(head_repo) and head_repo != repository,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CiEnvironmentError(f"GITHUB_EVENT_PATH: pull_request lacks number, base.sha or head.sha ({error})") from error
