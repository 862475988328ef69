"""The CLI's local measurements: `fusionwatch run` (each engine at each level; with --server, posted to
/results as one commit's document) and `fusionwatch analyze` (everything, no server).

Both measure in this Python environment, with whatever onnxruntime it holds: that is how an engine's
own commits are tracked (install onnxruntime 1.19, 1.20, 1.21 in turn, post each as a commit).
`run --server` and `analyze` go through `service.adapters.measure.measure`, the worker's own measurement, so a
posted result carries what a queued job's would: fused counts, every sample, near misses, the numeric
check against level `disabled`. `run` without --server keeps its original, lighter output (one
engine run per pair, no numeric check).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from optimizer import LEVEL_NAMES, ModelLoadError
from service.ci.report import ci_step
from service.cli_client import (
    FAILING_KINDS,
    CommitRef,
    Server,
    ServerError,
    commit_ref,
    err,
    fail,
    median,
    print_alerts,
    print_measurements,
    progress,
)
from service.console import stdout_console
from service.domain.op_names import short_names
from service.domain.protocol import Protocol
from service.domain.vocabulary import NOT_FINDINGS, AlertKind

ALL_LEVELS = "all-levels"
MAX_REMEASURE_ROUNDS = 4  # re-measurements of one commit in client mode, at most

EngineOption = Annotated[str, typer.Option("--engine", "-e", help="fusionwatch, onnxruntime or all")]
LevelOption = Annotated[str, typer.Option("--level", "-l", help=f"one of {', '.join(LEVEL_NAMES)}, or {ALL_LEVELS}")]
DisableOption = Annotated[
    list[str], typer.Option("--disable", help="optimizer rule to switch off in both engines, by ONNX Runtime's name (repeatable)")
]
RunsOption = Annotated[int, typer.Option("--runs", help="timed runs, after the warm-up")]
WarmupOption = Annotated[int, typer.Option("--warmup", help="runs left out of the timings")]
# The service measures with its protocol's thread count; `analyze` and `run` default to it, so their
# first table is not a loaded machine's all-threads timing set against the service's one-thread one.
PROTOCOL_THREADS = Protocol().threads
ThreadsOption = Annotated[int, typer.Option("--threads", help="intra-op threads (default: the service's protocol, 1, so timings compare with its jobs'); 0: the engine's default, every core")]
SequenceOption = Annotated[int, typer.Option("--sequence-length", help="size of symbolic non-batch input dimensions")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object")]


def run_command(
    models: Annotated[list[Path], typer.Argument(help="ONNX model file(s)")],
    engine: EngineOption = "all",
    level: LevelOption = "all",
    disable: DisableOption = [],  # noqa: B006
    runs: RunsOption = 10,
    warmup: WarmupOption = 2,
    threads: ThreadsOption = PROTOCOL_THREADS,
    sequence_length: SequenceOption = 128,
    as_json: JsonOption = False,
    server: Annotated[str | None, typer.Option("--server", help="post the results to this service (with a write token in FUSIONWATCH_TOKEN)")] = None,
    project: Annotated[str | None, typer.Option("--project", help="project name (with --server)")] = None,
    commit: Annotated[str | None, typer.Option("--commit", help="commit sha the results are for (with --server; in GitHub Actions and GitLab CI: the job's)")] = None,
    branch: Annotated[str | None, typer.Option("--branch", help="branch of the commit (default: the CI's, else main)")] = None,
    parent: Annotated[list[str], typer.Option("--parent", help="parent commit sha (repeatable)")] = [],  # noqa: B006
    message: Annotated[str | None, typer.Option("--message", help="commit message")] = None,
    fail_on_regression: Annotated[
        bool, typer.Option("--fail-on-regression", help="with --server: exit 1 on a fusion or timing regression")
    ] = False,
    github_token: Annotated[str | None, typer.Option("--github-token", help="token for GitHub's API (default: GITHUB_TOKEN)")] = None,
    gitlab_token: Annotated[str | None, typer.Option("--gitlab-token", help="api-scope token for GitLab's API (default: FUSIONWATCH_GITLAB_TOKEN)")] = None,
    report: Annotated[bool, typer.Option("--report/--no-report", help="with --server in GitHub Actions or GitLab CI: report the verdict to the forge")] = True,
    baseline_python: Annotated[Path | None, typer.Option("--baseline-python", help="with --server: the Python of the baseline's environment (the engine's previous version); each model is timed there and here alternately, and the server decides on the pairs")] = None,
    baseline_commit: Annotated[str | None, typer.Option("--baseline-commit", help="with --baseline-python: the commit that environment is (default: the first --parent)")] = None,
) -> None:
    """Run each MODEL through each engine at each level: fused ops and SequentialExecutor timings.

    With --server, post them to the service as commit --commit and print the alerts they raised. With
    --baseline-python as well, each timing is paired with the baseline environment's, block by block."""
    engines, levels = _engines(engine), _levels(level)
    if server is None:
        if project or commit or fail_on_regression:
            fail("--project, --commit and --fail-on-regression need --server")
        _print_local_runs(models, engines, levels, disable, runs, warmup, threads, sequence_length, as_json)
        return
    if not project:
        fail("--server needs --project")
    step = ci_step(project, err, github_token, gitlab_token) if report else None
    ref = commit_ref(step, commit, branch, parent, message)
    if baseline_python is not None and not (baseline_commit or ref.parents):
        fail("--baseline-python needs --baseline-commit (or a --parent: the first is taken)")
    measured = measure_all(models, engines, levels, disable, runs, warmup, threads, sequence_length)
    if baseline_python is not None:
        measured = pair_all(measured, baseline_python, baseline_commit or ref.parents[0], threads, sequence_length, warmup,
                            tuple(disable))
    document = results_document(project, ref, measured)
    try:
        client = Server.at(server)
        try:
            reply = client.post_results(document)
            # A suspected timing alert waits for a second measurement (service/usecases/remeasure.py): take
            # it now, so this commit's verdict does not wait for the next one.
            # A re-measurement that leaves its alert suspected asks for one more (the server caps them at
            # TimingPolicy.remeasures; this bound only keeps a server that kept asking from looping us).
            suspected = _suspected(reply)
            for _ in range(MAX_REMEASURE_ROUNDS):
                again = [(path, m) for path, m in measured if (path.name, m.engine, m.level) in suspected]
                if not again:
                    break
                remeasured = measure_all(list(dict.fromkeys(p for p, _ in again)), engines, levels, disable, runs, warmup, threads,
                                         sequence_length, only={(p.name, m.engine, m.level) for p, m in again})
                settled_reply = client.post_results(results_document(project, ref, remeasured))
                settled = {a["id"]: a for a in settled_reply["alerts"]}
                reply["alerts"] = [settled.get(a["id"], a) for a in reply["alerts"]]
                suspected = _suspected(settled_reply)
            if step is not None:
                step.report(str(client.http.base_url), client.run(reply["run_url"]), client.diff(project, ref.sha))
        finally:
            client.close()
            if step is not None:
                step.close()
    except ServerError as error:
        fail(str(error))
    if as_json:
        _dump({**reply, "results": document["results"]})
    else:
        console = stdout_console()
        print_measurements(console, [(path.name, m) for path, m in measured])
        console.print(f"posted commit {ref.sha[:12]} as run {reply['run_id']}: {server.rstrip('/')}{reply['run_url']}",
                      highlight=False, markup=False)
        print_alerts(console, reply["alerts"])
    # A suspected timing alert is not a finding yet (service/usecases/timing_alerts.py); its confirmation is.
    if fail_on_regression and any(a["kind"] in FAILING_KINDS and a["state"] not in NOT_FINDINGS for a in reply["alerts"]):
        raise typer.Exit(1)


def results_document(project: str, commit: CommitRef, measured: list[tuple[Path, Any]]) -> dict[str, Any]:
    """The POST /results document for measurements made here: one result per model × engine × level,
    the model named by its file name (the series a model repository's uploads of that file also feed)."""
    from service.adapters.machine import describe_machine
    from service.core.config import settings
    from service.usecases.results import MAX_NEAR_MISSES

    return {
        "project": project,
        "commit": commit.to_json(),
        "machine": describe_machine(settings.machine_class),
        # The server keeps a result's first MAX_NEAR_MISSES near misses and refuses a document with more.
        # A paired measurement goes as its "baseline" samples, by position with execute_ms (the server
        # decides on them).
        "results": [{"model": path.name, **_without_paired(asdict(m)), "near_misses": m.near_misses[:MAX_NEAR_MISSES],
                     **_baseline(m)} for path, m in measured],
    }


def _without_paired(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if key != "paired"}


def _baseline(m: Any) -> dict[str, Any]:
    if not m.paired:
        return {}
    return {"baseline": {"commit": m.paired["baseline_commit"], "execute_ms": list(m.paired["baseline_ms"])}}


def analyze_command(
    model: Annotated[Path, typer.Argument(help="ONNX model file")],
    engine: EngineOption = "all",
    level: LevelOption = ALL_LEVELS,
    disable: DisableOption = [],  # noqa: B006
    runs: RunsOption = 10,
    warmup: WarmupOption = 2,
    threads: ThreadsOption = PROTOCOL_THREADS,
    sequence_length: SequenceOption = 128,
    as_json: JsonOption = False,
    compare: Annotated[bool, typer.Option("--compare", help="print the numeric check's per-node error table")] = False,
    feeds: Annotated[
        list[str], typer.Option("--feeds", help="NAME=FILE.npz: your own inputs, checked beside the synthesized ones (repeatable)")
    ] = [],  # noqa: B006
    show_all: Annotated[bool, typer.Option("--all", help="list every near miss, also anchors that failed "
                                                         "their rule's first check")] = False,
) -> None:
    """Everything about MODEL, locally, no server: levels × engines, fused ops, timings, near misses.

    Each level × engine's fused ops, median timings and numeric check against level `disabled`, and the near misses of rules that nearly fired.
    With --compare, each level's every surviving tensor against the unfused graph, per feed set, and the worst one's per-node table."""
    from service.cli_compare import print_comparisons, read_feed_set_options

    try:
        feed_sets = read_feed_set_options(feeds, model)
    except ValueError as error:
        fail(str(error))
    measured = measure_all([model], _engines(engine), _levels(level), disable, runs, warmup, threads, sequence_length,
                           feed_sets=feed_sets)
    if as_json:
        results = [{**asdict(m), "execute_median_ms": median(m.execute_ms), "model_run_median_ms": median(m.model_run_ms)}
                   for _, m in measured]
        _dump({"model": str(model), "results": results})
        return
    console = stdout_console()
    first = measured[0][1]
    inputs = ", ".join(f"{name} {shape}" for name, shape in first.inputs.items())
    versions = ", ".join(dict.fromkeys(f"{m.engine} {m.engine_version}" for _, m in measured))
    console.print(f"{model}: {runs} timed run(s) after {warmup} warm-up; inputs {inputs}; {versions}", highlight=False, markup=False)
    print_measurements(console, [(model.name, m) for _, m in measured])
    if compare:
        print_comparisons(console, measured)
    # Our optimizer's near misses are the same for both engines at a level; list each once with its levels.
    from service.usecases.near_miss_order import failed_first_check

    misses: dict[tuple[str, str, str], list[str]] = {}
    steps: dict[tuple[str, str, str], dict[str, Any]] = {}
    for _, m in measured:
        for miss in m.near_misses:
            key = (miss["rule"], miss["anchor"], miss["reason"])
            at = misses.setdefault(key, [])
            steps.setdefault(key, miss)
            if m.level not in at:
                at.append(m.level)
    if not misses:
        console.print("no near misses: every rule fired wherever its pattern started to match")
        return
    # Anchors that are merely not where a pattern starts say nothing about this model: counted, not listed.
    counted: dict[str, int] = {}
    table = Table("rule", "anchor", "why it did not fire", "levels", title="Near misses")
    for key, at in misses.items():
        if not show_all and failed_first_check(steps[key]):
            counted[key[0]] = counted.get(key[0], 0) + 1
            continue
        table.add_row(escape(key[0]), escape(key[1]), escape(key[2]), ", ".join(at))
    if table.row_count:
        console.print(table)
    if counted:
        what = ", ".join(f"{rule} {n}" for rule, n in counted.items())
        console.print(f"and {sum(counted.values())} anchor(s) that failed their rule's first check ({what}); "
                      "--all lists them", highlight=False, markup=False)


def _suspected(reply: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(model, engine, level) of each suspected timing alert in a POST /results reply."""
    return {(a["model"], a["engine"], a["level"]) for a in reply["alerts"]
            if a["kind"] == AlertKind.TIMING_REGRESSION and a["state"] == "suspected"}


def pair_all(measured: list[tuple[Path, Any]], python: Path, baseline_commit: str, threads: int, sequence_length: int,
             warmup: int, disabled: tuple[str, ...] = ()) -> list[tuple[Path, Any]]:
    """Each measurement's timing paired with the baseline environment's (service/adapters/paired_measure.py):
    its `execute_ms` become the candidate's block levels, beside the baseline's as `paired`."""
    from dataclasses import replace

    from service.adapters.engines import EngineError
    from service.adapters.engines.custom_ops import load_custom_ops
    from service.adapters.paired_measure import measure_against_environment
    from service.core.config import settings

    protocol = Protocol(threads=threads, sequence_length=sequence_length, warmup=warmup)
    custom_ops = load_custom_ops(settings.custom_ops)
    paired = []
    with progress(err) as bar:
        task = bar.add_task("pairing with the baseline", total=len(measured))
        for path, m in measured:
            bar.update(task, description=f"{path.name} {m.engine} {m.level} against {python}")
            try:
                timing, version = measure_against_environment(python, path, m.engine, m.level, protocol,
                                                              custom_ops=custom_ops, disabled=disabled)
            except (EngineError, ModelLoadError) as error:
                fail(str(error))
            pairs = {"baseline_commit": baseline_commit, "baseline_ms": timing.baseline_ms,
                     "candidate_ms": timing.candidate_ms, "baseline_engine_version": version}
            paired.append((path, replace(m, execute_ms=list(timing.candidate_ms), paired=pairs)))
            bar.advance(task)
    return paired


def measure_all(models, engines, levels, disable, runs, warmup, threads, sequence_length,
                only: set[tuple[str, str, str]] | None = None, feed_sets=None) -> list[tuple[Path, Any]]:
    """Every model × level × engine through service.adapters.measure (or those of them in `only`, by model file
    name), engines back to back within a level so a pair compared in a table ran close in time; a Rich
    progress bar on stderr."""
    from pydantic import ValidationError

    from service.adapters.engines import EngineError
    from service.adapters.engines.custom_ops import load_custom_ops
    from service.adapters.measure import measure
    from service.core.config import settings
    from service.domain.protocol import Protocol

    try:
        protocol = Protocol(engines=engines, levels=levels, runs=runs, warmup=warmup, threads=threads,
                            sequence_length=sequence_length)
        custom_ops = load_custom_ops(settings.custom_ops)
    except ValidationError as error:
        first = error.errors()[0]
        fail(f"--{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}")
    except ValueError as error:
        fail(str(error))
    pairs = [(path, lvl, eng) for path in models for lvl in levels for eng in engines
             if only is None or (path.name, eng, lvl) in only]
    measured = []
    with progress(err) as bar:
        task = bar.add_task("measuring", total=len(pairs))
        for path, lvl, eng in pairs:
            bar.update(task, description=f"{path.name} {eng} {lvl}")
            try:
                measured.append((path, measure(path, eng, lvl, protocol, disabled_rules=tuple(disable),
                                               custom_ops=custom_ops, feed_sets=feed_sets)))
            except (EngineError, ModelLoadError, ValueError) as error:
                fail(f"{path}: {error}" if str(path) not in str(error) else str(error))
            bar.advance(task)
    return measured


def _print_local_runs(models, engines, levels, disable, runs, warmup, threads, sequence_length, as_json) -> None:
    from service.adapters.engines import EngineError, run_engine

    options = {"runs": runs, "warmup": warmup, "threads": threads, "sequence_length": sequence_length,
               "disabled": tuple(disable)}
    per_model = []
    for model in models:
        results = []
        for level_name in levels:
            for engine_name in engines:
                try:
                    results.append(run_engine(engine_name, model, level_name, **options))
                except (EngineError, ValueError) as error:
                    fail(str(error))
        per_model.append((model, results))
    if as_json:
        # One model: {"model", "results"}, the shape scripts already read; several: {"models": [that, ...]}.
        entries = [{"model": str(model), "results": [r.to_dict() for r in results]} for model, results in per_model]
        _dump(entries[0] if len(entries) == 1 else {"models": entries})
        return
    for model, results in per_model:
        _print_engine_results(model, results, warmup)


def _print_engine_results(model: Path, results: list, warmup: int) -> None:
    console = stdout_console()
    first = results[0]
    inputs = ", ".join(f"{name} {shape}" for name, shape in first.inputs.items())
    versions = ", ".join(dict.fromkeys(f"{r.engine} {r.engine_version}" for r in results))
    console.print(f"{model}: {first.runs} timed run(s) after {warmup} warm-up; inputs {inputs}; {versions}", markup=False)
    table = Table(title="Medians, ms")
    for heading in ("engine", "level", "fused ops"):
        table.add_column(heading, no_wrap=True)
    for heading in ("Execute", "model_run"):
        table.add_column(heading, justify="right")
    for result in results:
        # One fused op per line, domain dropped: the table stays readable in 80 columns.
        names = short_names(result.fusions)
        fused = escape("\n".join(f"{names[op]} {count}" for op, count in result.fusions.items()))
        if result.graph_error is not None:
            fused = "(graph unavailable)"
        table.add_row(
            result.engine, result.level, fused or "-", f"{result.execute_ms.median:.3f}", f"{result.model_run_ms.median:.3f}"
        )
    console.print(table)
    for result in results:
        if result.graph_error is not None:
            err.print(f"[yellow]note:[/yellow] {result.engine} at {result.level}: {escape(result.graph_error)}")


def _engines(engine: str) -> list[str]:
    from service.adapters.engines import ENGINES

    if engine == "all":
        return list(ENGINES)
    if engine not in ENGINES:
        fail(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}, or all")
    return [engine]


def _levels(level: str) -> list[str]:
    if level == ALL_LEVELS:
        return list(LEVEL_NAMES)
    if level not in LEVEL_NAMES:
        fail(f"unknown optimization level {level!r}; choose one of {', '.join(LEVEL_NAMES)}, or {ALL_LEVELS}")
    return [level]


def _dump(data: dict[str, Any]) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
