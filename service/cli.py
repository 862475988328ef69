"""The `fusionwatch` command line: the optimizer's CLI contract, the service's launcher, its Celery worker
and its database. The measuring commands (`run`, `analyze`) live in cli_measure.py, the ones that talk to
a server (`submit`, `run --server`) in cli_client.py.

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
from rich.table import Table

from optimizer import LEVEL_NAMES, ModelLoadError, OptimizeReport, optimize
from service.cli_bisect import bisect_command
from service.cli_check import check_command
from service.cli_client import show_command, submit_command
from service.cli_measure import analyze_command, run_command
from service.cli_support import err, guarded, require_custom_ops, require_migrated, shown_url
from service.cli_tokens import token_app
from service.console import stdout_console

app = typer.Typer(help="Fusion-regression detection for ONNX models.", no_args_is_help=True)
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
    console = stdout_console()
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
    console = stdout_console()
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


app.command("run")(run_command)
app.command("analyze")(analyze_command)
app.command("submit")(submit_command)
app.command("show")(show_command)
app.command("check")(check_command)


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="where uploaded models are kept (default ./var)")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="API processes (more than one needs FUSIONWATCH_BROKER_URL)")
    ] = 1,
) -> None:
    """Start the HTTP service and its embedded worker.

    On the database in FUSIONWATCH_DATABASE_URL (run `fusionwatch db upgrade` first). With FUSIONWATCH_BROKER_URL, jobs go to Celery workers instead."""
    import os

    import uvicorn

    if data_dir is not None:
        os.environ["FUSIONWATCH_DATA_DIR"] = str(data_dir.resolve())

    from service.core.config import settings
    from service.core.logging import configure_logging

    require_migrated()
    require_custom_ops()
    if workers > 1 and not settings.broker_url:
        # Each API process would start its own embedded worker, and jobs measured side by side
        # slow each other down: the timings would compare the machine's load, not the models.
        err.print("[red]error:[/red] --workers above 1 needs FUSIONWATCH_BROKER_URL (jobs then go to "
                  "`fusionwatch worker`); without a broker the embedded worker runs in the one API process.")
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
        workers=workers,
    )


@app.command("worker")
def worker_command(
    queue: Annotated[str, typer.Option("--queue", help="machine class whose jobs this worker runs (cpu, cuda, ...)")] = "cpu",
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="jobs at once; 1 keeps timings clean")] = 1,
) -> None:
    """Start a Celery worker for the jobs of one machine class.

    It takes jobs from the broker in FUSIONWATCH_BROKER_URL and
    the database in FUSIONWATCH_DATABASE_URL (shared with `fusionwatch serve`, as is FUSIONWATCH_DATA_DIR)."""
    from service.core.config import settings
    from service.core.logging import configure_logging

    if not settings.broker_url:
        err.print("[red]error:[/red] FUSIONWATCH_BROKER_URL is not set; a worker needs the broker `fusionwatch serve` "
                  "sends jobs to (e.g. redis://127.0.0.1:6379/0). Without one, `fusionwatch serve` runs jobs itself.")
        raise typer.Exit(2)
    require_migrated()
    require_custom_ops()
    # The queue is the machine class: results this worker records are compared within that class.
    settings.machine_class = queue
    configure_logging(settings.log_level)
    from service.worker.celery_app import celery_app_for

    err.print(f"fusionwatch worker on queue {queue!r} of {shown_url(settings.broker_url)}, concurrency {concurrency}")
    # --quiet: no startup banner; what the worker has to say goes through the JSON logs at the set level.
    celery_app_for(settings.broker_url).worker_main([
        "--quiet", "worker", f"--queues={queue}", f"--concurrency={concurrency}", "--pool=prefork",
        f"--loglevel={settings.log_level}", "--without-mingle", "--without-gossip",
    ])


db_app = typer.Typer(help="The service's database: apply or undo schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")


@db_app.command("upgrade")
def db_upgrade_command(
    revision: Annotated[str, typer.Argument(help="migration to reach")] = "head",
) -> None:
    """Apply migrations to the database in FUSIONWATCH_DATABASE_URL (default: SQLite under var/)."""
    from service.commands.migrate_database import upgrade_database
    from service.core.config import settings

    reached = guarded(lambda: upgrade_database(settings.database_url, revision))
    err.print(f"database {shown_url(settings.database_url)} is at migration {reached}")


@db_app.command("downgrade")
def db_downgrade_command(
    revision: Annotated[str, typer.Argument(help='migration to return to: an id, "-1", or "base" (drops every table)')],
) -> None:
    """Undo migrations on the database in FUSIONWATCH_DATABASE_URL, down to REVISION."""
    from service.commands.migrate_database import downgrade_database
    from service.core.config import settings

    reached = guarded(lambda: downgrade_database(settings.database_url, revision))
    err.print(f"database {shown_url(settings.database_url)} is at migration {reached or 'none'}")


if __name__ == "__main__":
    app()
