"""Compare nodes with each other (pure functions over verdicts).

Performance: every throughput/bandwidth metric (unit ending in "/s": TFLOP/s, GB/s, ...) that
the nodes measured is compared across the fleet, per (check, metric, GPU model): one value per
(node, subject). A value is an outlier when it lies below the median by more than
max(z * 1.4826 * MAD, rel_floor * median): the MAD term is the robust spread of the fleet, the
relative floor keeps a very uniform fleet from flagging noise. Both numbers are reported next to
every value. Fewer than `min_nodes` nodes: not compared (a median of two says nothing about
which one is slow).

Bitwise: the reproducibility digests are compared by majority per software/hardware
fingerprint with gpucheck.repro.majority.fleet_outliers, imported lazily; without it the report
says the bitwise comparison is unavailable and why.

A sweep keeps no verdict in memory: `fleet_inputs(verdict)` (gpucheck.core.documents) takes what
the comparison reads from one verdict (its throughput values and digest sets, a few hundred
bytes) as the verdict arrives, and `compare_inputs` compares those. The functions taking verdicts are the same
comparison over `fleet_inputs` of each. The comparison is a FleetComparison (its performance and
bitwise parts, typed); `to_json` is what the sweep report holds under "fleet".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, cast

from ..core.documents import BITWISE_CHECK, FleetInputs, Key, fleet_inputs
from ..core.jsonvalue import JsonValue
from ..core.verdict import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from ..repro.majority import FleetGroup

MAD_Z = 3.5  # robust z-score beyond which a value is an outlier
REL_FLOOR = 0.05  # ... and at least this fraction of the median below it
MIN_NODES = 3  # fewest nodes a metric is compared across
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data
RULE = "value < median - max(mad_z * 1.4826 * MAD, rel_floor * median)"


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def mad(values: list[float], center: float | None = None) -> float:
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


@dataclass(frozen=True)
class LowOutliers:
    """The values far below the others: below `limit`, each with its robust z (None when the
    MAD is 0)."""

    median: float
    mad: float
    limit: float
    outliers: dict[str, float | None]


def low_outliers(values: Mapping[str, float], *, mad_z: float = MAD_Z, rel_floor: float = REL_FLOOR) -> LowOutliers:
    """Values (keyed by any label) that are far below the others. Higher is better."""
    vals = [float(v) for v in values.values()]
    med = median(vals)
    m = mad(vals, med)
    margin = max(mad_z * MAD_SCALE * m, rel_floor * abs(med))
    limit = med - margin
    scale = MAD_SCALE * m if m > 0 else None
    out: dict[str, float | None] = {}
    for label, v in values.items():
        if float(v) < limit:
            out[label] = round((float(v) - med) / scale, 2) if scale else None
    return LowOutliers(med, m, limit, out)


# What a fleet finding asks for: bits that differ from the fleet's majority are silent data
# corruption (the burn's corruption verdict is drain too); a slow GPU is for a person to look at.
CORRUPTION_ACTION = "drain"
SLOW_ACTION = "investigate"


@dataclass(frozen=True)
class FleetFinding:
    """One thing the fleet comparison found about a node: the check and the subject it is about
    (a GPU, or "node"), one line that names them, and the action it asks for. The sweep merges
    a node's findings into its own verdict once (gpucheck.fleet.sweep.apply_fleet)."""

    check: str
    subject: str
    text: str
    action: str  # an Action value

    @property
    def label(self) -> str:
        """"check:subject" ("check" for the node), as a node's failing checks are named."""
        return self.check if self.subject == "node" else f"{self.check}:{self.subject}"


def _texts(findings: Mapping[str, list[FleetFinding]]) -> dict[str, list[str]]:
    return {node: [f.text for f in items] for node, items in findings.items()}


@dataclass(frozen=True)
class Outlier:
    node: str
    subject: str
    value: float
    z: float | None
    rel: float | None  # (value - median) / median; None for a median of 0

    def to_json(self) -> dict[str, JsonValue]:
        return {"node": self.node, "subject": self.subject, "value": self.value, "z": self.z, "rel": self.rel}


@dataclass(frozen=True)
class MetricComparison:
    """One (check, metric, unit, GPU model) across the fleet: compared (its median, MAD, limit and
    outliers), or not and why (too few nodes)."""

    check: str
    metric: str
    unit: str
    model: str
    nodes: int
    values: int
    compared: bool
    why: str = ""
    median: float = 0.0
    mad: float = 0.0
    limit: float = 0.0
    outliers: tuple[Outlier, ...] = ()

    def to_json(self) -> dict[str, JsonValue]:
        doc: dict[str, JsonValue] = {"check": self.check, "metric": self.metric, "unit": self.unit,
                                     "model": self.model, "nodes": self.nodes, "values": self.values}
        if not self.compared:
            doc.update(compared=False, why=self.why)
        else:
            doc.update(compared=True, median=self.median, mad=self.mad, limit=self.limit,
                       outliers=[o.to_json() for o in self.outliers])
        return doc


@dataclass(frozen=True)
class PerformanceComparison:
    mad_z: float
    rel_floor: float
    min_nodes: int
    metrics: tuple[MetricComparison, ...]
    findings: dict[str, list[FleetFinding]]  # node -> its findings ("slow burn.gemm.tflops_bf16 gpu1: ...")

    @property
    def by_node(self) -> dict[str, list[str]]:
        return _texts(self.findings)

    def to_json(self) -> dict[str, JsonValue]:
        return {"thresholds": {"mad_z": self.mad_z, "rel_floor": self.rel_floor, "min_nodes": self.min_nodes,
                               "rule": RULE},
                "metrics": [m.to_json() for m in self.metrics],
                "by_node": {node: list(items) for node, items in self.by_node.items()}}


@dataclass(frozen=True)
class BitwiseComparison:
    """The digests compared by majority per fingerprint, or why not (`available`: the
    comparison could be imported; `compared`: some node reported digests)."""

    available: bool
    compared: bool
    why: str = ""
    nodes: int = 0
    fingerprints: "Mapping[str, FleetGroup]" = field(default_factory=dict)  # repro.majority.fleet_outliers
    findings: dict[str, list[FleetFinding]] = field(default_factory=dict)

    @property
    def by_node(self) -> dict[str, list[str]]:
        return _texts(self.findings)

    def to_json(self) -> dict[str, JsonValue]:
        by_node: dict[str, JsonValue] = {node: list(items) for node, items in self.by_node.items()}
        if not self.available:
            return {"available": False, "compared": False, "why": self.why, "by_node": by_node}
        if not self.compared:
            return {"available": True, "compared": False, "nodes": self.nodes, "by_node": by_node, "why": self.why}
        return {"available": True, "compared": True, "nodes": self.nodes,
                "fingerprints": {key: cast(JsonValue, fp) for key, fp in self.fingerprints.items()}, "by_node": by_node}


@dataclass(frozen=True)
class FleetComparison:
    nodes_compared: int
    performance: PerformanceComparison
    bitwise: BitwiseComparison

    def to_json(self) -> dict[str, JsonValue]:
        return {"nodes_compared": self.nodes_compared, "performance": self.performance.to_json(),
                "bitwise": self.bitwise.to_json()}


def _inputs(verdicts: Mapping[str, Verdict]) -> dict[str, FleetInputs]:
    return {node: fleet_inputs(v) for node, v in verdicts.items()}


def throughput_values(verdicts: Mapping[str, Verdict]) -> dict[Key, dict[tuple[str, str], float]]:
    """{(check, metric, unit, model): {(node, subject): value}} for every "/s" metric."""
    return _throughput_groups(_inputs(verdicts))


def _throughput_groups(inputs: Mapping[str, FleetInputs]) -> dict[Key, dict[tuple[str, str], float]]:
    groups: dict[Key, dict[tuple[str, str], float]] = {}
    for node, got in inputs.items():
        for key, subject, value in got.throughput:
            groups.setdefault(key, {})[(node, subject)] = value
    return groups


def performance_outliers(verdicts: Mapping[str, Verdict], **thresholds: Any) -> PerformanceComparison:
    """Throughput outliers across nodes: every metric compared, and each node's findings."""
    return performance_of(_inputs(verdicts), **thresholds)


def _compared(key: Key, values: dict[tuple[str, str], float], mad_z: float, rel_floor: float,
              by_node: dict[str, list[FleetFinding]]) -> MetricComparison:
    """One metric compared across the nodes; each outlier's finding added to `by_node`."""
    check, metric, unit, model = key
    res = low_outliers({f"{n}\t{s}": v for (n, s), v in values.items()}, mad_z=mad_z, rel_floor=rel_floor)
    outliers = []
    for label, z in sorted(res.outliers.items()):
        node, subject = label.split("\t", 1)
        value = values[(node, subject)]
        rel = (value - res.median) / res.median if res.median else None
        outliers.append(Outlier(node, subject, value, z, None if rel is None else round(rel, 4)))
        where = f" {subject}" if subject != "node" else ""
        pct = f"{rel * 100:+.0f}%" if rel is not None else "low"
        by_node.setdefault(node, []).append(FleetFinding(
            check, subject, f"slow {check}.{metric}{where}: {value:g} {unit} < {res.limit:.4g} "
                            f"(fleet median {res.median:.4g}, {pct})", SLOW_ACTION))
    return MetricComparison(check, metric, unit, model, nodes=len({n for n, _ in values}), values=len(values),
                            compared=True, median=round(res.median, 4), mad=round(res.mad, 4),
                            limit=round(res.limit, 4), outliers=tuple(outliers))


def performance_of(inputs: Mapping[str, FleetInputs], *, mad_z: float = MAD_Z, rel_floor: float = REL_FLOOR,
                   min_nodes: int = MIN_NODES) -> PerformanceComparison:
    """performance_outliers over the nodes' FleetInputs."""
    metrics = []
    by_node: dict[str, list[FleetFinding]] = {}
    for key, values in sorted(_throughput_groups(inputs).items()):
        nodes = len({n for n, _ in values})
        if nodes < min_nodes:
            check, metric, unit, model = key
            metrics.append(MetricComparison(check, metric, unit, model, nodes=nodes, values=len(values),
                                            compared=False, why=f"measured on {nodes} node(s), need {min_nodes}"))
            continue
        metrics.append(_compared(key, values, mad_z, rel_floor, by_node))
    return PerformanceComparison(mad_z, rel_floor, min_nodes, tuple(metrics), by_node)


def bitwise_comparison(verdicts: Mapping[str, Verdict]) -> BitwiseComparison:
    """Digests compared by majority per fingerprint (gpucheck.repro.majority.fleet_outliers)."""
    return bitwise_of(_inputs(verdicts))


def bitwise_of(inputs: Mapping[str, FleetInputs]) -> BitwiseComparison:
    """bitwise_comparison over the nodes' FleetInputs."""
    try:
        from ..repro.majority import fleet_outliers
    except ImportError as e:
        return BitwiseComparison(available=False, compared=False, why=f"unavailable ({e})")
    sets = {n: got.digests for n, got in inputs.items() if got.digests}
    if not sets:
        return BitwiseComparison(available=True, compared=False, nodes=0,
                                 why=f"no node reported digests (the {BITWISE_CHECK} check did not run)")
    report = fleet_outliers(sets)
    by_node: dict[str, list[FleetFinding]] = {}
    for key, fp in report.items():
        for node, workloads in fp["outliers"].items():
            agree = min(fp["workloads"][w]["agree"] for w in workloads)
            of = max(fp["workloads"][w]["of"] for w in workloads)
            by_node.setdefault(node, []).append(FleetFinding(
                BITWISE_CHECK, "node", f"bitwise: digests differ from the fleet majority ({agree} of {of} nodes, "
                                       f"fingerprint {key[:12]}) in {', '.join(workloads)}", CORRUPTION_ACTION))
        for node, finding in _split_nodes(key, fp, inputs):
            by_node.setdefault(node, []).append(finding)
    return BitwiseComparison(available=True, compared=True, nodes=len(sets), fingerprints=report, findings=by_node)


def _split_nodes(key: str, fp: Mapping[str, Any],
                 inputs: Mapping[str, FleetInputs]) -> list[tuple[str, FleetFinding]]:
    """The GPUs of the nodes whose own GPUs disagreed on a workload (no majority on the node, so
    its digest set leaves the workload out: the vote lists the node as missing) that differ
    from the fleet's majority for it, held by at least two nodes: the fleet tells which GPU of
    the node is wrong where the node alone could not."""
    from ..repro.majority import AGREE, MAJORITY

    out: list[tuple[str, FleetFinding]] = []
    for workload, v in fp["workloads"].items():
        majority = v.get("majority")
        if v.get("status") not in (AGREE, MAJORITY) or not majority or v.get("agree", 0) < 2:
            continue
        for node in v.get("missing") or ():
            got = inputs.get(node)
            for fingerprint, subject, name, digest in (got.gpu_digests if got is not None else ()):
                if name == workload and key.startswith(fingerprint) and not majority.startswith(digest):
                    out.append((node, FleetFinding(
                        BITWISE_CHECK, subject, f"bitwise {subject}: {workload} differs from the fleet majority "
                                                f"({v['agree']} of {v['of']} nodes, fingerprint {key[:12]}); the "
                                                f"node's own GPUs disagree", CORRUPTION_ACTION)))
    return out


def compare_fleet(verdicts: Mapping[str, Verdict], **thresholds: Any) -> FleetComparison:
    """The whole fleet comparison of a sweep's verdicts: performance outliers and bitwise majority."""
    return compare_inputs(_inputs(verdicts), **thresholds)


def compare_inputs(inputs: Mapping[str, FleetInputs], *, mad_z: float = MAD_Z, rel_floor: float = REL_FLOOR,
                   min_nodes: int = MIN_NODES) -> FleetComparison:
    """compare_fleet over the nodes' FleetInputs (what a sweep keeps of each verdict)."""
    return FleetComparison(len(inputs), performance_of(inputs, mad_z=mad_z, rel_floor=rel_floor, min_nodes=min_nodes),
                           bitwise_of(inputs))


def findings_by_node(comparison: FleetComparison) -> dict[str, list[FleetFinding]]:
    """Each node's findings: the bitwise ones first, then the performance ones."""
    out: dict[str, list[FleetFinding]] = {}
    for part in (comparison.bitwise.findings, comparison.performance.findings):
        for node, items in part.items():
            out.setdefault(node, []).extend(items)
    return out
