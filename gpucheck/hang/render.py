"""The `gpucheck hang` table: stack groups (rank counts, nodes, the frames that set them apart),
suspects, flight-recorder divergence, eviction, nodes not collected; then plain lines (a folded
node set is never wrapped: it is pasted into scontrol)."""

from __future__ import annotations

import sys

import click

from .model import GroupDoc, HangDocument

STACK_SHOWN = 4
ROWS_SHOWN = 20


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 7, 8] -> "0-2,4,7-8"."""
    out: list[str] = []
    ranks = sorted(set(ranks))
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def _stack_text(g: GroupDoc) -> str:
    if g["dominant"] or not g["distinct_frames"]:
        frames = g["main_frames"][:STACK_SHOWN]
        more = " <- ..." if len(g["main_frames"]) > STACK_SHOWN else ""
        text = " <- ".join(frames) + more if frames else "(no frames)"
        if g["collective_frames"]:
            text += f"  [comm thread: {g['collective_frames'][0]}]"
        return text
    frames = g["distinct_frames"][:STACK_SHOWN]
    text = " <- ".join(frames) + (" <- ..." if len(g["distinct_frames"]) > STACK_SHOWN else "")
    if g["splits_from"]:
        text += f"  [leaves the dominant stack below {g['splits_from']}]"
    return text


def _groups_table(doc: HangDocument) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..render.console import make_console

    console = make_console(sys.stdout)  # no markup, no emoji: stacks and node names print as they are
    table = Table(header_style="bold")
    for col in ("group", "ranks", "nodes", "stack (innermost first; outliers: what sets them apart)"):
        table.add_column(col, overflow="fold")
    for g in doc["groups"][:ROWS_SHOWN]:
        label = Text(str(g["id"]))
        if doc["dominant_group"] is not None and g["dominant"]:
            label.append(" dominant", style="green")
        elif doc["dominant_group"] is not None:
            label.stylize("bold red")
        table.add_row(label, Text(f"{g['size']}: {rank_ranges(g['ranks'])}"), Text(str(g["nodes"])),
                      Text(_stack_text(g)))
    console.print(table)
    if len(doc["groups"]) > ROWS_SHOWN:
        click.echo(f"... {len(doc['groups']) - ROWS_SHOWN} more group(s) (--json has them all)")


def _suspect_lines(doc: HangDocument) -> None:
    if not doc["suspects"]:
        return
    click.echo("suspects:")
    for s in doc["suspects"][:ROWS_SHOWN]:
        where = f" on {s['node']} (pid {s['pid']})" if s["node"] else " (node unknown)"
        click.echo(f"  rank {s['rank']}{where}: {s['why']}")
        if s["frames"]:
            click.echo(f"      {' <- '.join(s['frames'])}")
    if len(doc["suspects"]) > ROWS_SHOWN:
        click.echo(f"  ... {len(doc['suspects']) - ROWS_SHOWN} more suspect(s) (--json has them all)")


def _flight_lines(doc: HangDocument) -> None:
    fr = doc["flight_recorder"]
    if not fr["ranks_with_data"]:
        return
    click.echo(f"flight recorder: dumps of {fr['ranks_with_data']} rank(s)")
    for pg in fr["groups"]:
        label = f"process group {pg['pg']}" + (f" ({pg['desc']})" if pg["desc"] else "")
        if pg["divergence_seq"] is not None:
            op = f" ({pg['op']})" if pg["op"] else ""
            click.echo(f"  {label}: diverges at collective #{pg['divergence_seq']}{op}: entered by "
                       f"{rank_ranges(pg['entered'])}, never by {rank_ranges(pg['not_entered'])}")
        elif pg["status"] == "agree":
            click.echo(f"  {label}: every rank reached collective #{pg['last_seq']}")
        for mm in pg["mismatched"][:3]:
            click.echo(f"  {label}: collective #{mm['seq']} is {mm['op']} on most ranks, "
                       + ", ".join(f"{op} on rank {r}" for r, op in mm["ranks"].items()))
        if pg["no_data"]:
            click.echo(f"  {label}: no dump from rank(s) {rank_ranges(pg['no_data'])}")


def _topology_lines(doc: HangDocument) -> None:
    t = doc["topology"]
    if not t:
        return
    for dim, groups in t["dims"].items():
        for g in groups[:4]:
            click.echo(f"  {dim} group {g['index']} (ranks {rank_ranges(g['ranks'])}) holds suspect(s) "
                       f"{rank_ranges(g['suspects'])}: nodes {g['nodes']}")
    if t["evict_dim"]:
        click.echo(f"evict ({t['evict_dim']} group of the suspects, over-eviction): {t['evict_nodes']}")
    elif t["note"]:
        click.echo(f"evict: {t['evict_nodes']} ({t['note']})")
    if t["ranks_without_node"]:
        click.echo(f"  ranks of those groups on nodes not collected: {rank_ranges(t['ranks_without_node'])}")


def print_report(doc: HangDocument) -> None:
    ngroups = len(doc["groups"])
    click.echo(f"hang: {doc['ranks_dumped']} of {doc['ranks_found']} rank process(es) dumped on "
               f"{len(doc['nodes'])} node(s), {ngroups} stack group(s)"
               + (f", world size {doc['world_size']}" if doc["world_size"] else ""))
    if ngroups:
        _groups_table(doc)
    _suspect_lines(doc)
    _flight_lines(doc)
    _topology_lines(doc)
    for u in doc["undumped"][:ROWS_SHOWN]:
        click.echo(f"not dumped: rank {u['rank']} on {u['node']} (pid {u['pid']}): {u['error']}")
    for n in doc["nodes"]:
        if n["status"] not in ("ok",):
            click.echo(f"node {n['node']}: {n['status']}" + (f": {n['reason']}" if n["reason"] else ""))
    click.echo(doc["summary"])
    if doc["suspect_nodes"]:
        click.echo(f"suspect nodes: {doc['suspect_nodes']}")
    if doc["uncollected_nodes"]:
        click.echo(f"not collected: {doc['uncollected_nodes']}")
