"""The verdict: the node-level JSON document every consumer reads (prolog, sweep, bisect, people).

Its JSON Schema is `SCHEMA` below (printed by `gpucheck schema`, documented in docs/verdict.md).
SCHEMA_VERSION follows semver: a minor bump adds optional fields, a major bump changes or removes
one. Consumers should accept any 1.x document.
"""

from __future__ import annotations

import datetime as _dt
import socket
from typing import Any

from .. import __version__
from .levels import Level
from .result import Result, Status, strongest_action, worst_status

SCHEMA_ID = "gpucheck.verdict"
SCHEMA_VERSION = "1.1"

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2
EXIT_NO_JUDGEMENT = 3

_STATUSES = [s.value for s in Status]
_ACTIONS = ["none", "investigate", "restart-app", "reset-gpu", "reboot", "drain", "rma"]

_METRIC = {
    "type": "object",
    "required": ["value", "unit"],
    "additionalProperties": False,
    "properties": {
        "value": {"type": ["number", "string", "boolean", "null", "array", "object"]},
        "unit": {"type": "string"},
    },
}

_THRESHOLD = {
    "type": "object",
    "required": ["metric", "op", "limit", "unit", "status"],
    "additionalProperties": False,
    "properties": {
        "metric": {"type": "string"},
        "op": {"enum": [">", ">=", "<", "<=", "==", "!="]},
        "limit": {"type": ["number", "string", "boolean", "null"]},
        "unit": {"type": "string"},
        "status": {"enum": _STATUSES},
    },
}

_RESULT = {
    "type": "object",
    "required": ["check", "subject", "gpu", "status", "summary", "action", "metrics",
                 "thresholds", "evidence", "injected", "duration_s"],
    "additionalProperties": False,
    "properties": {
        "check": {"type": "string", "minLength": 1},
        "subject": {"type": "string", "description": "gpu<N>, node, or a link/pair name"},
        "gpu": {"type": ["integer", "null"], "minimum": 0},
        "status": {"enum": _STATUSES},
        "summary": {"type": "string"},
        "action": {"enum": _ACTIONS},
        "metrics": {"type": "object", "additionalProperties": _METRIC},
        "thresholds": {"type": "array", "items": _THRESHOLD},
        "evidence": {"type": "array", "items": {"type": "string"}},
        "injected": {"type": "array", "items": {"type": "string"}},
        "duration_s": {"type": ["number", "null"]},
        "unexamined": {"const": True, "description": "(1.1) this skip left unexamined something the "
                       "run was asked to examine: the run exits 3"},
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://gpucheck.dev/schema/verdict-{SCHEMA_VERSION}.json",
    "title": "gpucheck verdict",
    "description": "One node's health verdict produced by `gpucheck run`.",
    "type": "object",
    "required": ["schema", "schema_version", "host", "time", "duration_s", "level", "level_name",
                 "gpucheck_version", "software", "gpus", "source", "checks", "results", "status",
                 "action", "exit_code", "counts", "partial", "interrupted", "injected"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "schema_version": {"type": "string", "pattern": r"^1\.\d+$"},
        "host": {"type": "string"},
        "time": {"type": "string", "description": "run start, ISO-8601 UTC"},
        "duration_s": {"type": "number", "minimum": 0},
        "level": {"type": "integer", "minimum": 1, "maximum": 4,
                  "description": "the highest level a check of this run ran at"},
        "level_name": {"enum": [lv.label for lv in Level]},
        "gpucheck_version": {"type": "string"},
        "software": {
            "type": "object",
            "description": "software fingerprint; null where unknown",
            "required": ["driver", "cuda_driver", "nvml", "torch", "cuda_runtime", "cublas",
                         "cudnn", "nccl", "cupy", "python", "kernel"],
            "additionalProperties": {"type": ["string", "null"]},
        },
        "gpus": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "uuid", "serial", "pci_bus_id", "name", "state"],
                "additionalProperties": False,
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "uuid": {"type": ["string", "null"]},
                    "serial": {"type": ["string", "null"]},
                    "pci_bus_id": {"type": ["string", "null"]},
                    "name": {"type": ["string", "null"]},
                    "state": {"enum": ["ok", "lost", "reset_required", "error"]},
                },
            },
        },
        "source": {
            "type": "object",
            "required": ["kind", "path", "synthetic"],
            "additionalProperties": False,
            "properties": {
                "kind": {"enum": ["live", "snapshot", "none"]},
                "path": {"type": ["string", "null"]},
                "synthetic": {"type": "boolean"},
            },
        },
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "level", "status", "duration_s"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string"},
                    "level": {"type": "integer", "minimum": 1, "maximum": 4,
                  "description": "the highest level a check of this run ran at"},
                    "status": {"enum": _STATUSES},
                    "duration_s": {"type": "number", "minimum": 0},
                },
            },
        },
        "results": {"type": "array", "items": _RESULT},
        "status": {"enum": _STATUSES, "description": "worst result status (fail > error > warn > pass > skip); "
                   "error also when nothing failed but the run could not judge everything (exit 3)"},
        "action": {"enum": _ACTIONS, "description": "strongest recommended action among fail/warn/error results"},
        "exit_code": {"enum": [0, 1, 3]},
        "counts": {
            "type": "object",
            "required": _STATUSES,
            "additionalProperties": False,
            "properties": {s: {"type": "integer", "minimum": 0} for s in _STATUSES},
        },
        "partial": {"type": "boolean"},
        "interrupted": {"type": ["string", "null"], "description": "SIGTERM, SIGINT, timeout"},
        "injected": {"type": "array", "items": {"type": "string"},
                     "description": "fault injections requested for this run (tests, demos)"},
    },
}


def verdict_level(ran: list[int], requested: Level | int, selected: list[int]) -> Level:
    """The verdict's level: the highest level a check ran at (`ran`: each check that examined
    something, at CheckSpec.run_level). When nothing ran, no more than the lowest of the run's
    level and the selected checks' own levels: nothing above it was examined."""
    if ran:
        return Level(max(ran))
    return Level(min([int(requested), *selected]))


def could_not_judge(results: list[Result], *, partial: bool = False) -> bool:
    """Whether the run left something unjudged: an error result, a skip of something the run was
    asked to examine (`unexamined`), or a run cut short."""
    return partial or any(r.status is Status.ERROR or r.unexamined for r in results)


def overall_status(results: list[Result], *, partial: bool = False) -> Status:
    """The worst result status; `error` when nothing failed but the run could not judge
    everything, so that no consumer reads `pass` or `skip` for a run that exits 3."""
    worst = worst_status(r.status for r in results)
    if worst is not Status.FAIL and could_not_judge(results, partial=partial):
        return Status.ERROR
    return worst


def exit_code_for(results: list[Result], *, strict: bool = False, on_error: str = "pass",
                  partial: bool = False) -> int:
    """The gate's contract (DESIGN.md): 1 if any fail; 3 if any error, unexamined skip or the
    run was cut short, unless --on-error maps it; warn is healthy unless --strict."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return EXIT_UNHEALTHY
    if could_not_judge(results, partial=partial):
        if on_error == "fail":
            return EXIT_UNHEALTHY
        return EXIT_NO_JUDGEMENT
    if strict and Status.WARN in statuses:
        return EXIT_UNHEALTHY
    return EXIT_HEALTHY


def iso_utc(epoch: float) -> str:
    return _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def gpu_inventory(snapshot: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not snapshot:
        return []
    out = []
    for g in snapshot.get("gpus", []):
        out.append({
            "index": int(g["index"]),
            "uuid": g.get("uuid"),
            "serial": g.get("serial"),
            "pci_bus_id": g.get("pci_bus_id"),
            "name": g.get("name"),
            "state": g.get("state", "ok"),
        })
    return out


def build_verdict(
    results: list[Result],
    *,
    level: Level,
    started_at: float,
    duration_s: float,
    checks: list[dict[str, Any]],
    software: dict[str, str | None],
    snapshot: dict[str, Any] | None,
    source_kind: str,
    source_path: str | None,
    interrupted: str | None,
    injected: list[str],
    strict: bool = False,
    on_error: str = "pass",
    host: str | None = None,
) -> dict[str, Any]:
    status = overall_status(results, partial=interrupted is not None)
    action = strongest_action(
        r.action for r in results if r.status in (Status.FAIL, Status.WARN, Status.ERROR)
    )
    counts = {s: 0 for s in _STATUSES}
    for r in results:
        counts[r.status.value] += 1
    if host is None:
        host = (snapshot or {}).get("host") if source_kind == "snapshot" else None
        host = host or socket.gethostname()
    return {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "host": host,
        "time": iso_utc(started_at),
        "duration_s": round(duration_s, 3),
        "level": int(level),
        "level_name": level.label,
        "gpucheck_version": __version__,
        "software": software,
        "gpus": gpu_inventory(snapshot),
        "source": {
            "kind": source_kind,
            "path": source_path,
            "synthetic": bool((snapshot or {}).get("synthetic", False)),
        },
        "checks": checks,
        "results": [r.to_dict() for r in results],
        "status": status.value,
        "action": action.value,
        "exit_code": exit_code_for(results, strict=strict, on_error=on_error, partial=interrupted is not None),
        "counts": counts,
        "partial": interrupted is not None,
        "interrupted": interrupted,
        "injected": list(injected),
    }
