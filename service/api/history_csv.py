"""A project's history as CSV (`GET /projects/{p}/history` with `Accept: text/csv` or `?format=csv`): one row
per point of every series, long format, for a spreadsheet or pandas. Text a spreadsheet would run as a
formula (a commit message starting with `=`, `+`, `-` or `@`) is quoted with a leading apostrophe."""

from __future__ import annotations

import csv
import io
from typing import Any

import orjson

COLUMNS = ("model", "engine", "level", "machine_class", "commit", "branch", "timestamp", "message", "result_id",
           "engine_version", "graph_hash", "fused_ops_total", "fused_ops", "nodes_after", "median_ms", "p10_ms",
           "p90_ms", "mad_ms", "samples", "numeric_ok")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def history_csv(series: list[dict[str, Any]]) -> bytes:
    """`series` as `service.queries.history.history` returns them (each point rendered as JSON when stored)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for entry in series:
        for fragment in entry["points"].fragments:
            point = orjson.loads(fragment)
            fusions = point.get("fusions") or {}
            writer.writerow([
                _text(entry["model"]), entry["engine"], entry["level"], entry["machine_class"], point["commit"],
                _text(point.get("branch") or ""), point.get("timestamp") or "", _text(point.get("message") or ""),
                point.get("result_id"), _text(point.get("engine_version") or ""), point.get("graph_hash") or "",
                sum(fusions.values()), ";".join(f"{op}={count}" for op, count in sorted(fusions.items())),
                _number(point.get("nodes_after")), _number(point.get("median_ms")), _number(point.get("p10_ms")),
                _number(point.get("p90_ms")), _number(point.get("mad_ms")), _number(point.get("samples")),
                "" if point.get("numeric_ok") is None else str(point["numeric_ok"]).lower(),
            ])
    return out.getvalue().encode()


def wants_csv(format: str | None, accept: str) -> bool:
    if format is not None:
        return format.lower() == "csv"
    return "text/csv" in accept.lower()


def _text(value: str) -> str:
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def _number(value: Any) -> str:
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)
