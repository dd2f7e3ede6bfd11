"""Report sections of one node: a verdict (the check x GPU grid with causes, throughput per GPU
against its floor and the node median) and a history (status and key metrics per GPU over time)."""

from __future__ import annotations

import statistics
from typing import Any

from ..core.result import Action, ResultEntry, Status
from ..core.verdict import Verdict
from ..render.grid import CAUSE_ORDER, Cause, causes, column_of, fold, status_key, verdict_grid
from .charts import bars_against_limits, lines_over_time, status_heatmap
from .inputs import Input
from .page import STATUS_COLORS, Figure, Section, badge, h, legend, pt, table

MAX_CHARTS = 12
EVIDENCE_SHOWN = 12


def verdict_section(inp: Input) -> Section:
    (v,) = inp.verdicts
    sec = Section(f"Node {v.host}: {v.status.value.upper()}", inp.path, "verdict")
    found = causes(v)
    sec.attention = [f"{c.status.upper()} {c.where()}: {c.summary}" for c in found if c.status in CAUSE_ORDER[:4]]
    sec.counts = {s.value: n for s, n in v.counts.items()}
    sec.blocks.append(_verdict_facts(v))
    sec.blocks.append("<h3>Checks x GPUs</h3>" + legend(["pass", "warn", "fail", "error", "unexamined", "skip"]))
    sec.blocks.append(grid_table(v))
    sec.blocks.append(_cause_list(v, found))
    sec.blocks += throughput_charts(v)
    return sec


def _verdict_facts(v: Verdict) -> str:
    models = sorted({g.name or g.state for g in v.gpus})
    rows = [
        ["status", badge(v.status.value) + f" exit code {h(v.exit_code)}"
         + (f", action <b>{h(v.action.value)}</b>" if v.action is not Action.NONE else "")],
        ["host", h(v.host)],
        ["level", h(f"{int(v.level)} {v.level_name}")],
        ["time", h(f"{v.time} ({v.duration_s} s)")],
        ["GPUs", h(f"{len(v.gpus)}: {', '.join(models)}" if v.gpus else "none listed")],
        ["driver", h(v.software.get("driver") or "-")],
        ["source", h(f"{v.source.kind} {v.source.path or ''}")],
    ]
    if v.partial:
        rows.append(["partial", h(f"interrupted: {v.interrupted}")])
    if v.injected:
        rows.append(["injected", h(", ".join(v.injected))])
    return table(["", ""], rows)


def grid_table(v: Verdict) -> str:
    grid = verdict_grid(v)
    summaries: dict[tuple[str, str], list[str]] = {}
    for r in v.results:
        summaries.setdefault((r.check, column_of(r)), []).append(f"{r.subject}: {r.status.value.upper()}: {r.summary}")
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
            mark = {"pass": "ok", "skip": "skip", "unexamined": "MISS"}.get(status, status.upper())
            cells.append(f'<td style="background:{color}" title="{tip}">{h(mark)}</td>')
        rows.append("".join(cells))
    head = "".join(f"<th>{h(c)}</th>" for c in ["check", *grid.columns])
    return f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>' + \
        "".join(f"<tr>{r}</tr>" for r in rows) + "</tbody></table>"


def _cause_list(v: Verdict, found: list[Cause]) -> str:
    if not found:
        return "<p>Every result passed.</p>"
    evidence: dict[tuple[str, str, str], list[str]] = {}
    for r in v.results:
        evidence.setdefault((status_key(r), r.summary, r.action.value), []).extend(r.evidence)
    items = []
    for c in found:
        text = f"{badge(c.status, 'MISS' if c.status == 'unexamined' else c.status.upper())} <b>{h(c.where())}</b>: " \
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


def _rate(r: ResultEntry, metric: str) -> float | None:
    """The value of `metric` of `r` when it is a number (a bool is not)."""
    value = r.metric_value(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rate_metrics(v: Verdict) -> dict[tuple[str, str, str], list[tuple[ResultEntry, float]]]:
    """(check, metric, unit) -> (the per-GPU result that measured it, its value), units ending in /s."""
    out: dict[tuple[str, str, str], list[tuple[ResultEntry, float]]] = {}
    for r in v.results:
        if r.gpu is None:
            continue
        for name, m in r.metrics.items():
            value = _rate(r, name)
            if m.unit.endswith("/s") and value is not None:
                out.setdefault((r.check, name, m.unit), []).append((r, value))
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0] != "burn.gemm", kv[0])))


def _limit(results: list[ResultEntry], metric: str, wanted: Status) -> float | None:
    """The first lower limit (`<`, `<=`) of `metric` at status `wanted` among the results' thresholds."""
    return next((float(t.limit) for r in results for t in r.thresholds
                 if t.metric == metric and t.status is wanted and t.op in ("<", "<=")
                 and isinstance(t.limit, (int, float))), None)


def throughput_charts(v: Verdict) -> list[Any]:
    """Per (check, metric) measured per GPU: a bar per GPU against the result's fail/warn
    limits (the SKU floor of a burn) and the node median."""
    blocks: list[Any] = []
    for (check, metric, unit), measured in list(_rate_metrics(v).items())[:MAX_CHARTS]:
        measured = sorted(measured, key=lambda rv: rv[0].gpu or 0)
        results, values = [r for r, _ in measured], [value for _, value in measured]
        limits: list[tuple[str, float, str]] = []
        for wanted, label in ((Status.FAIL, "floor (fail below)"), (Status.WARN, "warn below")):
            lim = _limit(results, metric, wanted)
            if lim is not None:
                limits.append((label, lim, STATUS_COLORS[wanted.value]))
        if len(values) > 1:
            limits.append(("node median", statistics.median(values), "#546e7a"))
        blocks.append(bars_against_limits([f"gpu{r.gpu}" for r in results], values,
                                          [status_key(r) for r in results], title=f"{check} {metric}", unit=unit,
                                          limits=limits))
    if blocks:
        blocks.insert(0, "<h3>Throughput per GPU</h3>")
    return blocks


# -- history --------------------------------------------------------------------------------------
def history_section(inp: Input) -> Section:
    runs = sorted(inp.verdicts, key=lambda v: v.time)
    hosts = sorted({v.host for v in runs})
    sec = Section(f"History of {', '.join(hosts)}: {len(runs)} run(s)", inp.path, "history")
    last = runs[-1]
    sec.attention = [f"last run {last.time}: {c.status.upper()} {c.where()}: {c.summary}"
                     for c in causes(last) if c.status in CAUSE_ORDER[:3]]
    counts: dict[str, int] = {}
    for v in runs:
        counts[v.status.value] = counts.get(v.status.value, 0) + 1
    sec.counts, sec.counted = dict(sorted(counts.items())), "run(s)"
    facts = [["runs", h(f"{len(runs)} from {runs[0].time} to {last.time}")],
             ["statuses", " ".join(badge(s, f"{n} {s}") for s, n in sorted(counts.items()))]]
    if inp.skipped_lines:
        facts.append(["skipped", h(f"{inp.skipped_lines} line(s) that were not a verdict")])
    sec.blocks.append(table(["", ""], facts))
    sec.blocks.append(legend(["pass", "warn", "fail", "error", "unexamined", "skip"]))
    sec.blocks.append(_history_heatmap(runs, multi_host=len(hosts) > 1))
    sec.blocks += _history_metrics(runs, multi_host=len(hosts) > 1)
    return sec


def _run_labels(runs: list[Verdict]) -> list[str]:
    labels: list[str] = []
    seen: dict[str, int] = {}
    for v in runs:
        seen[v.time] = seen.get(v.time, 0) + 1
        labels.append(v.time if seen[v.time] == 1 else f"{v.time} #{seen[v.time]}")
    return labels


def _history_heatmap(runs: list[Verdict], *, multi_host: bool) -> Figure:
    xs = _run_labels(runs)
    per: dict[tuple[str, str], list[str]] = {}
    notes: dict[tuple[str, str], list[str]] = {}
    for x, v in zip(xs, runs):
        for r in v.results:
            y = (f"{v.host} " if multi_host else "") + column_of(r)
            per.setdefault((y, x), []).append(status_key(r))
            if r.status not in (Status.PASS, Status.SKIP) or r.unexamined:
                notes.setdefault((y, x), []).append(f"{r.check}: {r.summary}")
    ys = sorted({y for y, _ in per}, key=_row_order)
    cells = {k: fold(s) for k, s in per.items()}
    hover = {k: pt(f"{k[1]} {k[0]}: {cells[k].upper()}") + "".join("<br>" + pt(n[:160]) for n in notes.get(k, [])[:4])
             for k in cells}
    return status_heatmap(xs, ys, cells, hover, title="status per GPU and run", x_title="run")


def _row_order(row: str) -> tuple[str, int, int]:
    """'[host ]node' before '[host ]gpuN', GPUs by number."""
    host, _, col = row.rpartition(" ")
    return (host, 0, 0) if col == "node" else (host, 1, int(col[3:]) if col[3:].isdigit() else 0)


def _history_metrics(runs: list[Verdict], *, multi_host: bool) -> list[Any]:
    series: dict[tuple[str, str, str], dict[str, list[tuple[str, float]]]] = {}
    for v in runs:
        for (check, metric, unit), measured in _rate_metrics(v).items():
            for r, value in measured:
                name = (f"{v.host} " if multi_host else "") + f"gpu{r.gpu}"
                series.setdefault((check, metric, unit), {}).setdefault(name, []).append((v.time, value))
    blocks: list[Any] = [lines_over_time(s, title=f"{c} {m}", unit=u) for (c, m, u), s in list(series.items())[:MAX_CHARTS]]
    return (["<h3>Key metrics over time</h3>"] + blocks) if blocks else []
