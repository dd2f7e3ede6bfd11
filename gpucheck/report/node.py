"""Report sections of one node: a verdict (the check x GPU grid with causes, throughput per GPU
against its floor and the node median) and a history (status and key metrics per GPU over time)."""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from ..render.grid import CAUSE_ORDER, causes, column_of, fold, status_key, verdict_grid
from .charts import bars_against_limits, lines_over_time, status_heatmap
from .inputs import Input
from .page import STATUS_COLORS, Figure, Section, badge, h, legend, pt, table

MAX_CHARTS = 12
EVIDENCE_SHOWN = 12


def verdict_section(inp: Input) -> Section:
    v = inp.doc
    sec = Section(f"Node {v.get('host')}: {str(v.get('status')).upper()}", inp.path, "verdict")
    found = causes(v)
    sec.attention = [f"{c.status.upper()} {c.where()}: {c.summary}" for c in found if c.status in CAUSE_ORDER[:4]]
    sec.blocks.append(_verdict_facts(v))
    sec.blocks.append("<h3>Checks x GPUs</h3>" + legend(["pass", "warn", "fail", "error", "unexamined", "skip"]))
    sec.blocks.append(grid_table(v))
    sec.blocks.append(_cause_list(v, found))
    sec.blocks += throughput_charts(v)
    return sec


def _verdict_facts(v: Mapping[str, Any]) -> str:
    gpus = [g for g in v.get("gpus") or [] if isinstance(g, Mapping)]
    models = sorted({str(g.get("name") or g.get("state")) for g in gpus})
    rows = [
        ["status", badge(str(v.get("status"))) + f" exit code {h(v.get('exit_code'))}"
         + (f", action <b>{h(v.get('action'))}</b>" if v.get("action") not in (None, "none") else "")],
        ["host", h(v.get("host"))],
        ["level", h(f"{v.get('level')} {v.get('level_name')}")],
        ["time", h(f"{v.get('time')} ({v.get('duration_s')} s)")],
        ["GPUs", h(f"{len(gpus)}: {', '.join(models)}" if gpus else "none listed")],
        ["driver", h((v.get("software") or {}).get("driver") or "-")],
        ["source", h(f"{(v.get('source') or {}).get('kind')} {(v.get('source') or {}).get('path') or ''}")],
    ]
    if v.get("partial"):
        rows.append(["partial", h(f"interrupted: {v.get('interrupted')}")])
    if v.get("injected"):
        rows.append(["injected", h(", ".join(map(str, v["injected"])))])
    return table(["", ""], rows)


def grid_table(v: Mapping[str, Any]) -> str:
    grid = verdict_grid(v)
    summaries: dict[tuple[str, str], list[str]] = {}
    for r in v.get("results", []):
        if isinstance(r, Mapping):
            summaries.setdefault((str(r.get("check")), column_of(r)), []).append(
                f"{r.get('subject')}: {str(r.get('status')).upper()}: {r.get('summary')}")
    rows = []
    for check in grid.checks:
        cells = [f'<td class="check">{h(check)}</td>']
        for col in grid.columns:
            status = grid.cell(check, col)
            if status is None:
                cells.append('<td class="none">.</td>')
                continue
            tip = h("\n".join(summaries.get((check, col), [])))
            color = STATUS_COLORS.get(status, "#616161")
            mark = {"pass": "ok", "skip": "skip", "unexamined": "SKIP"}.get(status, status.upper())
            cells.append(f'<td style="background:{color}" title="{tip}">{h(mark)}</td>')
        rows.append("".join(cells))
    head = "".join(f"<th>{h(c)}</th>" for c in ["check", *grid.columns])
    return f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>' + \
        "".join(f"<tr>{r}</tr>" for r in rows) + "</tbody></table>"


def _cause_list(v: Mapping[str, Any], found: list[Any]) -> str:
    if not found:
        return "<p>Every result passed.</p>"
    evidence: dict[tuple[str, str, str], list[str]] = {}
    for r in v.get("results", []):
        if isinstance(r, Mapping):
            evidence.setdefault((status_key(r), str(r.get("summary", "")), str(r.get("action", "none"))),
                                []).extend(map(str, r.get("evidence") or []))
    items = []
    for c in found:
        text = f"{badge(c.status, 'SKIP' if c.status == 'unexamined' else c.status.upper())} <b>{h(c.where())}</b>: " \
               f"{h(c.summary)}"
        if c.action != "none":
            text += f" &rarr; <b>{h(c.action)}</b>"
        if c.injected:
            text += f' <span class="note">[injected: {h(", ".join(c.injected))}]</span>'
        lines = evidence.get((c.status, c.summary, c.action), [])
        if lines:
            shown = "\n".join(lines[:EVIDENCE_SHOWN]) + (f"\n... {len(lines) - EVIDENCE_SHOWN} more" if
                                                         len(lines) > EVIDENCE_SHOWN else "")
            text += f'<details><summary>evidence</summary><div class="mono">{h(shown)}</div></details>'
        items.append(f"<li>{text}</li>")
    return "<h3>Not a pass: cause and action</h3><ul class=\"causes\">" + "".join(items) + "</ul>"


def _rate_metrics(v: Mapping[str, Any]) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """(check, metric, unit) -> the per-GPU results that measured it (units ending in /s)."""
    out: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in v.get("results", []):
        if not isinstance(r, Mapping) or not isinstance(r.get("gpu"), int):
            continue
        for name, m in (r.get("metrics") or {}).items():
            unit = m.get("unit") if isinstance(m, Mapping) else None
            value = m.get("value") if isinstance(m, Mapping) else None
            if isinstance(unit, str) and unit.endswith("/s") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                out.setdefault((str(r.get("check")), str(name), unit), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0] != "burn.gemm", kv[0])))


def throughput_charts(v: Mapping[str, Any]) -> list[Any]:
    """Per (check, metric) measured per GPU: a bar per GPU against the result's fail/warn
    limits (the SKU floor of a burn) and the node median."""
    blocks: list[Any] = []
    for (check, metric, unit), results in list(_rate_metrics(v).items())[:MAX_CHARTS]:
        results = sorted(results, key=lambda r: r["gpu"])
        values = [float(r["metrics"][metric]["value"]) for r in results]
        limits: list[tuple[str, float, str]] = []
        for wanted, label in (("fail", "floor (fail below)"), ("warn", "warn below")):
            lim = next((t.get("limit") for r in results for t in r.get("thresholds") or []
                        if isinstance(t, Mapping) and t.get("metric") == metric and t.get("status") == wanted
                        and t.get("op") in ("<", "<=") and isinstance(t.get("limit"), (int, float))), None)
            if lim is not None:
                limits.append((label, float(lim), STATUS_COLORS[wanted]))
        if len(values) > 1:
            limits.append(("node median", statistics.median(values), "#546e7a"))
        blocks.append(bars_against_limits([f"gpu{r['gpu']}" for r in results], values,
                                          [status_key(r) for r in results], title=f"{check} {metric}", unit=unit,
                                          limits=limits))
    if blocks:
        blocks.insert(0, "<h3>Throughput per GPU</h3>")
    return blocks


# -- history --------------------------------------------------------------------------------------
def history_section(inp: Input) -> Section:
    runs = sorted(inp.doc, key=lambda v: str(v.get("time")))
    hosts = sorted({str(v.get("host")) for v in runs})
    sec = Section(f"History of {', '.join(hosts)}: {len(runs)} run(s)", inp.path, "history")
    last = runs[-1]
    sec.attention = [f"last run {last.get('time')}: {c.status.upper()} {c.where()}: {c.summary}"
                     for c in causes(last) if c.status in CAUSE_ORDER[:3]]
    counts: dict[str, int] = {}
    for v in runs:
        counts[str(v.get("status"))] = counts.get(str(v.get("status")), 0) + 1
    facts = [["runs", h(f"{len(runs)} from {runs[0].get('time')} to {last.get('time')}")],
             ["statuses", " ".join(badge(s, f"{n} {s}") for s, n in sorted(counts.items()))]]
    if inp.skipped_lines:
        facts.append(["skipped", h(f"{inp.skipped_lines} line(s) that were not a verdict")])
    sec.blocks.append(table(["", ""], facts))
    sec.blocks.append(legend(["pass", "warn", "fail", "error", "unexamined", "skip"]))
    sec.blocks.append(_history_heatmap(runs, multi_host=len(hosts) > 1))
    sec.blocks += _history_metrics(runs, multi_host=len(hosts) > 1)
    return sec


def _run_labels(runs: list[Mapping[str, Any]]) -> list[str]:
    labels, seen = [], {}
    for v in runs:
        t = str(v.get("time"))
        seen[t] = seen.get(t, 0) + 1
        labels.append(t if seen[t] == 1 else f"{t} #{seen[t]}")
    return labels


def _history_heatmap(runs: list[Mapping[str, Any]], *, multi_host: bool) -> Figure:
    xs = _run_labels(runs)
    per: dict[tuple[str, str], list[str]] = {}
    notes: dict[tuple[str, str], list[str]] = {}
    for x, v in zip(xs, runs):
        for r in v.get("results", []):
            if not isinstance(r, Mapping):
                continue
            y = (f"{v.get('host')} " if multi_host else "") + column_of(r)
            per.setdefault((y, x), []).append(status_key(r))
            if r.get("status") not in ("pass", "skip") or r.get("unexamined"):
                notes.setdefault((y, x), []).append(f"{r.get('check')}: {r.get('summary')}")
    ys = sorted({y for y, _ in per}, key=_row_order)
    cells = {k: fold(s) for k, s in per.items()}
    hover = {k: pt(f"{k[1]} {k[0]}: {cells[k].upper()}") + "".join("<br>" + pt(n[:160]) for n in notes.get(k, [])[:4])
             for k in cells}
    return status_heatmap(xs, ys, cells, hover, title="status per GPU and run", x_title="run")


def _row_order(row: str) -> tuple[str, int, int]:
    """'[host ]node' before '[host ]gpuN', GPUs by number."""
    host, _, col = row.rpartition(" ")
    return (host, 0, 0) if col == "node" else (host, 1, int(col[3:]) if col[3:].isdigit() else 0)


def _history_metrics(runs: list[Mapping[str, Any]], *, multi_host: bool) -> list[Any]:
    series: dict[tuple[str, str, str], dict[str, list[tuple[str, float]]]] = {}
    for v in runs:
        for (check, metric, unit), results in _rate_metrics(v).items():
            for r in results:
                name = (f"{v.get('host')} " if multi_host else "") + f"gpu{r['gpu']}"
                series.setdefault((check, metric, unit), {}).setdefault(name, []).append(
                    (str(v.get("time")), float(r["metrics"][metric]["value"])))
    blocks: list[Any] = [lines_over_time(s, title=f"{c} {m}", unit=u) for (c, m, u), s in list(series.items())[:MAX_CHARTS]]
    return (["<h3>Key metrics over time</h3>"] + blocks) if blocks else []
