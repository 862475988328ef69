"""Plotly figures for the model history page, as plain dicts the page embeds as JSON.

Timing: per series (engine × level) a p10–p90 band (two traces: p90, then p10 filled up to it) and a
median line; one more trace marks the commits that raised alerts. The x-axis is the commit, in commit
order, labelled by its short sha (the message on hover), and the fused levels (extended, layout, all)
have a panel and scale of their own: beside an unfused level several times slower they would be a flat
line. Fused ops: for one series, one step line per fused op, each lifted by a fraction of a count so
that two ops at the same count stay visible (the hover says the real count). Each point's customdata
is [commit page URL, sha, message, ...]; the page's script opens the URL on click.
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


FUSED_LEVELS = ("extended", "layout", "all")
OP_LIFT = 0.06  # counts: how far each further op's line is lifted so equal counts do not hide each other


def timing_figure(history: ModelHistory) -> dict[str, Any]:
    traces: list[dict[str, Any]] = []
    fused_panel = any(s.level in FUSED_LEVELS for s in history.series) and any(
        s.level not in FUSED_LEVELS for s in history.series)
    for index, series in enumerate(history.series):
        color = COLORS[index % len(COLORS)]
        timed = [p for p in series.points if p.median_ms is not None]
        x = [p.commit for p in timed]
        axis = "y2" if fused_panel and series.level in FUSED_LEVELS else "y"
        band = {"x": x, "type": "scatter", "mode": "lines", "line": {"width": 0, "color": color}, "yaxis": axis,
                "hoverinfo": "skip", "showlegend": False, "legendgroup": series.key}
        traces.append(band | {"name": f"{series.key} p90", "y": [p.p90_ms for p in timed]})
        traces.append(band | {"name": f"{series.key} p10", "y": [p.p10_ms for p in timed], "fill": "tonexty",
                              "fillcolor": _rgba(color, 0.18)})
        traces.append({
            "name": f"{series.key} median", "legendgroup": series.key, "type": "scatter", "mode": "lines", "yaxis": axis,
            "line": {"color": color, "width": 1.5}, "x": x, "y": [p.median_ms for p in timed],
            "customdata": [[commit_url(history.project, p.commit), p.commit[:12], p.message,
                            _num(p.p10_ms), _num(p.p90_ms)] for p in timed],
            "hovertemplate": f"<b>%{{customdata[1]}}</b> {series.key}<br>%{{customdata[2]}}<br>"
                             "median %{y:.3f} ms (p10 %{customdata[3]}, p90 %{customdata[4]})<extra></extra>",
        })
    # One marker per series and commit: alerts raised together (a fusion drop and the timing step it
    # caused) would otherwise hide each other under the pointer.
    markers: dict[tuple[str, str], list[dict[str, Any]]] = {}
    panels: dict[str, str] = {}
    for series in history.series:
        panels[series.key] = "y2" if fused_panel and series.level in FUSED_LEVELS else "y"
        for alert in series.alerts:
            if alert["median_ms"] is not None:
                markers.setdefault((series.key, alert["commit"]), []).append(alert)
    for axis in ("y", "y2"):  # one trace of markers per panel
        grouped = [(key, sorted(found, key=lambda a: list(ALERT_SYMBOLS).index(a["kind"])))
                   for key, found in markers.items() if panels[key[0]] == axis]
        if not grouped:
            continue
        traces.append({
            "name": "alerts", "type": "scatter", "mode": "markers", "yaxis": axis,
            "x": [sha for (_, sha), _ in grouped], "y": [found[0]["median_ms"] for _, found in grouped],
            "marker": {"size": 11, "color": "#d62728", "line": {"width": 2, "color": "#d62728"},
                       "symbol": [ALERT_SYMBOLS[found[0]["kind"]] for _, found in grouped]},
            "customdata": [[commit_url(history.project, sha), sha[:12],
                            "<br>".join(a["message"][:160] for a in found), ", ".join(a["kind"] for a in found), key]
                           for (key, sha), found in grouped],
            "hovertemplate": "<b>%{customdata[3]}</b> at %{customdata[1]} (%{customdata[4]})<br>"
                             "%{customdata[2]}<extra></extra>",
        })
    layout = _layout("SequentialExecutor::Execute (ms): median, p10–p90 band", "ms", _commits(history.series))
    if fused_panel:
        layout["yaxis"] |= {"domain": [0.56, 1.0], "title": {"text": "ms, unfused levels"}}
        layout["yaxis2"] = {"domain": [0.0, 0.44], "title": {"text": "ms, fused levels"}, "rangemode": "tozero",
                            "anchor": "x"}
        layout["xaxis"]["anchor"] = "y2"  # the commits under the lower panel, not across the gap between them
        layout["height"] = 520
    return {"data": traces, "layout": layout}


def fusion_figure(history: ModelHistory, series: Series | None) -> dict[str, Any]:
    traces = []
    if series is not None:
        for index, op in enumerate(series.fused_ops()):
            counts = [p.fusions.get(op, 0) for p in series.points]
            traces.append({
                "name": op.removeprefix("com.microsoft."), "type": "scatter", "mode": "lines+markers",
                "line": {"shape": "hv", "color": COLORS[index % len(COLORS)], "width": 2},
                "marker": {"size": 5},
                "x": [p.commit for p in series.points], "y": [c + index * OP_LIFT for c in counts],
                "customdata": [[commit_url(history.project, p.commit), p.commit[:12], p.message, c]
                               for p, c in zip(series.points, counts, strict=True)],
                "hovertemplate": f"<b>%{{customdata[1]}}</b> {op}: %{{customdata[3]}}<br>%{{customdata[2]}}<extra></extra>",
            })
    title = f"Fused ops, {series.key}" if series else "Fused ops"
    return {"data": traces, "layout": _layout(title, "count", _commits([series] if series else []))}


def _commits(series: list[Series]) -> list[str]:
    """Every commit the series have a point at, in commit order."""
    seqs: dict[str, int] = {}
    for one in series:
        for point in one.points:
            seqs[point.commit] = point.seq
    return sorted(seqs, key=seqs.__getitem__)


def _layout(title: str, unit: str, commits: list[str]) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}},
        "xaxis": {"title": {"text": "commit"}, "type": "category", "categoryorder": "array", "categoryarray": commits,
                  "tickvals": commits, "ticktext": [sha[:7] for sha in commits], "tickangle": -45},
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
        "hovermode": "closest",
        "margin": {"l": 55, "r": 10, "t": 40, "b": 45},
        "legend": {"orientation": "h", "y": -0.2},
        "height": 380,
    }


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
