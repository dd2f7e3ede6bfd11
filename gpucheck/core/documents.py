"""What the fleet commands and the report read from a node's verdict document, as plain data:
the throughput values the fleet comparison compares across nodes and the bitwise digest sets
(gpucheck.fleet.compare compares them; gpucheck.report draws them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _gpu_models(verdict: Mapping[str, Any]) -> dict[int, str]:
    return {g["index"]: str(g.get("name") or "unknown") for g in verdict.get("gpus", [])
            if isinstance(g, dict) and isinstance(g.get("index"), int)}


Key = tuple[str, str, str, str]  # (check, metric, unit, GPU model)


@dataclass(frozen=True)
class FleetInputs:
    """What the fleet comparison reads from one node's verdict."""

    throughput: tuple[tuple[Key, str, float], ...] = ()  # (key, subject, value) per "/s" metric
    digests: dict[str, dict[str, str]] | None = None  # digest_sets(verdict)


def fleet_inputs(verdict: Mapping[str, Any]) -> FleetInputs:
    """The throughput values (every "/s" metric of a result that ran) and the digest sets."""
    models = _gpu_models(verdict)
    values: list[tuple[Key, str, float]] = []
    for r in verdict.get("results", []):
        if not isinstance(r, dict) or r.get("status") in ("skip", "error"):
            continue
        for name, m in (r.get("metrics") or {}).items():
            unit = m.get("unit") if isinstance(m, dict) else None
            if not isinstance(unit, str) or not unit.endswith("/s"):
                continue
            value = _number(m.get("value"))
            if value is None:
                continue
            model = models.get(r.get("gpu"), "node") if r.get("gpu") is not None else "node"
            values.append(((str(r.get("check")), str(name), unit, model), str(r.get("subject") or "node"), value))
    return FleetInputs(tuple(values), digest_sets(verdict))


BITWISE_CHECK = "repro.bitwise"  # its node result carries the node's digest sets


def digest_sets(verdict: Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
    """{fingerprint key: {workload: digest}} from a verdict's repro.bitwise node result."""
    for r in verdict.get("results", []):
        if isinstance(r, dict) and r.get("check") == BITWISE_CHECK and r.get("subject") == "node":
            value = ((r.get("metrics") or {}).get("digest_sets") or {}).get("value")
            if isinstance(value, dict) and value:
                return {str(k): {str(w): str(d) for w, d in v.items()} for k, v in value.items() if isinstance(v, dict)}
    return None
