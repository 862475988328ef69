"""The `fusionwatch` command line: the optimizer's CLI contract, the service's launcher and its database.

`fusionwatch optimize MODEL --json` prints exactly one JSON object on stdout; other tools
(CI scripts, the service's tests) rely on its keys: level, nodes_before, nodes_after,
ops_after, fusions, rules, graph_hash, near_misses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from optimizer import LEVEL_NAMES, ModelLoadError, OptimizeReport, optimize
from service.cli_bisect import bisect_command

app = typer.Typer(help="Fusion-regression detection for ONNX models.", no_args_is_help=True)
# soft_wrap: an error naming a long path stays on one line, whole, so it can be grepped and copied.
err = Console(stderr=True, soft_wrap=True)
app.command("bisect")(bisect_command)


@app.command("optimize")
def optimize_command(
    model: Annotated[Path, typer.Argument(help="ONNX model file")],
    level: Annotated[str, typer.Option("--level", "-l", help=f"one of {', '.join(LEVEL_NAMES)}")] = "all",
    disable: Annotated[list[str], typer.Option("--disable", help="rule name to skip (repeatable)")] = [],  # noqa: B006
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the optimized model here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    explain: Annotated[str | None, typer.Option("--explain", help="show why RULE did not fire")] = None,
    gelu_approximation: Annotated[bool, typer.Option("--gelu-approximation", help="allow Gelu -> FastGelu")] = False,
) -> None:
    """Optimize MODEL with fusionwatch's optimizer and report what fused and what nearly did."""
    try:
        result = optimize(
            model, level=level, disabled=disable, enable_gelu_approximation=gelu_approximation, output=output
        )
    except (ModelLoadError, ValueError) as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error
    report = result.report
    if explain is not None:
        known = set(report.rules)
        if explain not in known:
            err.print(f"[red]error:[/red] rule {explain!r} did not run at level {level}; ran: {', '.join(sorted(known))}")
            raise typer.Exit(2)
    if as_json:
        data = report.to_dict()
        if explain is not None:
            data["explain"] = [m.message for m in report.explain(explain)]
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    _print_report(report, explain)


def _print_report(report: OptimizeReport, explain: str | None) -> None:
    console = Console()
    console.print(
        f"level [bold]{report.level}[/bold]: {report.nodes_before} → {report.nodes_after} nodes "
        f"in {report.total_ms:.1f} ms, graph hash {report.graph_hash}"
    )
    fusions = Table("fused op", "count", title="Fusions")
    for op, count in report.fusions.items():
        fusions.add_row(op, str(count))
    console.print(fusions)
    rules = Table("rule", "fired", "ms", title="Rules")
    for name, stats in report.rules.items():
        rules.add_row(name, str(stats.fired), f"{stats.ms:.2f}")
    console.print(rules)
    misses = report.explain(explain) if explain else report.near_misses
    if misses:
        table = Table("rule", "anchor", "why it did not fire", title="Near misses")
        for miss in misses:
            table.add_row(miss.rule, miss.anchor, miss.reason)
        console.print(table)
    elif explain:
        console.print(f"{explain}: no near misses (it fired everywhere it found a candidate, or found none)")


@app.command("profile")
def profile_command(
    trace: Annotated[Path, typer.Argument(help="a profile JSON from onnxruntime or fusionwatch's runtime")],
    skip: Annotated[int, typer.Option("--skip", help="leave out the first N runs (warm-up)")] = 0,
    top: Annotated[int, typer.Option("--top", help="ops to list")] = 15,
) -> None:
    """Per-op kernel time, SequentialExecutor::Execute and model_run from a profile trace."""
    from runtime.profile_table import load_trace, profile_table

    try:
        table = profile_table(load_trace(trace), skip_runs=skip)
    except (OSError, ValueError) as error:
        err.print(f"[red]error:[/red] {trace}: {error}")
        raise typer.Exit(2) from error
    console = Console()
    console.print(
        f"{table.runs} run(s): model_run {table.median_model_run_ms:.2f} ms, "
        f"SequentialExecutor::Execute {table.median_execute_ms:.2f} ms (medians)"
    )
    ops = Table("op", "calls/run", "ms/run", "share", title="Kernel time per run")
    total = sum(t.us_per_run for t in table.ops) or 1.0
    for timing in table.ops[:top]:
        ops.add_row(
            timing.op, f"{timing.calls_per_run:g}", f"{timing.us_per_run / 1000:.3f}", f"{timing.us_per_run / total:.0%}"
        )
    console.print(ops)


@app.command("run")
def run_command(
    model: Annotated[Path, typer.Argument(help="ONNX model file")],
    engine: Annotated[str, typer.Option("--engine", "-e", help="fusionwatch, onnxruntime or all")] = "all",
    level: Annotated[
        str, typer.Option("--level", "-l", help=f"one of {', '.join(LEVEL_NAMES)}, or all-levels")
    ] = "all",
    runs: Annotated[int, typer.Option("--runs", help="timed runs, after the warm-up")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="runs left out of the timings")] = 2,
    threads: Annotated[int, typer.Option("--threads", help="intra-op threads; 0: the engine's default")] = 0,
    sequence_length: Annotated[
        int, typer.Option("--sequence-length", help="size of symbolic non-batch input dimensions")
    ] = 128,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Run MODEL through each engine at each level: fused ops and SequentialExecutor timings."""
    from service.engines import ENGINES, EngineError, run_engine

    engines = list(ENGINES) if engine == "all" else [engine]
    levels = list(LEVEL_NAMES) if level == "all-levels" else [level]
    run_options = {"runs": runs, "warmup": warmup, "threads": threads, "sequence_length": sequence_length}
    results = []
    # Level by level with the engines back to back, so a pair compared in the table ran close in time.
    for level_name in levels:
        for engine_name in engines:
            try:
                results.append(run_engine(engine_name, model, level_name, **run_options))
            except (EngineError, ValueError) as error:
                err.print(f"[red]error:[/red] {error}")
                raise typer.Exit(2) from error
    if as_json:
        json.dump({"model": str(model), "results": [r.to_dict() for r in results]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    console = Console()
    first = results[0]
    inputs = ", ".join(f"{name} {shape}" for name, shape in first.inputs.items())
    versions = ", ".join(dict.fromkeys(f"{r.engine} {r.engine_version}" for r in results))
    console.print(f"{model}: {first.runs} timed run(s) after {warmup} warm-up; inputs {inputs}; {versions}")
    table = Table(title="Medians, ms")
    for heading in ("engine", "level", "fused ops"):
        table.add_column(heading, no_wrap=True)
    for heading in ("Execute", "model_run"):
        table.add_column(heading, justify="right")
    for result in results:
        # One fused op per line, domain dropped: the table stays readable in 80 columns.
        fused = "\n".join(f"{op.rsplit('.', 1)[-1]} {count}" for op, count in result.fusions.items())
        if result.graph_error is not None:
            fused = "(graph unavailable)"
        table.add_row(
            result.engine,
            result.level,
            fused or "-",
            f"{result.execute_ms.median:.3f}",
            f"{result.model_run_ms.median:.3f}",
        )
    console.print(table)
    for result in results:
        if result.graph_error is not None:
            err.print(f"[yellow]note:[/yellow] {result.engine} at {result.level}: {result.graph_error}")


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="where uploaded models are kept (default ./var)")
    ] = None,
) -> None:
    """Start the HTTP service and its embedded worker on the database in FUSIONWATCH_DATABASE_URL
    (run `fusionwatch db upgrade` first). With FUSIONWATCH_BROKER_URL, jobs go to Celery workers instead."""
    import os

    import uvicorn

    if data_dir is not None:
        os.environ["FUSIONWATCH_DATA_DIR"] = str(data_dir.resolve())

    from service import migrate
    from service.core.config import settings
    from service.core.logging import configure_logging

    current = _guarded(migrate.current_revision)
    head = migrate.head_revision()
    if current != head:
        err.print(
            f"[red]error:[/red] database {_shown(settings.database_url)} is at migration {current or 'none'}, "
            f"this fusionwatch needs {head}; run `fusionwatch db upgrade`",
        )
        raise typer.Exit(2)
    configure_logging(settings.log_level)
    # Logging is quiet by default, so say where to look; uvicorn's own banner is an INFO line.
    err.print(f"fusionwatch serving on http://{host}:{port}/api/v1 (log level {settings.log_level})")
    uvicorn.run(
        "service.app:serving_app",
        factory=True,
        host=host,
        port=port,
        log_config=None,
        log_level=settings.log_level.lower(),
    )


db_app = typer.Typer(help="The service's database: apply or undo schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade_command(
    revision: Annotated[str, typer.Argument(help="migration to reach")] = "head",
) -> None:
    """Apply migrations to the database in FUSIONWATCH_DATABASE_URL (default: SQLite under var/)."""
    from service import migrate
    from service.core.config import settings

    _guarded(lambda: migrate.upgrade(settings.database_url, revision))
    err.print(f"database {_shown(settings.database_url)} is at migration {migrate.current_revision()}")


@db_app.command("downgrade")
def db_downgrade_command(
    revision: Annotated[str, typer.Argument(help='migration to return to: an id, "-1", or "base" (drops every table)')],
) -> None:
    """Undo migrations on the database in FUSIONWATCH_DATABASE_URL, down to REVISION."""
    from service import migrate
    from service.core.config import settings

    _guarded(lambda: migrate.downgrade(revision, settings.database_url))
    shown = _shown(settings.database_url)
    err.print(f"database {shown} is at migration {migrate.current_revision() or 'none'}")


def _guarded(database_step):
    """Run a step against the database; a bad URL, an unreachable server or an unknown revision
    becomes one error line and exit status 2, like the optimizer's bad inputs."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return database_step()
    except (CommandError, SQLAlchemyError, FileNotFoundError, ValueError) as error:
        err.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error


def _shown(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).render_as_string(hide_password=True)


if __name__ == "__main__":
    app()
