"""`fusionwatch check`: expected fused-op counts as code, no server. Each model is optimized at each level
by each engine asked for, its fused-op counts compared with the checked-in expectations
(service/ci/expectations.py); every drop is printed with its cause — the near misses of the rule that
made the lost op and of the rules that produce that rule's anchor (optimizer/levels.py RULE_DEPENDENCIES),
with how often those fired — and the command exits 1 on any drop, 0 otherwise. `--update` writes what the
optimizer makes now and lists what that changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from optimizer import LEVEL_NAMES, ModelLoadError, OptimizeReport, optimize
from optimizer.fused_ops import fused_op_counts
from optimizer.levels import rule_dependencies
from service.adapters.engines.base import EngineError
from service.ci import expectations
from service.ci.expectations import Difference, ExpectationsError, Key
from service.console import stdout_console
from service.domain.fusion_changes import rule_for_op
from service.domain.vocabulary import ENGINES

EXIT_DROP, EXIT_ERROR = 1, 2
CHECKED_LEVELS = [level for level in LEVEL_NAMES if level != "disabled"]  # disabled fuses nothing by definition
NEAR_MISSES_SHOWN = 4

err = Console(stderr=True, soft_wrap=True)


def check_command(
    models: Annotated[list[Path], typer.Argument(help="ONNX model files")],
    expect: Annotated[Path, typer.Option("--expect", help="the expectations file")] = Path("fusionwatch.toml"),
    update: Annotated[bool, typer.Option("--update", help="write the counts measured now and list what changed")] = False,
    engine: Annotated[list[str], typer.Option("--engine", help=f"engine to check (repeatable): {', '.join(ENGINES)}")] = ["fusionwatch"],  # noqa: B006
    level: Annotated[list[str], typer.Option("--level", help="level to check (repeatable; default: all but disabled)")] = [],  # noqa: B006
) -> None:
    """Compare MODELs' fused-op counts with the expectations file: exit 1 on any drop, naming its cause."""
    unknown = [name for name in engine if name not in ENGINES] + [name for name in level if name not in LEVEL_NAMES]
    if unknown:
        _fail(f"unknown engine or level {unknown[0]!r}; engines: {', '.join(ENGINES)}; levels: {', '.join(LEVEL_NAMES)}")
    missing = [str(path) for path in models if not path.is_file()]
    if missing:
        _fail(f"no such model file: {', '.join(missing)}")
    try:
        expected = expectations.read(expect)
    except ExpectationsError as error:
        _fail(str(error))
    measured, reports = _measure(models, expect, list(dict.fromkeys(engine)), level or CHECKED_LEVELS)
    differences, new = expectations.compare(expected, measured)
    out = stdout_console()
    if update:
        expectations.write(expect, expected | measured)
        for difference in differences:
            out.print(f"{_where(difference.key)}: {difference.op} {difference.expected} → {difference.measured}",
                      highlight=False, markup=False)
        for key in new:
            out.print(f"{_where(key)}: added ({_counts(measured[key])})", highlight=False, markup=False)
        out.print(f"{expect}: {len(differences)} count(s) changed, {len(new)} model × engine × level added", highlight=False)
        return
    drops = [d for d in differences if d.dropped]
    for drop in drops:
        out.print(f"[red]drop[/red] {escape(_where(drop.key))}: {escape(drop.op)} {drop.expected} → {drop.measured}. "
                  f"{escape(cause(drop, reports[(drop.key[0], drop.key[2])]))}", highlight=False, soft_wrap=True)
    for rise in (d for d in differences if not d.dropped):
        out.print(f"[green]more[/green] {escape(_where(rise.key))}: {escape(rise.op)} {rise.expected} → {rise.measured}"
                  " (run with --update to expect it)", highlight=False)
    for key in new:
        out.print(f"[yellow]new[/yellow] {escape(_where(key))}: not in {escape(str(expect))} ({escape(_counts(measured[key]))});"
                  " run with --update to add it", highlight=False)
    checked = len(measured) - len(new)
    out.print(f"{checked} model × engine × level checked against {expect}: {len(drops)} drop(s)", highlight=False)
    if drops:
        raise typer.Exit(EXIT_DROP)


def cause(drop: Difference, report: OptimizeReport) -> str:
    """Why `drop.op` fell, in the alerts' words: the rule that makes it, the rules that make its anchor and
    how often they fired now, and their near misses in the model at this level."""
    rule = rule_for_op().get(drop.op)
    if rule is None:
        return f"No rule of ours makes {drop.op}; the count is the exporter's."
    producers = rule_dependencies(rule)
    what = "stopped firing" if drop.measured == 0 else "fired less"
    said = [f"{rule} {what} (fired {_fired(report, rule)} time(s) now)"]
    if producers:
        said.append("its anchor comes from " + ", ".join(f"{name} (fired {_fired(report, name)})" for name in producers))
    rules = [rule, *producers]
    misses = sorted((m for m in report.near_misses if m.rule in rules), key=lambda m: rules.index(m.rule))
    if misses:
        listed = "; ".join(m.message for m in misses[:NEAR_MISSES_SHOWN])
        more = f"; and {len(misses) - NEAR_MISSES_SHOWN} more" if len(misses) > NEAR_MISSES_SHOWN else ""
        said.append(f"near misses: {listed}{more}")
    else:
        said.append(f"no near misses of {', '.join(rules)}: the pattern's anchor is not in the graph any more")
    return "; ".join(said) + "."


def _measure(models: list[Path], expect: Path, engines: list[str], levels: list[str]):
    """Counts per (model, engine, level), and our optimizer's report per (model, level) for the causes."""
    measured: dict[Key, dict[str, int]] = {}
    reports: dict[tuple[str, str], OptimizeReport] = {}
    custom_ops = _custom_ops() if "onnxruntime" in engines else None
    for path in models:
        name = expectations.model_key(path, expect)
        for level in levels:
            try:
                reports[(name, level)] = report = optimize(path, level=level).report
                if "fusionwatch" in engines:
                    # What the optimized graph runs, as onnxruntime's counts are (optimizer/fused_ops.py).
                    measured[(name, "fusionwatch", level)] = fused_op_counts(report.ops_after)
                if "onnxruntime" in engines:
                    from service.adapters.engines.onnxruntime import optimized_counts

                    measured[(name, "onnxruntime", level)] = optimized_counts(path, level, custom_ops=custom_ops)[1]
            except (ModelLoadError, ValueError, EngineError) as error:
                _fail(f"{path} at level {level}: {error}")
    return measured, reports


def _custom_ops():
    from service.adapters.engines.custom_ops import load_custom_ops
    from service.core.config import settings

    try:
        return load_custom_ops(settings.custom_ops)
    except ValueError as error:
        _fail(str(error))


def _fired(report: OptimizeReport, rule: str) -> int:
    stats = report.rules.get(rule)
    return stats.fired if stats is not None else 0


def _where(key: Key) -> str:
    return " ".join(key)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op.rsplit('.', 1)[-1]} {count}" for op, count in counts.items()) or "no fused ops"


def _fail(message: str):
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(EXIT_ERROR)
