"""The hang analysis: a pure function over plain data (ranks -> stacks), testable on recorded dumps.

Input: one dict per rank process, as the `processes` of a `gpucheck.hang.node` document plus
its node (model.RankDoc): {"rank", "node", "pid", "status" ("dumped" or "error"), "error",
"world_size", "threads": [{"name", "main", "frames": [{"function", "file", "line"}, ...]}],
"flight"}. Output: model.Analysis, the body of the `gpucheck.hang` document (model.HangDocument).

1. Normalize: a frame is "function (file)" with the file cut to its package path
   (`torch/distributed/distributed_c10d.py`; the script's base name), line numbers dropped and
   native addresses masked, so the same code on different nodes, installs and lines compares equal.
2. Signature of a rank: its main thread's frames, plus, when the main thread is not in a
   collective, the frames of a thread that is (a communication thread).
3. Group ranks by signature. The dominant group is the largest, when it holds at least half of
   the dumped ranks (two halves: the one waiting in a collective; no majority: no suspect).
4. Suspects: every rank outside the dominant group (smallest groups first), with the frames that
   set its group apart (below the frame where its stack leaves the dominant one), plus the ranks
   the flight recorder shows behind (a collective the others entered and they never did) or
   disagreeing (another collective under the same sequence number).
5. Judge: suspects -> exit 1; else ranks not dumped, nodes not collected, ranks missing from the
   world, two processes claiming one rank, or no majority -> exit 3 (could not judge); else every
   rank agrees -> exit 0, and only a group test (`gpucheck bisect`) can localize the hang.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from operator import itemgetter
from typing import Iterable

from .. import __version__
from .folding import fold
from .model import (Analysis, DuplicateRank, FlightDivergence, FrameDoc, GroupDoc, HangDocument, Mismatch,
                    NodeOutline, PgDivergence, PgSummary, RankDoc, Source, Suspect, ThreadDoc, Undumped)
from .topology import Topology, evict_plan

SCHEMA = "gpucheck.hang"
SCHEMA_VERSION = "1.0"
FRAMES_SHOWN = 6
COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py",
                    "torch/distributed/_functional_collectives", "deepspeed/comm/", "p2p_communication.py")
COLLECTIVE_FUNCTIONS = re.compile(r"nccl|gloo::|c10d::")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_STDLIB = re.compile(r"/lib/python[0-9.]+/(.+)$")
_FUNCTION_FILE = itemgetter("function", "file")
BAD_NODE_STATUSES = ("unreachable", "timeout", "error", "no-processes", "partial", "interrupted")


# -- normalization ------------------------------------------------------------------------------

def short_file(path: str) -> str:
    """The part of a source path that is the same on every node: the package path after
    site-packages (or the standard library folder), else the file's base name."""
    for marker in ("/site-packages/", "/dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    m = _STDLIB.search(path)
    if m:
        return m.group(1)
    return path.rsplit("/", 1)[-1]


def frame_label(function: str, file: str) -> str:
    return f"{_HEX.sub('0x?', function)} ({short_file(file)})"


def in_collective(labels: Iterable[str]) -> bool:
    for label in labels:
        if any(m in label for m in COLLECTIVE_FILES) or COLLECTIVE_FUNCTIONS.search(label.split(" (", 1)[0]):
            return True
    return False


class _Labels:
    """Frame labels, computed once per distinct raw stack (most ranks share theirs)."""

    def __init__(self) -> None:
        self.by_frame: dict[tuple[str, str], str] = {}
        self.by_stack: dict[tuple[tuple[str, str], ...], tuple[str, ...]] = {}
        self.coll: dict[tuple[str, ...], bool] = {}

    def stack(self, frames: list[FrameDoc]) -> tuple[str, ...]:
        raw = tuple(map(_FUNCTION_FILE, frames))
        got = self.by_stack.get(raw)
        if got is None:
            by_frame = self.by_frame
            labels = []
            for key in raw:
                lab = by_frame.get(key)
                if lab is None:
                    lab = by_frame[key] = frame_label(*key)
                labels.append(lab)
            got = self.by_stack[raw] = tuple(labels)
        return got

    def collective(self, labels: tuple[str, ...]) -> bool:
        got = self.coll.get(labels)
        if got is None:
            got = self.coll[labels] = in_collective(labels)
        return got


def signature(threads: list[ThreadDoc], labels: _Labels) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(main thread's labels, a collective thread's labels or ())."""
    if not threads:
        return (), ()
    main = next((t for t in threads if t.get("main")), threads[0])
    main_labels = labels.stack(main["frames"])
    if labels.collective(main_labels):
        return main_labels, ()
    others = [labels.stack(t["frames"]) for t in threads if t is not main]
    coll = sorted(s for s in others if labels.collective(s))
    return main_labels, (coll[0] if coll else ())


# -- grouping -----------------------------------------------------------------------------------

@dataclass
class StackGroup:
    """Ranks with one signature: `members` index the dumped ranks."""

    main_frames: list[str]
    collective_frames: list[str]
    members: list[int]
    in_collective: bool
    id: int = 0  # 1 the largest, then by size and lowest rank

    @property
    def size(self) -> int:
        return len(self.members)


def group_ranks(dumped: list[RankDoc]) -> list[StackGroup]:
    """Groups of ranks with one signature, largest first (then lowest rank)."""
    labels = _Labels()
    by_sig: dict[tuple[tuple[str, ...], tuple[str, ...]], list[int]] = defaultdict(list)
    for i, r in enumerate(dumped):
        by_sig[signature(r["threads"], labels)].append(i)
    groups = [StackGroup(list(main), list(coll), members, labels.collective(main) or bool(coll))
              for (main, coll), members in by_sig.items()]
    groups.sort(key=lambda g: (-g.size, min(dumped[i]["rank"] for i in g.members)))
    for gid, g in enumerate(groups, 1):
        g.id = gid
    return groups


def pick_dominant(groups: list[StackGroup], total: int) -> tuple[StackGroup | None, str]:
    """The healthy group, or (None, why not)."""
    if not groups:
        return None, "no rank was dumped"
    top = groups[0]
    if 2 * top.size < total:
        return None, (f"no majority: the largest of {len(groups)} stack groups holds {top.size} of "
                      f"{total} ranks")
    tied = [g for g in groups if g.size == top.size]
    if len(tied) == 1:
        return top, f"{top.size} of {total} ranks share this stack"
    waiting = [g for g in tied if g.in_collective]
    if len(waiting) == 1:
        return waiting[0], (f"two halves of {top.size} ranks: the half waiting in a collective is taken "
                            "as healthy")
    return None, f"two halves of {top.size} ranks, and not exactly one of them waits in a collective"


def distinct(frames: list[str], dominant: list[str]) -> tuple[list[str], str | None]:
    """The frames of `frames` below the point where it leaves `dominant` (innermost first), and
    the innermost frame they share (None when they share none)."""
    k = 0
    while k < min(len(frames), len(dominant)) and frames[-1 - k] == dominant[-1 - k]:
        k += 1
    return frames[: len(frames) - k], (frames[-k] if k else None)


def _with_lines(r: RankDoc) -> list[str]:
    threads = r["threads"]
    main = next((t for t in threads if t.get("main")), threads[0]) if threads else None
    if main is None:
        return []
    out = []
    for f in main["frames"][:FRAMES_SHOWN]:
        line = f":{f['line']}" if f.get("line") is not None else ""
        out.append(f"{_HEX.sub('0x?', f['function'])} ({short_file(f['file'])}{line})")
    return out


# -- the flight recorder --------------------------------------------------------------------------

def _pg_members(entries: list[tuple[int, PgSummary]]) -> list[int] | None:
    lists = {tuple(ranks) for _, pg in entries for ranks in [pg.get("ranks")] if isinstance(ranks, list)}
    return list(next(iter(lists))) if len(lists) == 1 else None


def _mismatches(entries: list[tuple[int, PgSummary]]) -> list[Mismatch]:
    by_seq: dict[int, dict[int, str]] = defaultdict(dict)
    for rank, pg in entries:
        for seq, op in pg.get("ops", []):
            by_seq[int(seq)][rank] = str(op)
    out: list[Mismatch] = []
    for seq in sorted(by_seq):
        ops = Counter(by_seq[seq].values())
        if len(ops) > 1:
            major = ops.most_common(1)[0][0]
            out.append({"seq": seq, "op": major,
                        "ranks": {str(r): op for r, op in sorted(by_seq[seq].items()) if op != major}})
    return out


def _pg_divergence(name: str, entries: list[tuple[int, PgSummary]]) -> PgDivergence:
    last = {r: seq for r, pg in entries for seq in [pg.get("last_seq")] if isinstance(seq, int)}
    members = _pg_members(entries)
    out: PgDivergence = {"pg": name, "desc": entries[0][1].get("desc", ""), "members": members,
                           "reporting": sorted(r for r, _ in entries), "status": "agree",
                           "last_seq": max(last.values()) if last else None, "divergence_seq": None,
                           "op": None, "entered": [], "not_entered": [],
                           "no_data": sorted(set(members or []) - {r for r, _ in entries}),
                           "mismatched": _mismatches(entries)}
    if last and min(last.values()) < max(last.values()):
        div = min(last.values()) + 1
        ops = {r: {int(s): str(o) for s, o in pg.get("ops", [])}.get(div) for r, pg in entries}
        entered = sorted(r for r, s in last.items() if s >= div)
        out["status"], out["divergence_seq"], out["entered"] = "diverged", div, entered
        out["not_entered"] = sorted(r for r, s in last.items() if s < div)
        out["op"] = (Counter(o for r, o in ops.items() if o and r in entered).most_common(1)[0][0]
                     if any(ops.get(r) for r in entered) else None)
    elif out["mismatched"]:
        out["status"] = "diverged"
    return out


def flight_divergence(dumped_or_not: list[RankDoc]) -> FlightDivergence:
    """Per process group: where the ranks' collective sequences diverge, who never entered it."""
    by_pg: dict[str, list[tuple[int, PgSummary]]] = defaultdict(list)
    with_data = 0
    for rank in dumped_or_not:
        fl = rank.get("flight")
        if not isinstance(fl, dict):
            continue
        with_data += 1
        for name, pg in (fl.get("pgs") or {}).items():
            by_pg[str(name)].append((rank["rank"], pg))
    pgs = [_pg_divergence(name, entries) for name, entries in sorted(by_pg.items())]
    suspects: dict[int, str] = {}
    for div in pgs:
        label = f"process group {div['pg']}" + (f" ({div['desc']})" if div["desc"] else "")
        for r in div["not_entered"]:
            op = f" ({div['op']})" if div["op"] else ""
            suspects.setdefault(r, f"never entered collective #{div['divergence_seq']}{op} of {label}, which "
                                   f"{len(div['entered'])} rank(s) entered")
        for mm in div["mismatched"]:
            for other, op in mm["ranks"].items():
                suspects.setdefault(int(other), f"collective #{mm['seq']} of {label} is {op} here, {mm['op']} on the "
                                            "other ranks")
    return {"ranks_with_data": with_data, "groups": pgs, "suspects": suspects}


# -- the whole analysis -----------------------------------------------------------------------------

def _identity(ranks: list[RankDoc]) -> tuple[list[DuplicateRank], set[int], int | None]:
    """(ranks claimed by several processes, the WORLD_SIZEs seen, the world size when one)."""
    claims = Counter(r["rank"] for r in ranks)
    twice = {k for k, n in claims.items() if n > 1}
    where: dict[int, list[str]] = defaultdict(list)
    for r in ranks:
        if r["rank"] in twice:
            where[r["rank"]].append(f"{r['node']}:{r['pid']}")
    dups: list[DuplicateRank] = [{"rank": k, "where": v} for k, v in sorted(where.items())]
    worlds = {w for r in ranks for w in [r.get("world_size")] if w is not None}
    return dups, worlds, (next(iter(worlds)) if len(worlds) == 1 else None)


def _group_docs(groups: list[StackGroup], dumped: list[RankDoc], dominant: StackGroup | None) -> list[GroupDoc]:
    docs = []
    for g in groups:
        members = [dumped[i] for i in g.members]
        doc: GroupDoc = {"id": g.id, "size": g.size, "ranks": sorted(r["rank"] for r in members),
                         "nodes": fold({r["node"] for r in members}), "dominant": g is dominant,
                         "in_collective": g.in_collective, "main_frames": g.main_frames,
                         "collective_frames": g.collective_frames, "distinct_frames": [], "splits_from": None}
        if dominant is not None and g is not dominant:
            mine, theirs = g.main_frames, dominant.main_frames
            if mine == theirs:  # the same main thread: the communication threads differ
                mine, theirs = g.collective_frames, dominant.collective_frames
            doc["distinct_frames"], doc["splits_from"] = distinct(mine, theirs)
        docs.append(doc)
    return docs


def _stack_suspects(groups: list[StackGroup], docs: list[GroupDoc], dumped: list[RankDoc],
                    dominant: StackGroup) -> list[Suspect]:
    out: list[Suspect] = []
    where = f"the collective the other {dominant.size} rank(s) wait in" if dominant.in_collective else None
    for g, doc in sorted(zip(groups, docs), key=lambda gd: gd[0].size):
        if g is dominant or (g.in_collective and not dominant.in_collective):
            continue  # ranks in a collective while the majority is not: they wait for the majority
        shown = doc["distinct_frames"][:3] or doc["main_frames"][:3]
        if where and not g.in_collective:
            why = f"not in {where}: " + " <- ".join(shown)
        else:
            why = f"stack differs from the {dominant.size} rank(s) of group {dominant.id}: " + " <- ".join(shown)
        for i in sorted(g.members, key=lambda i: dumped[i]["rank"]):
            r = dumped[i]
            out.append({"rank": r["rank"], "node": r["node"], "pid": r["pid"], "group": g.id,
                        "source": "stacks", "why": why, "frames": _with_lines(r)})
    return out


def _flight_suspects(fr: FlightDivergence, ranks: list[RankDoc], already: set[int]) -> list[Suspect]:
    where = {r["rank"]: r for r in ranks}
    out: list[Suspect] = []
    for rank, why in sorted(fr["suspects"].items()):
        if rank in already:
            continue
        r = where.get(rank)
        out.append({"rank": rank, "node": r["node"] if r else None, "pid": r["pid"] if r else None, "group": None,
                    "source": "flight-recorder", "why": why, "frames": _with_lines(r) if r and r.get("threads") else []})
    return out


def _problems(*, ranks: list[RankDoc], undumped: list[Undumped], nodes: list[NodeOutline], missing: list[int],
              dups: list[DuplicateRank], worlds: set[int], dominant_why: str, dominant: StackGroup | None,
              scope: str) -> list[str]:
    out = []
    if not ranks:
        out.append("no rank process was found" + (" on any node" if scope == "job" else ""))
    if dups:
        d = dups[0]
        out.append(f"rank {d['rank']} is claimed by {len(d['where'])} processes ({', '.join(d['where'][:4])})"
                   + (f" and {len(dups) - 1} more rank(s)" if len(dups) > 1 else "")
                   + ": does the selection match more than one job?")
    if len(worlds) > 1:
        out.append(f"the processes disagree on the world size ({', '.join(map(str, sorted(worlds)))}): more than one job?")
    bad = [n for n in nodes if n.get("status") in BAD_NODE_STATUSES]
    if bad:
        first = bad[0]
        out.append(f"{len(bad)} node(s) not fully collected: {fold(n['node'] for n in bad)} "
                   f"({first['node']}: {first['status']}{': ' + first['reason'] if first.get('reason') else ''})")
    elif undumped:
        out.append(f"{len(undumped)} rank(s) not dumped (rank {undumped[0]['rank']} on {undumped[0]['node']}: "
                   f"{undumped[0]['error']})")
    if missing and scope == "job":
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        out.append(f"{len(missing)} rank(s) of the world were not found on any node: {shown} "
                   "(dead processes, or nodes outside the node set)")
    if ranks and dominant is None and dominant_why != "no rank was dumped":
        out.append(dominant_why)
    return out


def _waiting_for_the_majority(groups: list[StackGroup], dominant: StackGroup | None) -> str | None:
    """When the majority is outside any collective and some ranks wait in one, those ranks wait
    for the majority: a stall of the whole job (data loading, a shared filesystem), which
    stacks do not localize to a rank."""
    if dominant is None or dominant.in_collective:
        return None
    waiting = sum(g.size for g in groups if g is not dominant and g.in_collective)
    if not waiting:
        return None
    top = dominant.main_frames[0] if dominant.main_frames else "?"
    return (f"the majority ({dominant.size} ranks) is outside any collective, in {top}, and {waiting} rank(s) "
            "wait in a collective for them: a stall of the whole job, not of one rank")


def analyze(ranks: list[RankDoc], nodes: list[NodeOutline] | None = None, *, topology: Topology | None = None,
            scope: str = "job") -> Analysis:
    """The analysis document's body (see the module text). scope "local": one node's ranks, so
    ranks of the world found elsewhere are not missing."""
    nodes = nodes or []
    dumped = [r for r in ranks if r.get("status") == "dumped" and r.get("threads")]
    undumped: list[Undumped] = [{"rank": r["rank"], "node": r["node"], "pid": r["pid"],
                                 "error": r.get("error") or "no stacks"}
                                for r in ranks if not (r.get("status") == "dumped" and r.get("threads"))]
    dups, worlds, world = _identity(ranks)
    missing = sorted(set(range(world)) - {r["rank"] for r in ranks}) if world is not None else []
    groups = group_ranks(dumped)
    dominant, dominant_why = pick_dominant(groups, len(dumped))
    docs = _group_docs(groups, dumped, dominant)
    suspects = _stack_suspects(groups, docs, dumped, dominant) if dominant is not None else []
    fr = flight_divergence(ranks)
    suspects += _flight_suspects(fr, ranks, {s["rank"] for s in suspects})
    node_of = {r["rank"]: r["node"] for r in ranks}
    suspect_nodes = fold({s["node"] for s in suspects if s["node"]})
    evict = evict_plan(topology, [s["rank"] for s in suspects], node_of) if topology and suspects else None
    problems = _problems(ranks=ranks, undumped=undumped, nodes=nodes, missing=missing, dups=dups, worlds=worlds,
                         dominant_why=dominant_why, dominant=dominant, scope=scope)
    stall = _waiting_for_the_majority(groups, dominant)
    if stall:
        problems.append(stall)
    invalid = not ranks or bool(dups) or len(worlds) > 1
    if suspects and not invalid:
        status, code = "suspects", 1
    elif problems:
        status, code = "could-not-judge", 3
    else:
        status, code = "agree", 0
    return {
        "status": status, "exit_code": code,
        "summary": _summary(status, suspects, suspect_nodes, problems, groups, dumped, scope),
        "problems": problems,
        "world_size": world, "ranks_found": len(ranks), "ranks_dumped": len(dumped),
        "missing_ranks": missing if scope == "job" else [], "duplicate_ranks": dups,
        "dominant_group": dominant.id if dominant else None, "dominant_why": dominant_why,
        "groups": docs, "suspects": suspects, "suspect_nodes": suspect_nodes,
        "evict_nodes": evict["evict_nodes"] if evict else suspect_nodes,
        "topology": evict, "undumped": undumped,
        "flight_recorder": {"ranks_with_data": fr["ranks_with_data"], "groups": fr["groups"]},
        "nodes": nodes,
        "uncollected_nodes": fold(n["node"] for n in nodes if n.get("status") in BAD_NODE_STATUSES),
    }


def _summary(status: str, suspects: list[Suspect], suspect_nodes: str, problems: list[str],
             groups: list[StackGroup], dumped: list[RankDoc], scope: str) -> str:
    if status == "suspects":
        first = suspects[0]
        where = f" on {first['node']}" if first["node"] else ""
        more = f" and {len(suspects) - 1} more" if len(suspects) > 1 else ""
        tail = f"; also: {problems[0]}" if problems else ""
        return (f"{len(suspects)} suspect rank(s): rank {first['rank']}{where}{more} ({first['why']}); "
                f"suspect nodes: {suspect_nodes}{tail}")
    if status == "could-not-judge":
        return "could not judge: " + "; ".join(problems)
    top = groups[0].main_frames[:1] if groups else []
    where = f" (every one in {top[0]})" if top else ""
    who = "ranks on this node" if scope == "local" else "ranks"
    return (f"all {len(dumped)} {who} agree{where}: their stacks cannot localize this hang; "
            "find the bad node with a group test: gpucheck bisect NODESET")


def document(report: Analysis, *, source: Source, started: float,
             interrupted: str | None = None, now: float | None = None) -> HangDocument:
    """The versioned `gpucheck.hang` document around an analysis. An interrupted collection is
    never a judgement of the whole job: exit 3, whatever the ranks collected show."""
    import time

    from ..core.verdict import iso_utc

    now = time.time() if now is None else now
    doc: HangDocument = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "gpucheck_version": __version__,
                         "time": iso_utc(started), "duration_s": round(now - started, 3), "source": source,
                         "interrupted": interrupted, **report}
    if interrupted:
        why = f"interrupted ({interrupted}) before every node answered"
        doc["problems"] = [why, *report["problems"]]
        doc["status"], doc["exit_code"] = "could-not-judge", 3
        doc["summary"] = f"could not judge: {why}; " + report["summary"]
    return doc
