"""`fusionwatch analyze --compare`: the mark-all numeric check's per-node table, printed locally.

For each engine × level other than `disabled`: what each feed set found (the synthesized ones and any
`--feeds NAME=FILE.npz`), then the worst feed set's rows, the fusions' boundaries and every tensor that
diverged, in the unfused graph's order, the first divergence named as an alert would name it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.adapters.engines.compare import describe_row


def read_feed_set_options(options: list[str], model: Path) -> dict[str, dict[str, np.ndarray]]:
    """{name: arrays} from NAME=FILE.npz options, each validated against MODEL's inputs; a ValueError
    naming the option, the input and the problem."""
    import onnx

    from service.adapters.feed_sets import check_name, read_npz, validate
    from service.errors import Invalid

    sets: dict[str, dict[str, np.ndarray]] = {}
    if not options:
        return sets
    graph = onnx.load(str(model), load_external_data=False)
    for option in options:
        name, _, file = option.partition("=")
        if not file:
            name, file = Path(option).stem, option
        try:
            check_name(name)
            path = Path(file)
            arrays = read_npz(name, path.read_bytes())
            validate(name, arrays, graph)
        except (Invalid, OSError) as error:
            raise ValueError(f"--feeds {option}: {error}") from error
        sets[name] = arrays
    return sets


def print_comparisons(console: Console, measured: list[tuple[Path, Any]]) -> None:
    for _, m in measured:
        if m.level == "disabled":
            continue
        where = f"{m.engine} at {m.level}"
        checks = Table("feed set", "inputs", "status", "tensors", "diverging", "outputs max abs", "first divergence",
                       title=f"Numeric check, {where}: every surviving tensor against the unfused graph")
        for check in m.numeric_checks:
            inputs = ", ".join(f"{k} {v}" for k, v in (check.get("inputs") or {}).items())
            checks.add_row(
                escape(check["feed_set"]), escape(inputs),
                "ok" if check.get("ok") and check["status"] != "unavailable" else escape(check["status"] if check.get("ok") else "MISMATCH"),
                str(check.get("tensors", "")), str(check.get("diverging", "")), _number(check.get("max_abs")),
                escape(check.get("first") or check.get("reason") or ""),
            )  # fmt: skip
        console.print(checks)
        worst = m.divergence
        if not worst:
            continue
        if worst.get("reason"):
            console.print(f"{where}: {escape(worst['status'])}: {escape(worst['reason'])}")
        if worst.get("first"):
            console.print(f"[red]{escape(describe_row(worst['first'], worst['feed_set']))}[/red]")
        rows = Table("tensor", "op", "rule", "max abs", "max rel", "", title=f"Per node, {where}, feed set {escape(worst['feed_set'])}")
        for row in worst.get("rows", []):
            mark = row.get("nonfinite") or row.get("problem") or ("diverges" if row.get("diverges") else "")
            rows.add_row(
                escape(row["tensor"]), escape(row.get("fused_op") or row["op"]), escape(row.get("rule") or "-"),
                _number(row.get("max_abs")), _number(row.get("max_rel")), escape(mark),
                style="red" if row.get("diverges") else None,
            )  # fmt: skip
        console.print(rows)


def _number(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else f"{value:.2g}"
