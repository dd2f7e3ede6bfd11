"""The HTML page: sections of escaped HTML blocks and plotly figures, plotly.js embedded.

Escaping, once and here:
- `h(text)`: data into HTML (html.escape, quotes included);
- `pt(text)`: data into a plotly string (axis labels, hover text, titles): plotly.js reads a
  little HTML in its strings (<b>, <br>, <a href>), so `<`, `>` and `&` become entities, which
  plotly shows as the characters;
- `script_json(obj)`: data into the page's script: JSON with `<`, `>`, `&`, U+2028 and U+2029
  as \\u escapes, so no text can end the script element or start a comment.
The page has no external reference: no CDN, no font, no image, no request.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..core.jsonvalue import JsonValue
from .inputs import ReportError

STATUS_COLORS = {"pass": "#2e7d32", "warn": "#f9a825", "fail": "#c62828", "error": "#8e24aa",
                 "unexamined": "#6a1b9a", "skip": "#9e9e9e", "unreachable": "#4a148c", "timeout": "#ad1457",
                 "ok": "#2e7d32", "slow": "#f9a825", "bad": "#c62828", "suspect": "#ef6c00"}
NO_RESULT_COLOR = "#eeeeee"


def h(text: Any) -> str:
    return html.escape(str(text), quote=True)


def pt(text: Any) -> str:
    return html.escape(str(text), quote=False)


def _clean(obj: Any) -> Any:
    """NaN and infinities (not JSON) as null, recursively."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def script_json(obj: Any) -> str:
    text = json.dumps(_clean(obj), separators=(",", ":"), allow_nan=False, default=str)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def sparse_matrix(n: int, cells: Sequence[tuple[int, int, JsonValue]]) -> dict[str, JsonValue]:
    """An n x n matrix (a heatmap's z or text) of null but `cells` (row, column, value): the page
    expands it before plotting (`densify` does the same in Python), so a 1,000-node pair
    matrix with a few thousand pairs measured does not carry a million nulls."""
    return {"sparse": n, "cells": [[i, j, value] for i, j, value in cells]}


def _dense(v: JsonValue) -> JsonValue:
    """A sparse matrix (sparse_matrix's) expanded; any other value as it is."""
    n, cells = (v.get("sparse"), v.get("cells")) if isinstance(v, dict) else (None, None)
    if not isinstance(n, int) or not isinstance(cells, list):
        return v
    rows: list[list[JsonValue]] = [[None] * n for _ in range(n)]
    for cell in cells:
        if isinstance(cell, list) and len(cell) == 3 and isinstance(cell[0], int) and isinstance(cell[1], int):
            rows[cell[0]][cell[1]] = cell[2]
    return [list(row) for row in rows]


def densify(data: list[dict[str, JsonValue]]) -> list[dict[str, JsonValue]]:
    """The traces with every sparse matrix expanded (what the page's script does)."""
    return [{k: (_dense(v) if k in ("z", "text") else v) for k, v in trace.items()} for trace in data]


@dataclass
class Figure:
    """A plotly figure: its traces and layout, plotly.js's JSON."""

    data: list[dict[str, JsonValue]]
    layout: dict[str, JsonValue]
    height: int = 420


@dataclass
class Section:
    title: str  # plain text (escaped when written)
    source: str  # the input file
    kind: str
    blocks: list[Any] = field(default_factory=list)  # HTML strings (already escaped) and Figures
    attention: list[str] = field(default_factory=list)  # plain text: the bad GPUs / nodes, named
    # the statuses the section shows with how many of each (results, runs or nodes, in `counted`):
    # the headline comes from them, so it never says "nothing failed" beside a fail it counts
    counts: dict[str, int] = field(default_factory=dict)
    counted: str = "result(s)"


NOT_BAD = ("pass", "skip")


def headline(sec: Section) -> str:
    """The section's first line, from the counts it shows and its attention items: "Nothing
    failed" only when it counts nothing but pass and skip and names nothing to look at."""
    bad = {s: n for s, n in sec.counts.items() if n and s not in NOT_BAD}
    if not sec.attention and not bad:
        return '<div class="ok">Nothing failed in this input.</div>'
    shown = ", ".join(f"{n} {s}" for s, n in sec.counts.items() if n)
    items = ([f"{shown} {sec.counted}"] if bad else []) + sec.attention
    return '<div class="attention"><b>Needs attention:</b> ' + h("; ".join(items)) + "</div>"


def badge(status: str, text: str | None = None) -> str:
    color = STATUS_COLORS.get(status, "#616161")
    return f'<span class="badge" style="background:{color}">{h(text if text is not None else status.upper())}</span>'


def table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """An HTML table; `rows` cells are HTML (escape data with h() first)."""
    head = "".join(f"<th>{h(x)}</th>" for x in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{h(cls)}">{thead}<tbody>{body}</tbody></table>'


def legend(statuses: list[str]) -> str:
    return '<div class="legend">' + " ".join(badge(s, s) for s in statuses) + "</div>"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:0;color:#212121;
background:#fafafa}
header{background:#263238;color:#fff;padding:14px 24px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#cfd8dc;font-size:13px}
main{padding:8px 24px 40px}section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;margin:18px 0;
padding:12px 18px}h2{font-size:18px;margin:6px 0 10px}h3{font-size:15px;margin:16px 0 6px}
.src{color:#757575;font-size:12px;font-weight:normal}
.badge{display:inline-block;color:#fff;border-radius:3px;padding:1px 6px;font-size:12px;font-weight:600}
.attention{background:#ffebee;border-left:4px solid #c62828;padding:6px 10px;margin:8px 0}
.ok{background:#e8f5e9;border-left:4px solid #2e7d32;padding:6px 10px;margin:8px 0}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{border:1px solid #e0e0e0;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f5f5f5}
table.grid td{text-align:center;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-weight:600;color:#fff}
table.grid td.check{text-align:left;color:#212121;font-weight:normal}
td.none{background:#eeeeee;color:#9e9e9e}
.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;white-space:pre-wrap}
.plot{width:100%}.legend{margin:4px 0}.note{color:#616161;font-size:12px}
ul.causes{padding-left:18px}ul.causes li{margin:3px 0}
"""


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ReportError("the report needs plotly: pip install 'gpucheck-cluster[report]'") from None
    js = get_plotlyjs()
    if re.search(r"</script|<!--", js, re.IGNORECASE):  # it would end the script element early
        raise ReportError("this plotly.js cannot be embedded (it contains '</script' or '<!--')")
    return js


def render_page(sections: list[Section], *, generated: str, inputs: list[str]) -> str:
    """The whole page."""
    figures: list[dict[str, JsonValue]] = []
    parts = []
    for n, sec in enumerate(sections):
        parts.append(_section_html(sec, n, figures))
    script = ("(function(){var figs=" + script_json(figures) + ";"
              "function dense(v){if(!v||v.sparse===undefined)return v;var m=[];"
              "for(var i=0;i<v.sparse;i++)m.push(new Array(v.sparse).fill(null));"
              "v.cells.forEach(function(c){m[c[0]][c[1]]=c[2];});return m;}"
              "figs.forEach(function(f){f.data.forEach(function(t){"
              "['z','text'].forEach(function(k){if(k in t)t[k]=dense(t[k]);});});});"
              "var config={responsive:true,displaylogo:false};"
              "var done=figs.map(function(f){return Plotly.newPlot(f.id,f.data,f.layout,config);});"
              "Promise.all(done).then(function(){window.gpucheckRendered=performance.now();"
              "document.body.setAttribute('data-rendered','yes');});})();")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        f"<title>gpucheck report</title><style>{_CSS}</style></head><body>"
        f"<header><h1>gpucheck report</h1><p>generated {h(generated)} from {h(', '.join(inputs))}</p></header>"
        f"<main>{''.join(parts)}</main>"
        # plotly.js last: the text and tables are drawn while it compiles, the plots after it
        f"<script>{_plotly_js()}</script><script>window.gpucheckPlotlyReady=performance.now();</script>"
        f"<script>{script}</script></body></html>\n"
    )


def _section_html(sec: Section, n: int, figures: list[dict[str, JsonValue]]) -> str:
    out = [f'<section id="s{n}"><h2>{h(sec.title)} <span class="src">{h(sec.kind)} from {h(sec.source)}</span></h2>']
    out.append(headline(sec))
    for i, block in enumerate(sec.blocks):
        if isinstance(block, Figure):
            fid = f"fig-{n}-{i}"
            layout: dict[str, JsonValue] = {"margin": {"l": 70, "r": 20, "t": 40, "b": 60}, "height": block.height,
                                            **block.layout}
            figures.append({"id": fid, "data": [trace for trace in block.data], "layout": layout})
            out.append(f'<div class="plot" id="{fid}" style="height:{int(block.height)}px"></div>')
        else:
            out.append(str(block))
    out.append("</section>")
    return "".join(out)
