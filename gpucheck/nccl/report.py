"""One job's outcome from its ranks' result events (pure: no torch, no I/O).

Every rank's result event carries the whole job's measurements (the ranks exchange them), but
failures are seen differently: a corruption is reported by all ranks alike; after a timeout the
survivors name the rank they waited for, while that rank reports nothing (killed) or something
else. `merge` folds the events into one outcome, naming the culprit the survivors agree on.
"""

from __future__ import annotations

from collections import Counter
from typing import TypedDict, cast

from .collective import Failure, NcclEvent, RankReport, SizeRow, timeout_summary


class Verdict(TypedDict):
    """What one job comes to: ok, fail or error, why, and the failure it names."""

    status: str
    summary: str
    failure: Failure | None


class _GroupExtras(TypedDict, total=False):
    # gpucheck.nccl.launch.run_group: a job across hosts
    launch_errors: dict[str, str]  # host -> why it gave no result
    unreachable: list[str]  # hosts the launcher could not connect to
    stopped: list[str]  # hosts whose processes were ended because another could not take part
    nodes: list[str]


class _Base(TypedDict):
    """What every outcome of merge has, whatever it comes to."""

    world: int
    hosts: list[str | None]  # each rank's host
    backend: str | None
    versions: dict[str, str]
    gpu_name: str | None
    results: list[SizeRow]  # every rank's numbers (from a rank that has them)
    ranks: dict[int, str]  # rank -> its status
    injected: list[str]
    warnings: list[str]


class Outcome(_Base, Verdict, _GroupExtras):
    """One job's ranks folded (merge): what it comes to, and every rank's numbers."""


def parse_events(text: str) -> list[NcclEvent]:
    """The JSON event lines in a `gpucheck nccl run` output (its schema's events: gpucheck.nccl.collective);
    other lines are ignored."""
    from ..platform.safeio import loads_json

    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = loads_json(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "event" in doc:
            out.append(cast(NcclEvent, doc))
    return out


def merge(reports: list[RankReport], world: int | None = None) -> Outcome:
    """Fold rank result events into {status, summary, failure, results, ranks, hosts, ...}.

    status: ok | fail | error. failure: the corruption if any rank saw one, else a rank that refused
    to start on a GPU in use (kind "busy": error, whatever its peers' timeouts say), else a
    rendezvous that never formed (kind "rendezvous": error, a setup problem, whatever the peers'
    timeouts say), else the timeout culprit named by most survivors, else a rank that exited
    without a result, else the first error. `warnings`: every rank's warnings, prefixed with it.
    """
    world = world or max((int(r.get("world") or 0) for r in reports), default=0)
    by_rank = {int(r["rank"]): r for r in reports if r.get("rank") is not None}
    hosts = _hosts(reports, world)
    with_results = [r for r in sorted(by_rank.values(), key=lambda r: r["rank"]) if r.get("results")]
    base: _Base = {
        "world": world,
        "hosts": hosts,
        "backend": next((r.get("backend") for r in reports if r.get("backend")), None),
        "versions": next((r.get("versions") for r in reports if r.get("versions")), {}),
        "gpu_name": next((r.get("gpu_name") for r in reports if r.get("gpu_name")), None),
        "results": with_results[0]["results"] if with_results else [],
        "ranks": {r: by_rank[r].get("status") for r in sorted(by_rank)},
        "injected": sorted({t for r in reports for t in r.get("injected", [])}),
        "warnings": [f"rank {r.get('rank')}: {w}" for r in reports for w in r.get("warnings") or []],
    }
    missing = [r for r in range(world) if r not in by_rank]
    failures: list[Failure] = [r.get("failure") or {} for r in reports if r.get("status") != "ok"]
    corrupt = next((f for f in failures if f.get("kind") == "corruption"), None)
    if corrupt:
        return {**base, "status": "fail", "summary": corrupt["summary"], "failure": corrupt}
    special = _not_started(reports)
    if special is not None:
        return {**base, **special}
    return {**base, **_failed(reports, by_rank, hosts, missing, failures)}


def _failure(rep: RankReport) -> Failure:
    """A rank's failure ({} when it has none)."""
    return rep.get("failure") or {}


def _not_started(reports: list[RankReport]) -> Verdict | None:
    """A rank that refused a busy GPU, a rendezvous that never formed, a stopped run: no verdict
    on the hardware (status error), whatever the peers' timeouts say."""
    busy = [r for r in reports if _failure(r).get("kind") == "busy"]
    if busy:
        rep = busy[0]
        summary = (f"rank {rep.get('rank')} on host {rep.get('host') or 'unknown'} did not start: "
                   f"{_failure(rep).get('detail') or rep.get('summary')}")
        return {"status": "error", "summary": summary, "failure": {**_failure(rep), "summary": summary}}
    rendezvous = [r for r in reports if _failure(r).get("kind") == "rendezvous"]
    if rendezvous:
        rep = rendezvous[0]
        summary = (f"the rendezvous never formed (rank {rep.get('rank')} on host {rep.get('host') or 'unknown'}: "
                   f"{_failure(rep).get('detail') or rep.get('summary')})")
        return {"status": "error", "summary": summary, "failure": {**_failure(rep), "summary": summary}}
    cancelled = [r for r in reports if _failure(r).get("kind") == "cancelled"]
    if cancelled:
        return {"status": "error", "summary": f"stopped before the end ({_failure(cancelled[0])['detail']})",
                "failure": cancelled[0]["failure"]}
    return None


def _failed(reports: list[RankReport], by_rank: dict[int, RankReport], hosts: list[str | None],
            missing: list[int], failures: list[Failure]) -> Verdict:
    """The timeout culprit most survivors name, else a rank that exited, else the first error."""
    culprit = _culprit(reports, hosts)
    if culprit is not None:
        return culprit
    exited = [int(r["rank"]) for r in reports if _failure(r).get("kind") == "exit"]
    if exited or missing:
        r = (exited or missing)[0]
        host = hosts[r] if r < len(hosts) else None
        gave = by_rank.get(r)
        why = (gave.get("summary") if gave else None) or f"rank {r} gave no result"
        summary = f"rank {r} on host {host or 'unknown'} exited during the test ({why})"
        return {"status": "fail", "summary": summary,
                "failure": {"kind": "exit", "rank": r, "host": host, "summary": summary}}
    timeouts = [f for f in failures if f.get("kind") == "timeout"]
    if timeouts:
        f = timeouts[0]
        summary = timeout_summary(None, None, f.get("what", ""))
        return {"status": "fail", "summary": summary, "failure": {**f, "summary": summary}}
    errors = [r for r in reports if r.get("status") not in ("ok", "fail")]
    if errors:
        return {"status": "error", "summary": errors[0].get("summary") or "error", "failure": errors[0].get("failure")}
    if not reports:
        return {"status": "error", "summary": "no rank reported", "failure": None}
    first = by_rank.get(0) or reports[0]
    return {"status": "ok", "summary": first.get("summary", "ok"), "failure": None}


def _culprit(reports: list[RankReport], hosts: list[str | None]) -> Verdict | None:
    """The rank the survivors waited for. A survivor naming itself (its own process was killed
    as frozen by the supervisor) is weaker evidence than a peer naming it."""
    named: Counter[int] = Counter()
    detail: dict[int, Failure] = {}
    for rep in reports:
        f = _failure(rep)
        blamed = f.get("rank")
        if rep.get("status") == "ok" or f.get("kind") != "timeout" or blamed is None:
            continue
        weight = 1 if int(blamed) == int(rep["rank"]) else 2
        named[int(blamed)] += weight
        if weight == 2 or int(blamed) not in detail:
            detail[int(blamed)] = {**f, "reported_by": rep["rank"]}
    if not named:
        return None
    culprit, _ = max(named.items(), key=lambda kv: (kv[1], -kv[0]))
    f = detail[culprit].copy()
    if not f.get("host") and culprit < len(hosts):
        f["host"] = hosts[culprit]
    summary = timeout_summary(culprit, f.get("host"), f.get("what", ""))
    return {"status": "fail", "summary": summary, "failure": {**f, "summary": summary}}


def _hosts(reports: list[RankReport], world: int) -> list[str | None]:
    hosts: list[str | None] = [None] * world
    for rep in reports:
        for i, h in enumerate(rep.get("hosts") or []):
            if i < world and h and not hosts[i]:
                hosts[i] = h
        r = rep.get("rank")
        if r is not None and int(r) < world and rep.get("host"):
            hosts[int(r)] = hosts[int(r)] or rep["host"]
    return hosts


def largest(results: list[SizeRow], op: str) -> SizeRow | None:
    rows = [r for r in results if r.get("op") == op and r.get("busbw_gbs") is not None]
    return max(rows, key=lambda r: r["bytes"]) if rows else None
