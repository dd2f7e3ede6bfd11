"""Report sections of many nodes: a sweep (node x check heatmap, per-node throughput with the
fleet's outliers marked, the bad nodes), nccl pairs (the node x node bandwidth matrix with the bad
nodes highlighted) and a bisection (its rounds as a tree, failing groups in red)."""

from __future__ import annotations

from typing import Any, Mapping

from ..core.jsonvalue import JsonValue
from .charts import points_with_outliers, status_heatmap
from .inputs import Input, NodeVerdict
from .page import STATUS_COLORS, Figure, Section, badge, h, legend, pt, sparse_matrix, table

MAX_CHARTS = 12
MAX_ROWS = 500
GOOD = ("pass", "warn", "skip")


def _entries(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return [e for e in doc.get(key) or [] if isinstance(e, Mapping)]


def sweep_section(inp: Input) -> Section:
    doc: Mapping[str, Any] = inp.doc  # read loosely: every value is checked where it is used
    nodes = _entries(doc, "nodes")
    sec = Section(f"Sweep of {doc.get('nodeset') or len(nodes)}: {len(nodes)} node(s)", inp.path, "sweep")
    bad = [n for n in nodes if n.get("status") not in GOOD]
    if doc.get("bad"):
        sec.attention.append(f"bad nodes: {doc.get('bad')}")
    sec.attention += [f"{str(n.get('status')).upper()} {n.get('node')}: {n.get('reason')}" for n in bad[:20]]
    counts: Mapping[str, Any] = doc["counts"] if isinstance(doc.get("counts"), Mapping) else {}
    sec.counts = {str(s): c for s, c in counts.items() if isinstance(c, int) and not isinstance(c, bool)}
    sec.counted = "node(s)"
    facts = [["nodes", " ".join(badge(str(s), f"{c} {s}") for s, c in counts.items() if c)],
             ["bad", h(doc.get("bad") or "none")],
             ["time", h(f"{doc.get('time')} ({doc.get('duration_s')} s over {doc.get('mode')}"
                        + (f", fan-out {doc['fanout']})" if doc.get("fanout") else ")"))]]
    if doc.get("interrupted"):
        facts.append(["interrupted", h(f"{doc.get('interrupted')}: not answered {doc.get('unanswered')}")])
    sec.blocks.append(table(["", ""], facts))
    sec.blocks.append(legend(["pass", "warn", "fail", "error", "unexamined", "skip", "unreachable", "timeout"]))
    sec.blocks.append(_sweep_heatmap(nodes, inp.node_verdicts))
    sec.blocks += _sweep_distributions(doc, nodes, inp.node_verdicts)
    sec.blocks.append(_bad_node_table(bad, nodes))
    return sec


def _sweep_heatmap(nodes: list[Mapping[str, Any]], verdicts: Mapping[str, NodeVerdict]) -> Figure:
    xs = [str(n.get("node")) for n in nodes]
    checks: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    hover: dict[tuple[str, str], str] = {}
    for n, x in zip(nodes, xs):
        status = str(n.get("status"))
        cells[("node status", x)] = status
        reason = f"<br>{pt(str(n.get('reason'))[:200])}" if n.get("reason") else ""
        hover[("node status", x)] = pt(f"{x}: {status.upper()}") + reason
        verdict = verdicts.get(x)
        row = n.get("checks")  # the node's grid row, the fleet's findings merged (sweep report 1.1)
        marks = list(row.items()) if isinstance(row, Mapping) else list(verdict.checks) if verdict is not None else []
        for check, st in marks:
            check, st = str(check), str(st)
            if check not in checks:
                checks.append(check)
            cells[(check, x)] = st
            hover[(check, x)] = pt(f"{x} {check}: {st.upper()}")
    bad = [x for n, x in zip(nodes, xs) if n.get("status") not in GOOD]
    return status_heatmap(xs, ["node status", *checks], cells, hover, title="nodes x checks", x_title="node",
                          highlight_x=bad)


def _sweep_distributions(doc: Mapping[str, Any], nodes: list[Mapping[str, Any]],
                         verdicts: Mapping[str, NodeVerdict]) -> list[Any]:
    values: dict[tuple[str, str, str, str], list[tuple[str, str, float]]] = {}
    for n in nodes:
        verdict = verdicts.get(str(n.get("node")))
        if verdict is not None:
            for key, subject, value in verdict.inputs.throughput:
                values.setdefault(key, []).append((str(n.get("node")), subject, value))
    perf = (doc.get("fleet") or {}).get("performance") or {} if isinstance(doc.get("fleet"), Mapping) else {}
    stats = {(m.get("check"), m.get("metric"), m.get("unit"), m.get("model")): m
             for m in perf.get("metrics") or [] if isinstance(m, Mapping)}
    blocks: list[Any] = []
    for key, points in sorted(values.items(), key=lambda kv: (kv[0][0] != "burn.gemm", kv[0]))[:MAX_CHARTS]:
        m = stats.get(key) or {}
        outliers = {(str(o.get("node")), str(o.get("subject"))) for o in m.get("outliers") or [] if isinstance(o, Mapping)}
        check, metric, unit, model = key
        note = "" if m.get("compared") else f" (not compared: {m.get('why', 'no fleet statistics')})"
        blocks.append(points_with_outliers(points, outliers, title=f"{check} {metric} on {model}{note}", unit=unit,
                                           median=m.get("median"), limit=m.get("limit")))
    return (["<h3>Throughput and bandwidth per node (outliers in red)</h3>"] + blocks) if blocks else []


def _bad_node_table(bad: list[Mapping[str, Any]], nodes: list[Mapping[str, Any]]) -> str:
    if not bad:
        others = [n for n in nodes if n.get("status") != "pass"]
        if not others:
            return "<p>Every node passed.</p>"
        return "<p>No bad node, but not every node passed: " + h("; ".join(
            f"{str(n.get('status')).upper()} {n.get('node')}: {n.get('reason') or '-'}" for n in others[:MAX_ROWS])) + "</p>"
    # the reason is the node's one story (the fleet's findings merged into it by the sweep)
    rows = [[badge(str(n.get("status"))), h(n.get("node")), h(", ".join(map(str, n.get("failing") or [])) or "-"),
             h(str(n.get("reason") or "-")), h(n.get("action") or "")] for n in bad[:MAX_ROWS]]
    more = f'<p class="note">{len(bad) - MAX_ROWS} more bad node(s) not listed</p>' if len(bad) > MAX_ROWS else ""
    return "<h3>Bad nodes</h3>" + table(["status", "node", "failing", "cause", "action"], rows) + more


# -- nccl pairs ---------------------------------------------------------------------------------
def pairs_section(inp: Input) -> Section:
    doc: Mapping[str, Any] = inp.doc  # read loosely: every value is checked where it is used
    nodes = [str(n) for n in doc.get("nodes") or []]
    sec = Section(f"nccl pairs: {doc.get('op')} over {len(nodes)} node(s)", inp.path, "pairs")
    bad, suspects = [str(n) for n in doc.get("bad") or []], [str(n) for n in doc.get("suspects") or []]
    scores = {str(s.get("node")): s for s in _entries(doc, "node_scores")}
    sec.attention = [f"bad node {n}: {'; '.join(map(str, scores.get(n, {}).get('evidence') or []))}" for n in bad]
    sec.attention += [f"suspect node {n}" for n in suspects]
    ref = doc.get("reference_busbw_gbs")
    pairs = _entries(doc, "pairs")
    facts = [["reference busbw", h(f"{ref:.4g} GB/s ({doc.get('reference')})" if isinstance(ref, (int, float)) else "-")],
             ["pairs", h(f"{len(pairs)} measured of {doc.get('pairs_planned')} planned, strategy {doc.get('strategy')}")],
             ["bad", h(", ".join(bad) or "none")], ["suspects", h(", ".join(suspects) or "none")]]
    if doc.get("interrupted"):
        facts.append(["interrupted", h(str(doc.get("interrupted")))])
    sec.blocks.append(table(["", ""], facts))
    sec.blocks.append(_pair_matrix(nodes, pairs, bad + suspects))
    rows = [[badge(_score_status(s)), h(s.get("node")), h(s.get("pairs")), h(s.get("bad_pairs")),
             h("-" if s.get("score") is None else f"{s['score']:.2f}"), h("; ".join(map(str, s.get("evidence") or [])))]
            for s in sorted(scores.values(), key=lambda s: (s.get("verdict") == "ok", str(s.get("node"))))[:MAX_ROWS]]
    sec.blocks.append("<h3>Per node</h3>" + table(["verdict", "node", "pairs", "bad pairs", "score", "evidence"], rows))
    return sec


def _score_status(s: Mapping[str, Any]) -> str:
    return {"ok": "pass", "bad": "fail", "suspect": "warn"}.get(str(s.get("verdict")), str(s.get("verdict")))


def _pair_matrix(nodes: list[str], pairs: list[Mapping[str, Any]], marked: list[str]) -> Figure:
    """busbw of each measured pair (symmetric); failed pairs in red; marked nodes' rows and
    columns framed in red and their names in bold."""
    index = {n: i for i, n in enumerate(nodes)}
    size = len(nodes)
    bw: list[tuple[int, int, float]] = []
    broken: list[tuple[int, int, int]] = []
    text: list[tuple[int, int, str]] = []
    for p in pairs:
        ab = [str(x) for x in p.get("nodes") or []]
        if len(ab) != 2 or ab[0] not in index or ab[1] not in index:
            continue
        i, j = index[ab[0]], index[ab[1]]
        verdict = str(p.get("verdict"))
        value = p.get("busbw_gbs") if isinstance(p.get("busbw_gbs"), (int, float)) else None
        label = pt(f"{ab[0]} + {ab[1]}: {verdict}" + (f", busbw {value:.4g} GB/s" if value is not None else "")
                   + (f": {str(p.get('summary'))[:160]}" if verdict not in ("ok", "slow") else ""))
        for a, b in ((i, j), (j, i)):
            text.append((a, b, label))
            if value is not None and verdict in ("ok", "slow"):
                bw.append((a, b, value))
            else:
                broken.append((a, b, 1))
    ex = [pt(n) for n in nodes]
    ticks = [f"<b>{pt(n)}</b>" if n in set(marked) else pt(n) for n in nodes]
    hover = sparse_matrix(size, text)
    data: list[dict[str, JsonValue]] = [
        {"type": "heatmap", "x": list(ex), "y": list(ex), "z": sparse_matrix(size, bw), "text": hover,
         "colorscale": "Viridis", "colorbar": {"title": {"text": "busbw GB/s"}},
         "hovertemplate": "%{text}<extra></extra>", "hoverongaps": False},
        {"type": "heatmap", "x": list(ex), "y": list(ex), "z": sparse_matrix(size, broken), "text": hover,
         "showscale": False, "zmin": 0, "zmax": 1, "colorscale": [[0, STATUS_COLORS["fail"]], [1, STATUS_COLORS["fail"]]],
         "hovertemplate": "%{text}<extra></extra>", "hoverongaps": False}]
    shapes: list[JsonValue] = []
    for n in marked:
        if n in index:
            k = index[n]
            for rect in ({"x0": k - 0.5, "x1": k + 0.5, "y0": -0.5, "y1": size - 0.5},
                         {"x0": -0.5, "x1": size - 0.5, "y0": k - 0.5, "y1": k + 0.5}):
                shapes.append({"type": "rect", "xref": "x", "yref": "y", **rect,
                               "line": {"color": STATUS_COLORS["fail"], "width": 2}})
    axis: dict[str, JsonValue] = {"type": "category", "tickvals": list(ex), "ticktext": list(ticks)}
    if size > 60:
        axis = {"type": "category", "showticklabels": False}
    layout: dict[str, JsonValue] = {"title": {"text": "busbw per pair (red: the pair failed; framed: bad or suspect node)"},
                                    "xaxis": {**axis, "tickangle": -45}, "yaxis": {**axis, "autorange": "reversed"},
                                    "shapes": shapes}
    return Figure(data, layout, height=min(900, max(360, 160 + 18 * size)))


# -- bisect -------------------------------------------------------------------------------------
def bisect_section(inp: Input) -> Section:
    doc: Mapping[str, Any] = inp.doc  # read loosely: every value is checked where it is used
    sec = Section(f"Bisection of {doc.get('nodeset')}: {doc.get('nodes')} node(s)", inp.path, "bisect")
    bad = _entries(doc, "bad_nodes")
    sec.attention = [f"bad node {b.get('node')}" + (" (confirmed)" if b.get("confirmed") else "") for b in bad]
    facts = [["bad", h(doc.get("bad") or "none")],
             ["tests", h(f"{doc.get('tests')} in {doc.get('rounds')} round(s) ({doc.get('strategy')}), "
                         f"{doc.get('duration_s')} s")],
             ["verified", h("the other nodes passed together" if doc.get("verified") else "no")]]
    for note in doc.get("notes") or []:
        facts.append(["note", h(note)])
    sec.blocks.append(table(["", ""], facts))
    records = _entries(doc, "records")
    if records:
        sec.blocks.append(_bisect_tree(doc, records))
    rows = [[h(r.get("round")), h(r.get("phase")), h(r.get("nodes")), h(r.get("size")),
             badge("pass" if r.get("healthy") else "fail", "PASS" if r.get("healthy") else "FAIL"),
             h(r.get("detail") or "")] for r in records[:MAX_ROWS]]
    sec.blocks.append("<h3>Group tests</h3>" + table(["round", "phase", "group", "size", "result", "detail"], rows))
    if bad:
        rows = [[h(b.get("node")), h(f"{b.get('failures')}/{b.get('runs')}"), h(b.get("confidence")),
                 '<div class="mono">' + h("\n".join(map(str, b.get("evidence") or []))) + "</div>"] for b in bad]
        sec.blocks.append("<h3>Bad nodes</h3>" + table(["node", "failed/runs", "confidence", "evidence"], rows))
    return sec


def _members(label: Any) -> frozenset[str]:
    from ..platform.nodeset import NodeSetError, parse_nodeset

    try:
        return frozenset(parse_nodeset(str(label)))
    except NodeSetError:
        return frozenset()


def _bisect_tree(doc: Mapping[str, Any], records: list[Mapping[str, Any]]) -> Figure:
    """An icicle: every group test under the latest earlier failed test whose group holds it
    (a confirmation under the failed group holding its suspect), the whole node set at the root;
    a box is as wide as the tests below it."""
    ids, parents, labels, colors, values, hover = ["all"], [""], [pt(f"{doc.get('nodeset')}")], ["#90a4ae"], \
        [1], [pt(f"all {doc.get('nodes')} node(s)")]
    failed: list[tuple[str, frozenset[str]]] = []
    for i, r in enumerate(records):
        members = _members(r.get("nodes"))
        probe = frozenset([str(r.get("subject"))]) if r.get("phase") == "confirm" and r.get("subject") else members
        parent = next((rid for rid, m in reversed(failed) if probe and probe <= m and m != members), "all")
        rid = f"r{i}"
        ok = bool(r.get("healthy"))
        ids.append(rid)
        parents.append(parent)
        labels.append(pt(f"r{r.get('round')} {r.get('phase')} {r.get('nodes')}: {'PASS' if ok else 'FAIL'}"))
        colors.append(STATUS_COLORS["pass"] if ok else STATUS_COLORS["fail"])
        values.append(1)
        hover.append(pt(f"round {r.get('round')} {r.get('phase')} {r.get('nodes')} ({r.get('size')} node(s)): "
                        f"{'PASS' if ok else 'FAIL'} {str(r.get('detail') or '')[:160]}"))
        if not ok and members:
            failed.append((rid, members))
    data: list[dict[str, JsonValue]] = [{
        "type": "icicle", "ids": list(ids), "parents": list(parents), "labels": list(labels), "values": list(values),
        "branchvalues": "remainder", "marker": {"colors": list(colors)}, "text": list(hover),
        "hovertemplate": "%{text}<extra></extra>", "tiling": {"orientation": "v"}, "maxdepth": -1,
        "textinfo": "label"}]
    return Figure(data, {"title": {"text": "group tests as a tree (red: the group failed)"}},
                  height=min(900, 240 + 60 * len(records)))
