"""The CI step's side of reporting: which forge the job runs on (GitHub Actions, GitLab CI, neither), the
commit it builds as `submit` records it, and the verdict handed to that forge's reporter once the server has
one. Reporting never decides the step's exit code: what fails is printed as a warning (in GitHub Actions
also as a `::warning::` annotation) and the verdict's own exit code stands.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from service.ci.environment import (
    CiEnvironmentError,
    GitHubContext,
    GitLabContext,
    github_context,
    gitlab_context,
)
from service.ci.forge_http import ForgeError
from service.ci.github import GitHubReporter
from service.ci.gitlab import GitLabReporter
from service.ci.summary import Links, summarize


@dataclass(frozen=True)
class BuiltCommit:
    sha: str
    branch: str
    parents: list[str]
    message: str


class CiStep:
    """One forge's reporter for one project's verdict on the commit the CI job builds."""

    def __init__(self, context: GitHubContext | GitLabContext, project: str, err: Console) -> None:
        self.context = context
        self.project = project
        self.err = err
        self.reporter: GitHubReporter | GitLabReporter | None = None
        try:
            if isinstance(context, GitHubContext):
                self.reporter = GitHubReporter(context, project)
            else:
                self.reporter = GitLabReporter(context, project)
        except ForgeError as error:
            self.warn(str(error))

    @property
    def forge(self) -> str:
        return "GitHub" if isinstance(self.context, GitHubContext) else "GitLab"

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.close()

    def commit(self) -> BuiltCommit:
        """The commit as the server should record it: a pull request's head with its merge base as parent."""
        parents = list(self.context.parents)
        pull = getattr(self.context, "pull_request", None)
        if pull is not None:
            try:
                if not isinstance(self.reporter, GitHubReporter):
                    raise ForgeError("GitHub: no token to ask for the merge base")
                parents = [self.reporter.merge_base()]
            except ForgeError as error:
                # The base branch's head when the event fired: at or after the merge base, so the baseline
                # may include base-branch changes the pull request does not have. Said, not hidden.
                self.warn(f"{error}; the pull request's baseline is the base branch's head "
                          f"{pull.base_sha[:12]} instead of its merge base")
                parents = [pull.base_sha]
        return BuiltCommit(self.context.sha, self.context.branch, parents, self.context.message)

    def report(self, server_origin: str, run: dict, diff: dict, final: bool = True,
               timings_pending: bool | None = None) -> None:
        """`final`: the check run completes (else it stays in progress, to be updated); `timings_pending`
        (default: not final): the summary says the timings are still being measured."""
        if self.reporter is None:
            return
        links = Links(commit=self.context.commit_url,
                      dashboard=f"{server_origin}/projects/{self.project}/commits/{diff['commit']}",
                      run=f"{server_origin}/api/v1/runs/{run['id']}")
        pending = not final if timings_pending is None else timings_pending
        summary = summarize(self.project, run, diff, links, timings_pending=pending)
        try:
            for line in self.reporter.report(summary, links.dashboard, final):
                self.err.print(f"{self.forge}: {escape(line)}", highlight=False)
        except ForgeError as error:
            self.warn(str(error))

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False)
        if isinstance(self.context, GitHubContext):
            # An annotation on the workflow run's page, where a fork's author sees why nothing was posted.
            print(f"::warning title=fusionwatch::{_annotation(message)}", flush=True)


def ci_step(project: str, err: Console, github_token: str | None = None, gitlab_token: str | None = None,
            environ: Mapping[str, str] = os.environ) -> CiStep | None:
    """The CI job's reporter, or None outside GitHub Actions and GitLab CI. A job whose CI variables cannot
    be read is told so and not reported on (a warning: reporting is no part of the verdict)."""
    readers: list[Callable[[], GitHubContext | GitLabContext | None]] = [
        lambda: github_context(environ, github_token), lambda: gitlab_context(environ, gitlab_token)]
    for read in readers:
        try:
            context = read()
        except CiEnvironmentError as error:
            err.print(f"[yellow]warning:[/yellow] not reporting to the CI's forge: {escape(str(error))}", highlight=False)
            return None
        if context is not None:
            return CiStep(context, project, err)
    return None


def _annotation(message: str) -> str:
    # Workflow commands end at a newline; GitHub's escapes for data are %25, %0D, %0A.
    return message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
