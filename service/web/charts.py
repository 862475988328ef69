"""Plotly figures for the model history page, as plain dicts the page embeds as JSON.

Timing: per series (engine × level) a p10–p90 band (two traces: p90, then p10 filled up to it) and a
median line; one more trace marks the commits that raised alerts. Fused ops: for one series, one step
line per fused op. Each point's customdata is [commit page URL, sha, message, ...]; the page's script
opens the URL on click.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from service.domain.vocabulary import AlertKind
from service.queries.series import ModelHistory, Series

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
# In the order a marker shows them when one commit raised several.
ALERT_SYMBOLS = {AlertKind.FUSION_REGRESSION: "x", AlertKind.NUMERIC_MISMATCH: "diamond", AlertKind.TIMING_REGRESSION: "triangle-up",
                 AlertKind.JOB_FAILURE: "square", AlertKind.FUSION_CHANGE: "circle-open"}


def commit_url(project: str, sha: str) -> str:
    return f"/projects/{quote(project, safe='')}/commits/{quote(sha, safe='')}"


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def timing_figure(history: ModelHistory) -> dict[str, Any]:
    traces: list[dict[str, Any]] = []
    for index, series in enumerate(history.series):
        color = COLORS[index % len(COLORS)]
        timed = [p for p in series.points if p.median_ms is not None]
        x = [p.seq for p in timed]
        band = {"x": x, "type": "scatter", "mode": "lines", "line": {"width": 0, "color": color},
                "hoverinfo": "skip", "showlegend": False, "legendgroup": series.key}
        traces.append(band | {"name": f"{series.key} p90", "y": [p.p90_ms for p in timed]})
        traces.append(band | {"name": f"{series.key} p10", "y": [p.p10_ms for p in timed], "fill": "tonexty",
                              "fillcolor": _rgba(color, 0.18)})
        traces.append({
            "name": f"{series.key} median", "legendgroup": series.key, "type": "scatter", "mode": "lines",
            "line": {"color": color, "width": 1.5}, "x": x, "y": [p.median_ms for p in timed],
            "customdata": [[commit_url(history.project, p.commit), p.commit[:12], p.message,
                            _num(p.p10_ms), _num(p.p90_ms)] for p in timed],
            "hovertemplate": f"<b>%{{customdata[1]}}</b> {series.key}<br>%{{customdata[2]}}<br>"
                             "median %{y:.3f} ms (p10 %{customdata[3]}, p90 %{customdata[4]})<extra></extra>",
        })
    # One marker per series and commit: alerts raised together (a fusion drop and the timing step it
    # caused) would otherwise hide each other under the pointer.
    markers: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for series in history.series:
        for alert in series.alerts:
            if alert["median_ms"] is not None:
                markers.setdefault((series.key, alert["commit"]), []).append(alert)
    if markers:
        grouped = [(key, sorted(found, key=lambda a: list(ALERT_SYMBOLS).index(a["kind"])))
                   for key, found in markers.items()]
        traces.append({
            "name": "alerts", "type": "scatter", "mode": "markers",
            "x": [found[0]["seq"] for _, found in grouped], "y": [found[0]["median_ms"] for _, found in grouped],
            "marker": {"size": 11, "color": "#d62728", "line": {"width": 2, "color": "#d62728"},
                       "symbol": [ALERT_SYMBOLS[found[0]["kind"]] for _, found in grouped]},
            "customdata": [[commit_url(history.project, sha), sha[:12],
                            "<br>".join(a["message"][:160] for a in found), ", ".join(a["kind"] for a in found), key]
                           for (key, sha), found in grouped],
            "hovertemplate": "<b>%{customdata[3]}</b> at %{customdata[1]} (%{customdata[4]})<br>"
                             "%{customdata[2]}<extra></extra>",
        })
    layout = _layout("SequentialExecutor::Execute (ms): median, p10–p90 band", "ms")
    return {"data": traces, "layout": layout}


def fusion_figure(history: ModelHistory, series: Series | None) -> dict[str, Any]:
    traces = []
    if series is not None:
        for index, op in enumerate(series.fused_ops()):
            traces.append({
                "name": op.removeprefix("com.microsoft."), "type": "scatter", "mode": "lines",
                "line": {"shape": "hv", "color": COLORS[index % len(COLORS)], "width": 2},
                "x": [p.seq for p in series.points], "y": [p.fusions.get(op, 0) for p in series.points],
                "customdata": [[commit_url(history.project, p.commit), p.commit[:12], p.message] for p in series.points],
                "hovertemplate": f"<b>%{{customdata[1]}}</b> {op}: %{{y}}<br>%{{customdata[2]}}<extra></extra>",
            })
    title = f"Fused ops, {series.key}" if series else "Fused ops"
    return {"data": traces, "layout": _layout(title, "count")}


def _layout(title: str, unit: str) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}},
        "xaxis": {"title": {"text": "commit (arrival order)"}},
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
        "hovermode": "closest",
        "margin": {"l": 55, "r": 10, "t": 40, "b": 45},
        "legend": {"orientation": "h", "y": -0.2},
        "height": 380,
    }


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
