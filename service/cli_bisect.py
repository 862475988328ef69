"""`fusionwatch bisect`: drive the service's bisect from a checkout (client mode).

    fusionwatch bisect --server http://ci:8000 --project bert-exports --good a1b2c3d --bad 9f8e7d6 \\
        --cmd 'git checkout -q {commit} && pip install -q . && fusionwatch run ... --server ...'

Each step asks the server which commit to measure next (POST /api/v1/projects/{p}/bisect), runs
`--cmd` for it (`{commit}` replaced, and FUSIONWATCH_BISECT_COMMIT set; the command checks the commit
out or installs it and posts its results), and stops when the server names the culprit. The commits
between good and bad come from `git rev-list --first-parent` in the current directory when it is a git
checkout that knows both, else from the commits the server recorded.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from service.cli_client import auth_headers

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def bisect_command(
    server: Annotated[str, typer.Option("--server", help="the fusionwatch service, e.g. http://127.0.0.1:8000 (with a write token in FUSIONWATCH_TOKEN)")],
    project: Annotated[str, typer.Option("--project", help="project name")],
    good: Annotated[str, typer.Option("--good", help="a measured commit without the regression")],
    bad: Annotated[str, typer.Option("--bad", help="a measured commit with it")],
    cmd: Annotated[str, typer.Option("--cmd", help="shell command measuring {commit} and posting its results")],
    model: Annotated[str | None, typer.Option("--model", help="the series' model (default: the bad commit's alert)")] = None,
    engine: Annotated[str | None, typer.Option("--engine")] = None,
    level: Annotated[str | None, typer.Option("--level")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="fusion (exact) or timing (statistical)")] = None,
) -> None:
    """Find the commit that introduced a regression, measuring as few commits as bisection needs."""
    request = {"good": good, "bad": bad, "model": model, "engine": engine, "level": level, "kind": kind,
               "commits": git_commits_between(good, bad)}
    with httpx.Client(base_url=server.rstrip("/"), timeout=60, headers=auth_headers()) as client:
        try:
            culprit = drive(client, project, request, lambda sha: run_step(cmd, sha))
        except BisectError as error:
            err.print(f"[red]error:[/red] {error}")
            raise typer.Exit(2) from error
    console.print(f"first bad commit: {culprit}")


class BisectError(Exception):
    pass


def drive(client: httpx.Client, project: str, request: dict[str, Any], measure: Callable[[str], None]) -> str:
    """Ask, measure, ask again until the server names the culprit; returns it."""
    body = {k: v for k, v in request.items() if v is not None}
    asked: set[str] = set()
    while True:
        reply = client.post(f"/api/v1/projects/{project}/bisect", json=body)
        if reply.status_code != 200:
            raise BisectError(f"server answered {reply.status_code}: {reply.text[:500]}")
        step = reply.json()
        if step["culprit"] is not None:
            return step["culprit"]
        sha = step["next"]
        if sha in asked:
            raise BisectError(f"commit {sha} was measured but the server has no result for it in this series; "
                              "does --cmd post its results for that commit?")
        asked.add(sha)
        console.print(f"measuring {sha} ({step['remaining']} commits left, about {step['steps_left']} steps)")
        measure(sha)


def run_step(cmd: str, sha: str) -> None:
    command = cmd.replace("{commit}", sha)
    done = subprocess.run(command, shell=True, env={**os.environ, "FUSIONWATCH_BISECT_COMMIT": sha}, check=False)
    if done.returncode != 0:
        raise BisectError(f"--cmd failed for {sha} with exit status {done.returncode}: {command}")


def git_commits_between(good: str, bad: str) -> list[str] | None:
    """Full shas strictly between good and bad on bad's first-parent line, oldest first; None outside a
    checkout that knows both (the server's recorded commits are used then)."""
    try:
        done = subprocess.run(["git", "rev-list", "--first-parent", "--reverse", f"{good}..{bad}"],
                              capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    shas = done.stdout.split()
    return shas[:-1] if shas else None  # the last is bad itself
