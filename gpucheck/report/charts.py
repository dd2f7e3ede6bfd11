"""plotly figures shared by the sections: a status heatmap (discrete colours), bars against
limits, lines over time, points with outliers. Every string that reaches plotly is data
escaped with page.pt(); the figures are plain dicts (plotly.js's JSON)."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..core.jsonvalue import JsonValue
from .page import NO_RESULT_COLOR, STATUS_COLORS, Figure, pt

STATUS_ORDER = ("skip", "pass", "warn", "unexamined", "error", "timeout", "unreachable", "fail")
MAX_TICKS = 60  # past this many categories an axis shows no tick labels (hover names them)


def _discrete_scale(statuses: Sequence[str]) -> list[JsonValue]:
    k = len(statuses)
    scale: list[JsonValue] = []
    for i, s in enumerate(statuses):
        color = STATUS_COLORS.get(s, NO_RESULT_COLOR)
        scale += [[i / k, color], [(i + 1) / k, color]]
    return scale


def status_heatmap(xs: list[str], ys: list[str], cells: Mapping[tuple[str, str], str],
                   hover: Mapping[tuple[str, str], str], *, title: str, x_title: str = "",
                   highlight_x: Sequence[str] = ()) -> Figure:
    """Rows `ys`, columns `xs` (plain text, escaped here); cells[(y, x)] a status; hover[(y, x)]
    plotly text (already escaped). Cells without a status are left blank."""
    index = {s: i for i, s in enumerate(STATUS_ORDER)}
    ex = [pt(x) for x in xs]
    data: list[dict[str, JsonValue]] = [{
        "type": "heatmap", "x": list(ex), "y": [pt(y) for y in ys],
        "z": [[index.get(cells.get((y, x)) or "") for x in xs] for y in ys],
        "text": [[hover.get((y, x), "") for x in xs] for y in ys],
        "hovertemplate": "%{text}<extra></extra>", "zmin": -0.5, "zmax": len(STATUS_ORDER) - 0.5,
        "colorscale": _discrete_scale(STATUS_ORDER), "showscale": False, "xgap": 1 if len(xs) <= 200 else 0,
        "ygap": 1}]
    xaxis: dict[str, JsonValue] = {"type": "category", "title": {"text": pt(x_title)}, "tickangle": -45,
                                   "tickvals": list(ex),
                                   "ticktext": [f"<b>{pt(x)}</b>" if x in set(highlight_x) else pt(x) for x in xs],
                                   "automargin": True}
    if len(xs) > MAX_TICKS:
        xaxis.update(showticklabels=False, tickvals=None, ticktext=None)
    layout: dict[str, JsonValue] = {"title": {"text": pt(title)}, "xaxis": xaxis,
                                    "yaxis": {"type": "category", "autorange": "reversed", "automargin": True}}
    return Figure(data, layout, height=max(220, 120 + 22 * len(ys)))


def bars_against_limits(labels: list[str], values: Sequence[float | None], statuses: list[str], *, title: str,
                        unit: str, limits: Sequence[tuple[str, float, str]] = ()) -> Figure:
    """One bar per label coloured by its status, with horizontal lines (name, value, colour)."""
    data: list[dict[str, JsonValue]] = [{
        "type": "bar", "x": [pt(x) for x in labels], "y": list(values), "name": pt(title),
        "marker": {"color": [STATUS_COLORS.get(s, "#607d8b") for s in statuses]},
        "text": [pt(s.upper()) for s in statuses], "hovertemplate": "%{x}: %{y:.4g} " + pt(unit) + " (%{text})<extra></extra>",
        "showlegend": False}]
    for name, value, color in limits:
        data.append({"type": "scatter", "mode": "lines", "x": [pt(labels[0]), pt(labels[-1])], "y": [value, value],
                     "name": pt(f"{name} {value:.4g} {unit}"), "line": {"color": color, "dash": "dash", "width": 2}})
    layout: dict[str, JsonValue] = {"title": {"text": pt(title)},
                                    "yaxis": {"title": {"text": pt(unit)}, "rangemode": "tozero"},
                                    "xaxis": {"type": "category"}, "legend": {"orientation": "h", "y": -0.25}}
    return Figure(data, layout, height=360)


def lines_over_time(series: Mapping[str, list[tuple[str, float]]], *, title: str, unit: str) -> Figure:
    """One line per subject: [(time, value)]."""
    data: list[dict[str, JsonValue]] = [{"type": "scatter", "mode": "lines+markers", "name": pt(name),
                                         "x": [t for t, _ in pts], "y": [v for _, v in pts]}
                                        for name, pts in series.items()]
    layout: dict[str, JsonValue] = {"title": {"text": pt(title)}, "yaxis": {"title": {"text": pt(unit)}},
                                    "xaxis": {"type": "date"}, "legend": {"orientation": "h", "y": -0.25}}
    return Figure(data, layout, height=360)


def points_with_outliers(points: list[tuple[str, str, float]], outliers: set[tuple[str, str]], *, title: str,
                         unit: str, median: float | None = None, limit: float | None = None) -> Figure:
    """Per-node values: points (node, subject, value); those in `outliers` red and named; the
    median and the outlier limit as lines; a box of the distribution on the right."""
    nodes = list(dict.fromkeys(n for n, _, _ in points))
    normal = [p for p in points if (p[0], p[1]) not in outliers]
    bad = [p for p in points if (p[0], p[1]) in outliers]

    def trace(pts: list[tuple[str, str, float]], name: str, color: str, size: int) -> dict[str, JsonValue]:
        return {"type": "scatter", "mode": "markers", "name": pt(name), "x": [pt(n) for n, _, _ in pts],
                "y": [v for _, _, v in pts], "text": [pt(f"{n} {s}") for n, s, _ in pts],
                "marker": {"color": color, "size": size},
                "hovertemplate": "%{text}: %{y:.4g} " + pt(unit) + "<extra></extra>"}

    data = [trace(normal, "value", "#1e88e5", 5), trace(bad, "outlier", STATUS_COLORS["fail"], 10)]
    data.append({"type": "box", "y": [v for _, _, v in points], "name": pt("all"), "xaxis": "x2",
                 "marker": {"color": "#546e7a"}, "boxpoints": False, "showlegend": False})
    ex = [pt(n) for n in nodes]
    for name, value, color in (("median", median, "#546e7a"), ("outlier limit", limit, STATUS_COLORS["fail"])):
        if value is not None and ex:
            data.append({"type": "scatter", "mode": "lines", "x": [ex[0], ex[-1]], "y": [value, value],
                         "name": pt(f"{name} {value:.4g}"), "line": {"color": color, "dash": "dot"}})
    xaxis: dict[str, JsonValue] = {"type": "category", "domain": [0, 0.86], "tickangle": -45,
                                   "title": {"text": "node"}, "automargin": True}
    if len(nodes) > MAX_TICKS:
        xaxis["showticklabels"] = False
    layout: dict[str, JsonValue] = {"title": {"text": pt(title)}, "xaxis": xaxis,
                                    "xaxis2": {"domain": [0.9, 1.0], "showticklabels": False},
                                    "yaxis": {"title": {"text": pt(unit)}}, "legend": {"orientation": "h", "y": -0.3}}
    return Figure(data, layout, height=400)
