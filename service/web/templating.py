"""The Jinja2 environment the pages render with, and the filters their tables need."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urlencode

from fastapi.templating import Jinja2Templates

from service.domain.op_names import short_names
from service.usecases.repro import command

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

templates = Jinja2Templates(directory=TEMPLATES)


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}%"


def iso(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def utc(value: datetime | None) -> str:
    """What a reader without JavaScript sees; the page's script replaces it with local time."""
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "–"


def sparkline(values: list[float], width: int = 120, height: int = 24) -> str:
    """The `points` of an SVG polyline drawing `values` left to right, scaled to the box."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}" for i, v in enumerate(values))


def short_op(op: str, among: Iterable[str] = ()) -> str:
    """"com.microsoft.BiasGelu" → "BiasGelu": tables are read by people who know the domain; it stays
    where one of `among` (the table's other ops) has the same name in another domain."""
    return short_names([op, *among])[op]


def error(value: float | str | None) -> str:
    """A numeric check's error: "3.1e+00"; "inf" (shapes that differ) as stored."""
    if value is None:
        return "–"
    return value if isinstance(value, str) else f"{value:.2g}"


def query(params: dict) -> str:
    """A query string of the non-empty parameters, for shareable links that keep the page's filters."""
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


def repro_command(alert: dict) -> str:
    """The one line that shows a regression's repro pair doing and not doing the fusion."""
    repro = alert["cause"]["structure"]["repro"]
    stem = f"repro-{alert['id']}-{alert['op'].rsplit('.', 1)[-1]}"
    return command(repro["engine"], repro["level"], repro["op"], [f"{stem}-commit.onnx", f"{stem}-baseline.onnx"])


templates.env.filters.update(repro_command=repro_command, ms=ms, pct=pct, error=error, iso=iso, utc=utc, sparkline=sparkline, short_op=short_op,
                             query=query, combine_page=lambda params, page: dict(params, page=page), path=lambda s: quote(str(s), safe=""))


def script_json(value: object) -> str:
    """JSON to embed in a <script type="application/json"> block: '<', '>' and '&' escaped, so a commit
    message holding "</script>" stays data."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
