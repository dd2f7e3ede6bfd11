"""Plain data that the fleet commands write and the layers below them read: what the fleet
comparison takes from a node's verdict (the throughput values it compares across nodes and the
bitwise digest sets: gpucheck.fleet.compare compares them, gpucheck.report draws them), and the
sweep report (gpucheck.fleet.sweep builds it, gpucheck.render.sweep_view prints it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

from .jsonvalue import JsonValue
from .result import Status
from .verdict import Verdict


def _number(v: JsonValue) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _gpu_models(verdict: Verdict) -> dict[int, str]:
    return {g.index: g.name or "unknown" for g in verdict.gpus}


Key = tuple[str, str, str, str]  # (check, metric, unit, GPU model)


@dataclass(frozen=True)
class FleetInputs:
    """What the fleet comparison reads from one node's verdict."""

    throughput: tuple[tuple[Key, str, float], ...] = ()  # (key, subject, value) per "/s" metric
    digests: dict[str, dict[str, str]] | None = None  # digest_sets(verdict)
    # (fingerprint prefix, subject, workload, digest prefix) per GPU of the bitwise check:
    # where the node's own GPUs disagree, the fleet's majority tells which one is wrong
    gpu_digests: tuple[tuple[str, str, str, str], ...] = ()


def fleet_inputs(verdict: Verdict) -> FleetInputs:
    """The throughput values (every "/s" metric of a result that ran) and the digest sets."""
    models = _gpu_models(verdict)
    values: list[tuple[Key, str, float]] = []
    for r in verdict.results:
        if r.status in (Status.SKIP, Status.ERROR):
            continue
        for name, m in r.metrics.items():
            value = _number(m.value)
            if not m.unit.endswith("/s") or value is None:
                continue
            model = models.get(r.gpu, "node") if r.gpu is not None else "node"
            values.append(((r.check, name, m.unit, model), r.subject or "node", value))
    return FleetInputs(tuple(values), digest_sets(verdict), gpu_digests(verdict))


DIGEST_METRIC = "digest_"  # a repro.bitwise GPU result's metric per workload: "digest_gemm.fp32"


def gpu_digests(verdict: Verdict) -> tuple[tuple[str, str, str, str], ...]:
    """(fingerprint prefix, subject, workload, digest prefix) of every GPU result of the bitwise check."""
    out: list[tuple[str, str, str, str]] = []
    for r in verdict.results:
        fingerprint = r.metric_value("fingerprint") if r.check == BITWISE_CHECK and r.gpu is not None else None
        if not isinstance(fingerprint, str) or not fingerprint:
            continue
        for name, m in r.metrics.items():
            if name.startswith(DIGEST_METRIC) and isinstance(m.value, str) and m.value:
                out.append((fingerprint, r.subject, name[len(DIGEST_METRIC):], m.value))
    return tuple(out)


BITWISE_CHECK = "repro.bitwise"  # its node result carries the node's digest sets


def digest_sets(verdict: Verdict) -> dict[str, dict[str, str]] | None:
    """{fingerprint key: {workload: digest}} from a verdict's repro.bitwise node result."""
    for r in verdict.results:
        if r.check == BITWISE_CHECK and r.subject == "node":
            value = r.metric_value("digest_sets")
            if isinstance(value, dict) and value:
                return {str(k): {str(w): str(d) for w, d in v.items()} for k, v in value.items() if isinstance(v, dict)}
    return None


class NodeEntry(TypedDict):
    """A node's entry in the sweep report, but its verdict (report_chunks adds it from the spool)."""

    node: str
    status: str
    reason: str
    action: str
    failing: list[str]
    fleet: list[str]
    checks: dict[str, str]  # check -> its folded status on the node, the fleet's findings merged (the grid row)
    rc: int | None
    duration_s: float
    stderr_tail: str


class _Interruption(TypedDict, total=False):
    """What a sweep stopped by a signal adds to its report (mark_interrupted)."""

    interrupted: str  # SIGTERM, SIGINT
    unanswered: str  # the nodes that did not answer, folded
    planned: int  # how many nodes the sweep was to run on


class SweepReport(_Interruption):
    """The sweep report (`--report FILE`, `--json`; schema gpucheck.sweep) but the nodes'
    verdicts. A TypedDict: it is JSON as it is, streamed out by report_chunks one node at a
    time, and a stopped sweep adds its keys (mark_interrupted)."""

    schema: str
    schema_version: str
    time: str
    duration_s: float
    nodeset: str
    mode: str
    command: str
    run_args: list[str]
    node_args: dict[str, str]
    fanout: int | None
    timeout_s: float | None
    strict: bool
    counts: dict[str, int]  # node status -> number of nodes
    bad: str  # the bad nodes, folded
    by_status: dict[str, str]  # node status -> its nodes, folded (statuses that have some)
    exit_code: int
    fleet: dict[str, JsonValue]  # the fleet comparison (FleetComparison.to_json)
    nodes: list[NodeEntry]
