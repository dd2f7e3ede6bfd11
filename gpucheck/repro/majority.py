"""Majority votes over digests: the GPUs of one node, or the nodes of a fleet. Pure functions on
plain data; imports nothing heavy (the fleet sweep uses them without torch).

A vote is decided only by a strict majority (more than half of the voters hold one digest): a
digest held by half or fewer cannot outvote the rest, because the odd ones out might be the
healthy ones. Outcomes:

    agree        every voter holds the same digest
    majority     one digest is held by more than half; the others are outliers
    tie          two or more digests share the largest group: nobody can be named
    no-majority  the largest group is unique but holds half or fewer: nobody can be named
    single       one voter: nothing to compare
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, TypedDict, TypeVar

AGREE = "agree"
MAJORITY = "majority"
TIE = "tie"
NO_MAJORITY = "no-majority"
SINGLE = "single"


class _VoteMissing(TypedDict, total=False):
    missing: list[Any]  # fleet_outliers: the nodes of the fingerprint that did not run the workload


class Vote(_VoteMissing):
    """A majority vote over digests (vote)."""

    status: str  # AGREE, MAJORITY, TIE, NO_MAJORITY or SINGLE
    majority: str | None  # the digest held by more than half (one voter: its digest)
    agree: int  # voters holding it (0 without one)
    of: int  # voters
    outliers: list[Any]  # voters not holding it (empty without a majority): GPU indices or node names
    groups: dict[str, list[Any]]  # digest -> its voters, largest group first


class FleetGroup(TypedDict):
    """The nodes of one fingerprint compared (fleet_outliers)."""

    nodes: list[str]
    status: str  # "ok", "outliers", "tie" or "single-node"
    outliers: dict[str, list[str]]  # node -> workloads where it differs from the majority
    ties: list[str]  # workloads without a majority
    workloads: dict[str, Vote]  # workload -> the vote over the nodes that ran it (with "missing")


_Voter = TypeVar("_Voter", bound=Hashable)  # a GPU index, a node name


def vote(digests: Mapping[_Voter, str]) -> Vote:
    """Majority among `digests` (voter -> digest).

    Returns {"status": agree|majority|tie|no-majority|single, "majority": digest or None,
    "agree": voters holding the majority digest (0 without one), "of": voters,
    "outliers": [voters not holding it] (empty without a majority),
    "groups": {digest: [voters]} (largest group first)}."""
    groups: dict[str, list[Any]] = {}
    for voter, d in digests.items():
        groups.setdefault(d, []).append(voter)
    for v in groups.values():
        v.sort(key=_sort_key)
    ordered = dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))
    n = len(digests)
    out: Vote = {"status": SINGLE, "majority": None, "agree": 0, "of": n, "outliers": [], "groups": ordered}
    if n == 0:
        out["status"] = NO_MAJORITY
        return out
    sizes = [len(v) for v in ordered.values()]
    top_digest, top = next(iter(ordered.items()))
    if n == 1:
        out.update({"status": SINGLE, "majority": top_digest, "agree": 1})
    elif len(ordered) == 1:
        out.update({"status": AGREE, "majority": top_digest, "agree": n})
    elif 2 * sizes[0] > n:
        out.update({"status": MAJORITY, "majority": top_digest, "agree": sizes[0],
                    "outliers": sorted((x for d, vs in ordered.items() if d != top_digest for x in vs),
                                       key=_sort_key)})
    elif sizes[0] == sizes[1]:
        out["status"] = TIE
    else:
        out["status"] = NO_MAJORITY
    return out


def _sort_key(x: Any) -> tuple[int, Any]:
    return (0, x) if isinstance(x, (int, float)) else (1, str(x))


def fleet_outliers(nodes: Mapping[str, Mapping[str, Mapping[str, str]]]) -> dict[str, FleetGroup]:
    """Outlier nodes per fingerprint, by majority.

    nodes: {node: {fingerprint_key: {workload: digest}}} (a node with GPUs of two kinds has two
    fingerprint keys).

    Returns {fingerprint_key: {
        "nodes": [nodes with this fingerprint],
        "status": "ok" (every workload agrees) | "outliers" (some node differs from a majority)
                  | "tie" (some workload has no majority, none has outliers) | "single-node",
        "outliers": {node: [workloads where it differs from the majority]},
        "ties": [workloads without a majority (tie or no-majority)],
        "workloads": {workload: vote(...) over the nodes that ran it, plus "missing": [nodes
                      with this fingerprint that did not run it]},
    }}. A fingerprint seen on one node only is "single-node": there is nobody to compare it with.
    """
    by_fp: dict[str, dict[str, Mapping[str, str]]] = {}
    for node, sets in nodes.items():
        for key, digests in sets.items():
            by_fp.setdefault(key, {})[node] = digests
    report: dict[str, FleetGroup] = {}
    for key in sorted(by_fp):
        members = by_fp[key]
        names = sorted(members, key=_sort_key)
        workloads = sorted({w for d in members.values() for w in d})
        per_w: dict[str, Vote] = {}
        outliers: dict[str, list[str]] = {}
        ties: list[str] = []
        for w in workloads:
            votes = {n: members[n][w] for n in names if w in members[n]}
            v = vote(votes)
            v["missing"] = [n for n in names if w not in members[n]]
            per_w[w] = v
            if v["status"] == MAJORITY:
                for n in v["outliers"]:
                    outliers.setdefault(n, []).append(w)
            elif v["status"] in (TIE, NO_MAJORITY):
                ties.append(w)
        if len(names) == 1:
            status = "single-node"
        elif outliers:
            status = "outliers"
        elif ties:
            status = "tie"
        else:
            status = "ok"
        report[key] = {"nodes": names, "status": status, "outliers": outliers, "ties": ties, "workloads": per_w}
    return report
