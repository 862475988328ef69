"""The CLI's side of the HTTP API: `fusionwatch submit` (a model repository's CI step) and the posting half
of `fusionwatch run --server` (an engine's CI step), plus the tables both print.

`Server` wraps an `httpx.Client` whose base URL is the server's origin, so the same code drives a real
server over HTTP and, in tests, the app in-process (FastAPI's TestClient is an httpx.Client). Every
failure to talk to the server — unreachable, timed out, an HTTP error — becomes one `ServerError` whose
message names the request and, for a 4xx/5xx, the server's `detail`; the commands print it and exit 2.

Credentials come from the environment, where CI systems keep secrets (never from arguments, which
`ps` and shell histories show): FUSIONWATCH_TOKEN is sent as a bearer token, and when
FUSIONWATCH_WEBHOOK_SECRET is set `submit` signs its delivery with it, as the project expects.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import statistics
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.ci.report import CiStep, ci_step
from service.console import stdout_console
from service.domain.op_names import short_names
from service.domain.verdict_words import signed_pct
from service.domain.vocabulary import AlertKind

API = "/api/v1"
# Alerts that fail an engine's CI step (`run --fail-on-regression`); a run's verdict is the server's.
FAILING_KINDS = (AlertKind.FUSION_REGRESSION, AlertKind.TIMING_REGRESSION)
EXIT_REGRESSION, EXIT_ERROR = 1, 2
TOKEN_ENV, SECRET_ENV = "FUSIONWATCH_TOKEN", "FUSIONWATCH_WEBHOOK_SECRET"

err = Console(stderr=True, soft_wrap=True)


class ServerError(Exception):
    """The server could not be reached or refused a request; the message says which and why."""


@dataclass(frozen=True)
class CommitRef:
    sha: str
    branch: str = "main"
    parents: list[str] = field(default_factory=list)
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"sha": self.sha, "branch": self.branch, "parents": list(self.parents), "message": self.message}


def origin(server: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/api/v1` all name one server."""
    url = server.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ServerError(f"--server {server!r}: expected an http:// or https:// URL")
    return url.removesuffix(API)


class Server:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    @classmethod
    def at(cls, server: str, timeout_s: float = 120.0) -> Server:
        # Uploads of large exports and a busy server's first answer can take a while; polls are short.
        return cls(httpx.Client(base_url=origin(server), timeout=timeout_s, headers=auth_headers()))

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, sign: bool = False, **kwargs: Any) -> dict[str, Any]:
        where = f"{self.http.base_url}{path}"
        try:
            request = self.http.build_request(method, path, **kwargs)
            secret = os.environ.get(SECRET_ENV, "")
            if sign and secret:
                digest = hmac.new(secret.encode(), request.read(), hashlib.sha256).hexdigest()
                request.headers["X-Hub-Signature-256"] = f"sha256={digest}"
            response = self.http.send(request)
        except httpx.TransportError as error:
            raise ServerError(f"cannot reach {where}: {error or type(error).__name__}") from error
        if response.status_code >= 400:
            raise ServerError(f"{method} {where}: HTTP {response.status_code}: {_detail(response)}")
        try:
            return response.json()
        except json.JSONDecodeError as error:
            raise ServerError(f"{method} {where}: the answer is not JSON ({response.text[:200]!r})") from error

    def submit(self, project: str, commit: CommitRef, models: list[Path]) -> dict[str, Any]:
        """POST /webhooks/ci with the commit and its model exports; the server answers with the run."""
        payload = json.dumps({"project": project, **commit.to_json()})
        handles = []
        try:
            for path in models:
                handles.append(("files", upload_of(path)))
            # A fresh delivery id: should this request be retried (by a proxy, say), the server answers
            # with the run it started the first time instead of measuring the commit twice.
            delivery = {"X-Fusionwatch-Delivery": uuid.uuid4().hex}
            return self.request("POST", f"{API}/webhooks/ci", sign=True, data={"payload": payload}, files=handles,
                                headers=delivery)
        finally:
            for _, (_, handle, _) in handles:
                handle.close()

    def run(self, run_url: str) -> dict[str, Any]:
        return self.request("GET", run_url)

    def wait(self, run_url: str, timeout_s: float, on_poll: Callable[[dict], None] = lambda run: None,
             poll_s: float = 1.0, until: Callable[[dict], bool] = lambda run: False) -> dict[str, Any]:
        """The run once no job is queued or running, or `until` it holds; ServerError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.run(run_url)
            on_poll(run)
            if run["state"] != "running" or until(run):
                return run
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"run {run['id']} still running after {timeout_s:g} s "
                    f"({run['jobs_done']} of {run['jobs_total']} jobs done); see {self.http.base_url}{run_url}"
                )
            time.sleep(poll_s)

    def diff(self, project: str, sha: str) -> dict[str, Any]:
        return self.request("GET", f"{API}/commits/{sha}/diff", params={"project": project})

    def alerts_at(self, project: str, sha: str) -> list[dict[str, Any]]:
        """The alerts raised at one commit, oldest first (the order a run lists them in)."""
        page = self.request("GET", f"{API}/alerts", params={"project": project, "commit": sha, "limit": 500})
        return list(reversed(page["items"]))

    def post_results(self, document: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"{API}/results", json=finite(document))


def upload_of(path: Path) -> tuple[str, Any, str]:
    """What is sent for one model export: the file itself, or, for an .onnx whose tensors live in data
    files beside it (the dynamo exporter writes `model.onnx.data`), one flat zip of the .onnx and those
    files, as the service takes such a model. Data files not found beside it are left to the server,
    whose refusal names the tensor and the file."""
    if path.suffix.lower() == ".onnx":
        beside = [path.parent / name for name in external_locations(path)]
        if beside and all(file.is_file() for file in beside):
            packed = tempfile.TemporaryFile()
            with zipfile.ZipFile(packed, "w", zipfile.ZIP_STORED) as archive:  # weights barely compress
                for file in (path, *beside):
                    archive.write(file, file.name)
            packed.seek(0)
            return f"{path.stem}.zip", packed, "application/zip"
    return path.name, path.open("rb"), "application/octet-stream"


def external_locations(path: Path) -> list[str]:
    """The data files an .onnx's tensors name (`external_data` location), each once, only where they
    lie directly beside it (a zip for the service is flat); the tensors themselves are not read."""
    import onnx  # here: the other commands need no protobuf parsing at start-up

    model = onnx.load(str(path), load_external_data=False)
    found: dict[str, None] = {}
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
            if location and Path(location).name == location:
                found[location] = None
    return list(found)


def _tensors(graph) -> Iterable[Any]:
    """Every TensorProto of a GraphProto: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _tensors(subgraph)


def auth_headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV, "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except json.JSONDecodeError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else json.dumps(detail)[:300]
    return json.dumps(body)[:300]


def finite(value: Any) -> Any:
    """JSON has no Infinity or NaN (a numeric check whose shapes differ reports an infinite error)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


# --- what the commands print -------------------------------------------------------------------


def print_diff(console: Console, diff: dict[str, Any]) -> None:
    """Each model × engine × level of a commit: fused ops, the timing verdict and the change it
    decided on, then the two jobs' median Execute ms.

    A paired verdict times both models alternately in one job; the jobs' own medians were measured
    at other moments of a shared machine and can move by tens of percent while the verdict says
    "within noise". So beside a paired verdict the change shown is the verdict's, and the medians
    follow dimmed, marked as context, without a change of their own for a reader to stop on."""
    console.print(f"commit {diff['commit'][:12]} on {diff['branch']}, against each result's baseline:", markup=False)
    table = Table("model", "engine", "level", "baseline", "fused ops (before → after)", "timing verdict", "change",
                  "Execute ms (job medians)")
    paired = False
    for entry in diff["models"]:
        timing, baseline, decided = entry["median_ms"], entry["baseline_commit"], entry.get("timing") or {}
        names = short_names(entry["fusions"])
        if baseline is None:  # the first measurement of its series: nothing to compare with
            fused = escape("\n".join(f"{names[op]} {c['after']}" for op, c in entry["fusions"].items()))
            timings = _ms(timing["after"])
        else:
            fused = "\n".join(_count_change(names[op], c["before"], c["after"]) for op, c in entry["fusions"].items())
            timings = f"{_ms(timing['before'])} → {_ms(timing['after'])}"
        if decided.get("basis") == "paired":
            paired, change, timings = True, signed_pct(decided.get("change_pct")), f"[dim]{timings}*[/dim]"
        else:  # the window's verdict and these medians come from the same jobs
            change = signed_pct(timing["change_pct"])
        table.add_row(escape(entry["model"]), entry["engine"], entry["level"], escape((baseline or "none")[:12]), fused or "-",
                      _verdict(entry.get("timing")), change, timings)
    console.print(table, highlight=False)
    if paired:
        console.print("* each job's own median, measured at other moments of the machine: context only. The verdict "
                      "and its change come from the two models timed alternately in one job", style="dim", highlight=False)


# Only the detector's call is coloured: a median's change it did not call is shown plain, beside the word.
WORD_STYLES = {"regressed": "red", "improved": "green", "within noise": "dim", "inconclusive": "yellow",
               "inconclusive (re-measuring)": "yellow", "slower at level disabled (information)": "yellow"}


def _verdict(timing: dict[str, Any] | None) -> str:
    """The timing decision's word, coloured, and the statistic it used (service/domain/verdict_words.py)."""
    if not timing:
        return "-"
    style = WORD_STYLES.get(timing["word"], "")
    word = escape(timing["word"])
    return f"[{style}]{word}[/{style}]\n{escape(timing.get('statistic') or '')}" if style else word


def print_alerts(console: Console, alerts: Iterable[dict[str, Any]]) -> None:
    alerts = list(alerts)
    if not alerts:
        console.print("no alerts")
        return
    for alert in alerts:
        colour = "yellow" if alert["kind"] == AlertKind.FUSION_CHANGE or alert.get("state") == "info" else "red"
        # One line per alert, however long: a CI log is grepped for them.
        console.print(f"[{colour}]{alert['kind']}[/{colour}] {escape(alert['message'])}", highlight=False, soft_wrap=True)
        for line in _regression_details(alert):
            console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)


def _regression_details(alert: dict[str, Any]) -> list[str]:
    """Under a fusion-regression's line: its near misses as a person reads them, and its repro."""
    if alert["kind"] != AlertKind.FUSION_REGRESSION:
        return []
    cause = alert.get("cause") or {}
    lines = [f"near miss: {line}" for line in cause.get("near_miss_lines") or []]
    if alert.get("repro_url"):
        lines.append(f"repro: {alert['repro_url']} (this commit's subgraph), {alert['repro_url']}?side=baseline")
    elif alert.get("repro_error"):
        lines.append(f"no repro: {alert['repro_error']}")
    return lines


def print_measurements(console: Console, rows: Iterable[tuple[str, Any]], title: str = "Medians, ms") -> None:
    """Measurements (service.usecases.results.Measurement) as one table, one row per model × engine × level."""
    rows = list(rows)
    several = len({model for model, _ in rows}) > 1  # the model column only when it tells rows apart
    table = Table(title=title)
    for heading in ("model", "engine", "level", "fused ops")[0 if several else 1:]:
        table.add_column(heading, no_wrap=True)
    for heading in ("Execute", "model_run", "max abs err"):
        table.add_column(heading, justify="right")
    for model, m in rows:
        names = short_names(m.fusions)
        fused = escape("\n".join(f"{names[op]} {count}" for op, count in m.fusions.items()) or "-")
        check = "-" if m.numeric_ok is None else f"{m.max_abs_error:.2g}" + ("" if m.numeric_ok else " [red]✗[/red]")
        cells = [m.engine, m.level, fused, _ms(median(m.execute_ms)), _ms(median(m.model_run_ms)), check]
        table.add_row(*([escape(model), *cells] if several else cells))
    console.print(table)


def _count_change(shown: str, before: int, after: int) -> str:
    name = escape(shown)
    if after < before:
        return f"[red]{name} {before} → {after}[/red]"
    if after > before:
        return f"[green]{name} {before} → {after}[/green]"
    return f"{name} {after}"


def median(samples: list[float]) -> float | None:
    return statistics.median(samples) if samples else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )


class WaitFor(StrEnum):
    fusions = "fusions"
    all = "all"


# --- fusionwatch submit ----------------------------------------------------------------------------


def submit_command(
    models: Annotated[list[Path], typer.Argument(help="the commit's ONNX exports (.onnx, sent with the external data files beside it that it names, or .zip)")],
    server: Annotated[str, typer.Option("--server", help="the service, e.g. http://127.0.0.1:8000 (with a write token in FUSIONWATCH_TOKEN; FUSIONWATCH_WEBHOOK_SECRET signs the delivery)")],
    project: Annotated[str, typer.Option("--project", help="project name")],
    commit: Annotated[str | None, typer.Option("--commit", help="commit sha (in GitHub Actions and GitLab CI: the job's commit)")] = None,
    branch: Annotated[str | None, typer.Option("--branch", help="branch the commit is on (default: the CI's, else main)")] = None,
    parent: Annotated[list[str], typer.Option("--parent", help="parent commit sha (repeatable; in CI: the previous push, or a pull request's merge base)")] = [],  # noqa: B006
    message: Annotated[str | None, typer.Option("--message", help="commit message")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the run, then print the diff and alerts")] = False,
    fail_on_regression: Annotated[
        bool, typer.Option("--fail-on-regression", help="exit 1 when the run's verdict is regression (implies --wait)")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for the run")] = 3600.0,
    github_token: Annotated[str | None, typer.Option("--github-token", help="token for GitHub's API (default: GITHUB_TOKEN)")] = None,
    gitlab_token: Annotated[str | None, typer.Option("--gitlab-token", help="api-scope token for GitLab's API (default: FUSIONWATCH_GITLAB_TOKEN)")] = None,
    report: Annotated[bool, typer.Option("--report/--no-report", help="in GitHub Actions or GitLab CI, report the verdict to the forge (implies --wait)")] = True,
    wait_for: Annotated[WaitFor | None, typer.Option("--wait-for", help="fusions: return once every model's fused-op counts are known (seconds, before any timing), on their verdict; all: as --wait, reporting the fusion verdict to the forge first")] = None,
) -> None:
    """Send a commit's model exports to the service: a CI step.

    With --wait, print each model's fused counts and timings against its baseline, and the alerts.
    Inside GitHub Actions or GitLab CI the commit, branch and parents default to the job's, and the verdict is
    reported there (a check run or commit status, and one pull-request comment or merge-request note).
    Exit 2 on errors (unreachable server, a request refused, a job that failed); with
    --fail-on-regression, 1 on a regression (which wins over a failed job: it is the finding). Reporting to
    the forge never changes the exit code: its failures are warnings."""
    out = stdout_console()
    missing = [str(path) for path in models if not path.is_file()]
    if missing:
        fail(f"no such model file: {', '.join(missing)}")
    step = ci_step(project, err, github_token, gitlab_token) if report else None
    ref = commit_ref(step, commit, branch, parent, message)
    try:
        client = Server.at(server)
    except ServerError as error:
        fail(str(error))
    try:
        answer = client.submit(project, ref, models)
        out.print(
            f"run {answer['run_id']}: {answer['jobs']} job(s) for {', '.join(answer['models'])} at commit "
            f"{ref.sha[:12]} — {client.http.base_url}{answer['run_url']}",
            highlight=False, markup=False,
        )
        if not (wait or fail_on_regression or step or wait_for):
            return
        if wait_for is not None:
            run = _wait_with_progress(client, answer["run_url"], timeout, until=fusions_known)
            if run["state"] == "running":
                fusions_only = wait_for == WaitFor.fusions
                print_fusion_verdict(out, run, f"{client.http.base_url}/projects/{project}/commits/{ref.sha}")
                if step is not None:
                    step.report(str(client.http.base_url), as_fusion_verdict(run), client.diff(project, ref.sha),
                                final=fusions_only, timings_pending=True)
                if fusions_only:
                    _exit_on_fusions(run, fail_on_regression)
        run = _wait_with_progress(client, answer["run_url"], timeout)
        diff = client.diff(project, ref.sha)
        print_diff(out, diff)
        print_alerts(out, run["alerts"])
        if step is not None:
            step.report(str(client.http.base_url), run, diff)
    except ServerError as error:
        fail(str(error))
    finally:
        client.close()
        if step is not None:
            step.close()
    out.print(f"verdict: [bold]{run['verdict']}[/bold] ({run['jobs_done']} of {run['jobs_total']} jobs done)")
    for job in run["jobs"]:
        if job["state"] == "failed":
            err.print(f"[red]error:[/red] job {job['id']} ({escape(job['model'])}, {job['engine']}, {job['level']}) "
                      f"failed: {escape(str(job['error']))}", highlight=False)
    if fail_on_regression and run["verdict"] == "regression":
        raise typer.Exit(EXIT_REGRESSION)
    if run["jobs_failed"]:
        raise typer.Exit(EXIT_ERROR)


# --- fusionwatch show ------------------------------------------------------------------------------


def show_command(
    commit: Annotated[str, typer.Argument(help="commit sha (or its first 7 or more digits)")],
    server: Annotated[str, typer.Option("--server", help="the service, e.g. http://127.0.0.1:8000 (a token in FUSIONWATCH_TOKEN)")],
    project: Annotated[str, typer.Option("--project", help="project name")],
) -> None:
    """Print a commit's results against their baselines and the alerts raised at it, as submit --wait did:
    for a commit measured earlier, or whose timings followed a `submit --wait-for fusions`. Exit 2 when
    the server refuses (no such project or commit)."""
    out = stdout_console()
    try:
        client = Server.at(server)
    except ServerError as error:
        fail(str(error))
    try:
        diff, alerts = client.diff(project, commit), client.alerts_at(project, commit)
    except ServerError as error:
        fail(str(error))
    finally:
        client.close()
    print_diff(out, diff)
    print_alerts(out, alerts)
    out.print(f"commit page: {escape(str(client.http.base_url))}/projects/{escape(project)}/commits/{escape(diff['commit'])}",
              highlight=False)


def commit_ref(step: CiStep | None, sha: str | None, branch: str | None, parents: list[str],
               message: str | None) -> CommitRef:
    """The commit as given on the command line, what the CI job builds filling in what was not given."""
    if sha is not None:
        return CommitRef(sha, branch or (step.context.branch if step else "main"), parents, message or "")
    if step is None:
        fail("--commit is needed outside GitHub Actions and GitLab CI")
    built = step.commit()
    return CommitRef(built.sha, branch or built.branch, parents or built.parents,
                     built.message if message is None else message)


def fusions_known(run: dict[str, Any]) -> bool:
    """Every job's fused-op counts are known (a drop may be known before: the report waits for them all,
    seconds, so that it names every engine and level that lost it)."""
    return bool((run.get("fusions") or {}).get("done"))


def as_fusion_verdict(run: dict[str, Any]) -> dict[str, Any]:
    """The run as the forge reports it before its timings: its verdict the fusion verdict."""
    return {**run, "verdict": run["fusions"]["verdict"]}


def print_fusion_verdict(console: Console, run: dict[str, Any], page: str) -> None:
    lost = run["fusions"]["lost"]
    if lost:
        table = Table(title="fused ops lost (before any timing)", title_justify="left")
        for column in ("model", "engine", "level", "fused op", "before → after", "cause"):
            table.add_column(column)
        for entry in lost:
            cause = "explained when this job's result is in" if entry["pending"] else "see the alert"
            table.add_row(escape(entry["model"]), entry["engine"], entry["level"], escape(entry["op"]),
                          f"{entry['before']} → {entry['after']}", cause)
        console.print(table)
    print_alerts(console, [a for a in run["alerts"] if a["kind"] in (AlertKind.FUSION_REGRESSION, AlertKind.FUSION_CHANGE)])
    console.print(f"fusion verdict: [bold]{run['fusions']['verdict']}[/bold] (timings: {run['jobs_done']} of "
                  f"{run['jobs_total']} jobs done, to follow on {escape(page)})", highlight=False)


def _exit_on_fusions(run: dict[str, Any], fail_on_regression: bool) -> NoReturn:
    verdict = run["fusions"]["verdict"]
    if fail_on_regression and verdict == "regression":
        raise typer.Exit(EXIT_REGRESSION)
    raise typer.Exit(EXIT_ERROR if verdict == "failed" else 0)


def _wait_with_progress(client: Server, run_url: str, timeout_s: float,
                        until: Callable[[dict], bool] = lambda run: False) -> dict[str, Any]:
    """A progress bar on a terminal; in a CI log, which has none, a line each time a job finishes."""
    finished = [0]
    with progress(err) as bar:
        task = bar.add_task("measuring", total=None)

        def update(run: dict) -> None:
            done = run["jobs_done"] + run["jobs_failed"]
            bar.update(task, total=run["jobs_total"], completed=done)
            if not err.is_terminal and done != finished[0]:
                finished[0] = done
                err.print(f"measuring: {done} of {run['jobs_total']} jobs finished", highlight=False)

        return client.wait(run_url, timeout_s, update, until=until)


def fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(EXIT_ERROR)
