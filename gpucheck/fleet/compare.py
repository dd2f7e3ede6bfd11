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
comparison over `fleet_inputs` of each.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..core.documents import BITWISE_CHECK, FleetInputs, Key, fleet_inputs

DEFAULTS: dict[str, Any] = {
    "mad_z": 3.5,  # robust z-score beyond which a value is an outlier
    "rel_floor": 0.05,  # ... and at least this fraction of the median below it
    "min_nodes": 3,  # fewest nodes a metric is compared across
}
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data


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


def low_outliers(values: Mapping[str, float], *, mad_z: float = DEFAULTS["mad_z"],
                 rel_floor: float = DEFAULTS["rel_floor"]) -> dict[str, Any]:
    """Values (keyed by any label) that are far below the others. Higher is better.

    Returns {"median", "mad", "limit", "outliers": {label: robust z}}; `limit` is the value
    below which a label is an outlier.
    """
    vals = [float(v) for v in values.values()]
    med = median(vals)
    m = mad(vals, med)
    margin = max(mad_z * MAD_SCALE * m, rel_floor * abs(med))
    limit = med - margin
    scale = MAD_SCALE * m if m > 0 else None
    out = {}
    for label, v in values.items():
        if float(v) < limit:
            out[label] = round((float(v) - med) / scale, 2) if scale else None
    return {"median": med, "mad": m, "limit": limit, "outliers": out}


def _inputs(verdicts: Mapping[str, Mapping[str, Any]]) -> dict[str, FleetInputs]:
    return {node: fleet_inputs(v) for node, v in verdicts.items()}


def throughput_values(verdicts: Mapping[str, Mapping[str, Any]]) -> dict[Key, dict[tuple[str, str], float]]:
    """{(check, metric, unit, model): {(node, subject): value}} for every "/s" metric."""
    return _throughput_groups(_inputs(verdicts))


def _throughput_groups(inputs: Mapping[str, FleetInputs]) -> dict[Key, dict[tuple[str, str], float]]:
    groups: dict[Key, dict[tuple[str, str], float]] = {}
    for node, got in inputs.items():
        for key, subject, value in got.throughput:
            groups.setdefault(key, {})[(node, subject)] = value
    return groups


def performance_outliers(verdicts: Mapping[str, Mapping[str, Any]], **thresholds: Any) -> dict[str, Any]:
    """Throughput outliers across nodes: {"thresholds", "metrics": [...], "by_node": {node: [finding]}}."""
    return performance_of(_inputs(verdicts), **thresholds)


def performance_of(inputs: Mapping[str, FleetInputs], *, mad_z: float = DEFAULTS["mad_z"],
                   rel_floor: float = DEFAULTS["rel_floor"],
                   min_nodes: int = DEFAULTS["min_nodes"]) -> dict[str, Any]:
    """performance_outliers over the nodes' FleetInputs."""
    metrics = []
    by_node: dict[str, list[str]] = {}
    for (check, metric, unit, model), values in sorted(_throughput_groups(inputs).items()):
        nodes = sorted({n for n, _ in values})
        entry: dict[str, Any] = {"check": check, "metric": metric, "unit": unit, "model": model,
                                 "nodes": len(nodes), "values": len(values)}
        if len(nodes) < min_nodes:
            entry["compared"] = False
            entry["why"] = f"measured on {len(nodes)} node(s), need {min_nodes}"
            metrics.append(entry)
            continue
        res = low_outliers({f"{n}\t{s}": v for (n, s), v in values.items()}, mad_z=mad_z, rel_floor=rel_floor)
        entry.update(compared=True, median=round(res["median"], 4), mad=round(res["mad"], 4),
                     limit=round(res["limit"], 4), outliers=[])
        for label, z in sorted(res["outliers"].items()):
            node, subject = label.split("\t", 1)
            value = values[(node, subject)]
            rel = (value - res["median"]) / res["median"] if res["median"] else None
            entry["outliers"].append({"node": node, "subject": subject, "value": value, "z": z,
                                      "rel": None if rel is None else round(rel, 4)})
            where = f" {subject}" if subject != "node" else ""
            pct = f"{rel * 100:+.0f}%" if rel is not None else "low"
            by_node.setdefault(node, []).append(
                f"slow {check}.{metric}{where}: {value:g} {unit} < {res['limit']:.4g} "
                f"(fleet median {res['median']:.4g}, {pct})")
        metrics.append(entry)
    return {
        "thresholds": {"mad_z": mad_z, "rel_floor": rel_floor, "min_nodes": min_nodes,
                       "rule": "value < median - max(mad_z * 1.4826 * MAD, rel_floor * median)"},
        "metrics": metrics,
        "by_node": by_node,
    }


def bitwise_comparison(verdicts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Digests compared by majority per fingerprint (gpucheck.repro.majority.fleet_outliers)."""
    return bitwise_of(_inputs(verdicts))


def bitwise_of(inputs: Mapping[str, FleetInputs]) -> dict[str, Any]:
    """bitwise_comparison over the nodes' FleetInputs."""
    try:
        from ..repro.majority import fleet_outliers
    except ImportError as e:
        return {"available": False, "compared": False, "why": f"unavailable ({e})", "by_node": {}}
    sets = {n: got.digests for n, got in inputs.items() if got.digests}
    if not sets:
        return {"available": True, "compared": False, "nodes": 0, "by_node": {},
                "why": f"no node reported digests (the {BITWISE_CHECK} check did not run)"}
    report = fleet_outliers(sets)
    by_node: dict[str, list[str]] = {}
    for key, fp in report.items():
        for node, workloads in fp["outliers"].items():
            agree = min(fp["workloads"][w]["agree"] for w in workloads)
            of = max(fp["workloads"][w]["of"] for w in workloads)
            by_node.setdefault(node, []).append(
                f"bitwise: digests differ from the fleet majority ({agree} of {of} nodes, fingerprint "
                f"{key[:12]}) in {', '.join(workloads)}")
    return {"available": True, "compared": True, "nodes": len(sets), "fingerprints": report, "by_node": by_node}


def compare_fleet(verdicts: Mapping[str, Mapping[str, Any]], **thresholds: Any) -> dict[str, Any]:
    """The whole fleet comparison of a sweep's verdicts: performance outliers and bitwise majority."""
    return compare_inputs(_inputs(verdicts), **thresholds)


def compare_inputs(inputs: Mapping[str, FleetInputs], **thresholds: Any) -> dict[str, Any]:
    """compare_fleet over the nodes' FleetInputs (what a sweep keeps of each verdict)."""
    return {
        "nodes_compared": len(inputs),
        "performance": performance_of(inputs, **thresholds),
        "bitwise": bitwise_of(inputs),
    }


def findings_by_node(comparison: Mapping[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in ("bitwise", "performance"):
        for node, items in (comparison.get(part, {}).get("by_node") or {}).items():
            out.setdefault(node, []).extend(items)
    return out
