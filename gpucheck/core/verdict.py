"""The verdict: the node-level document every consumer reads (prolog, sweep, bisect, people).

A Verdict is a frozen, typed object: its results (core.result.ResultEntry, with their metrics and
thresholds), its parts (the software fingerprint, the GPU inventory, the telemetry source, one
CheckEntry per check) and what they fold into (status, action, exit code, counts). Frozen
dataclasses: a verdict is built once, when the run ends, and never changed; every output (the
JSON, the table, Prometheus, the history) is written from the same object. The software
fingerprint alone is a mapping: the schema leaves it open (a name -> a version, or null).

- `build_verdict(results, RunFacts)` is the one builder: `gpucheck run` and the per-check
  commands (gpucheck.app), and the Slurm hooks' could-not-judge verdict (`unjudged_verdict`).
- `Verdict.to_json()` is its JSON document; its JSON Schema is `SCHEMA` below (printed by
  `gpucheck schema`, documented in docs/verdict.md).
- `Verdict.from_json(doc)` reads one back (a node's answer to a sweep, a file or a history given
  to `gpucheck report`) and trusts nothing of its shape: VerdictError names the first problem.

SCHEMA_VERSION follows semver: a minor bump adds optional fields, a major bump changes or removes
one. Consumers should accept any 1.x document.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, cast

from .. import __version__
from .jsonvalue import JsonValue
from .levels import Level
from .result import (ACTION_ORDER, Action, MetricEntry, Result, ResultEntry, Status, ThresholdEntry, strongest_action,
                     worst_status)

if TYPE_CHECKING:  # pragma: no cover
    from ..platform.telemetry.model import Snapshot

SCHEMA_ID = "gpucheck.verdict"
SCHEMA_VERSION = "1.1"

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2
EXIT_NO_JUDGEMENT = 3

STATUSES = tuple(s.value for s in Status)  # pass, warn, fail, skip, error
ACTIONS = tuple(a.value for a in ACTION_ORDER)  # none, investigate, ... rma (weakest first)
EXIT_CODES = (EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_NO_JUDGEMENT)  # what a verdict's exit_code can be
REQUIRED = ("schema", "schema_version", "host", "time", "duration_s", "level", "level_name", "gpucheck_version",
            "software", "gpus", "source", "checks", "results", "status", "action", "exit_code", "counts", "partial",
            "interrupted", "injected")
_STATUSES: list[JsonValue] = list(STATUSES)
_ACTIONS: list[JsonValue] = list(ACTIONS)

_METRIC: dict[str, JsonValue] = {
    "type": "object",
    "required": ["value", "unit"],
    "additionalProperties": False,
    "properties": {
        "value": {"type": ["number", "string", "boolean", "null", "array", "object"]},
        "unit": {"type": "string"},
    },
}

_THRESHOLD: dict[str, JsonValue] = {
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

_RESULT: dict[str, JsonValue] = {
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

SCHEMA: dict[str, JsonValue] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://gpucheck.dev/schema/verdict-{SCHEMA_VERSION}.json",
    "title": "gpucheck verdict",
    "description": "One node's health verdict produced by `gpucheck run`.",
    "type": "object",
    "required": list(REQUIRED),
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
        "exit_code": {"enum": list(EXIT_CODES)},
        "counts": {
            "type": "object",
            "required": _STATUSES,
            "additionalProperties": False,
            "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
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


class Judged(Protocol):
    """What the verdict's status and exit code read of a result: a check's Result or a ResultEntry."""

    @property
    def status(self) -> Status: ...

    @property
    def unexamined(self) -> bool: ...


def could_not_judge(results: Sequence[Judged], *, partial: bool = False) -> bool:
    """Whether the run left something unjudged: an error result, a skip of something the run was
    asked to examine (`unexamined`), or a run cut short."""
    return partial or any(r.status is Status.ERROR or r.unexamined for r in results)


def overall_status(results: Sequence[Judged], *, partial: bool = False) -> Status:
    """The worst result status; `error` when nothing failed but the run could not judge
    everything, so that no consumer reads `pass` or `skip` for a run that exits 3."""
    worst = worst_status(r.status for r in results)
    if worst is not Status.FAIL and could_not_judge(results, partial=partial):
        return Status.ERROR
    return worst


def exit_code_for(results: Sequence[Judged], *, strict: bool = False, on_error: str = "pass",
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


# -- the verdict and its parts --------------------------------------------------------------------


@dataclass(frozen=True)
class InventoryEntry:
    """One GPU of the node's inventory."""

    index: int
    uuid: str | None
    serial: str | None
    pci_bus_id: str | None  # 0000:18:00.0
    name: str | None
    state: str  # ok, lost, reset_required, error

    def to_json(self) -> dict[str, JsonValue]:
        return {"index": self.index, "uuid": self.uuid, "serial": self.serial, "pci_bus_id": self.pci_bus_id,
                "name": self.name, "state": self.state}


@dataclass(frozen=True)
class VerdictSource:
    """Where the telemetry came from: `live` (NVML read now), `snapshot` (a recorded file at
    `path`), `none` (no check needed it); `synthetic`: a hand-made test snapshot."""

    kind: str
    path: str | None = None
    synthetic: bool = False

    @classmethod
    def of(cls, kind: str, path: str | None, snapshot: "Snapshot | None") -> "VerdictSource":
        return cls(kind, path, bool(snapshot.get("synthetic", False)) if snapshot else False)

    def to_json(self) -> dict[str, JsonValue]:
        return {"kind": self.kind, "path": self.path, "synthetic": self.synthetic}


@dataclass(frozen=True)
class CheckEntry:
    """One selected check: its own level, its status (the worst of its results), its time."""

    id: str
    level: int
    status: Status
    duration_s: float

    @classmethod
    def of(cls, check_id: str, level: int, status: Status, duration_s: float) -> "CheckEntry":
        return cls(check_id, int(level), status, round(duration_s, 3))

    def to_json(self) -> dict[str, JsonValue]:
        return {"id": self.id, "level": self.level, "status": self.status.value, "duration_s": self.duration_s}


@dataclass(frozen=True)
class Verdict:
    host: str  # for a replayed snapshot: the host it was captured on
    time: str  # run start, ISO-8601 UTC
    duration_s: float
    level: Level  # the highest level a check of the run ran at (verdict_level)
    software: Mapping[str, str | None]  # the software fingerprint: name -> version, None where unknown
    gpus: tuple[InventoryEntry, ...]
    source: VerdictSource
    checks: tuple[CheckEntry, ...]
    results: tuple[ResultEntry, ...]
    status: Status  # overall_status
    action: Action  # the strongest among the fail, warn and error results
    exit_code: int  # 0, 1 or 3 (exit_code_for)
    partial: bool  # the run was cut short (`interrupted` names why)
    interrupted: str | None  # SIGTERM, SIGINT, timeout
    injected: tuple[str, ...] = ()  # the fault injections asked for (a test or a demo)
    schema_version: str = SCHEMA_VERSION
    gpucheck_version: str = __version__
    # A verdict read back (from_json): the document as it was received, which to_json passes on
    # unchanged (a later 1.x may carry fields this version does not know). Never change it.
    as_received: dict[str, JsonValue] | None = field(default=None, compare=False, repr=False)

    @property
    def level_name(self) -> str:
        return self.level.label

    @property
    def counts(self) -> dict[Status, int]:
        """The number of results of each status (every status, in the schema's order)."""
        counts = {s: 0 for s in Status}
        for r in self.results:
            counts[r.status] += 1
        return counts

    def to_json(self) -> dict[str, JsonValue]:
        """The verdict document (SCHEMA); a verdict read back: the document as received."""
        if self.as_received is not None:
            return self.as_received
        return {
            "schema": SCHEMA_ID,
            "schema_version": self.schema_version,
            "host": self.host,
            "time": self.time,
            "duration_s": self.duration_s,
            "level": int(self.level),
            "level_name": self.level_name,
            "gpucheck_version": self.gpucheck_version,
            "software": {name: version for name, version in self.software.items()},
            "gpus": [g.to_json() for g in self.gpus],
            "source": self.source.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "results": [r.to_json() for r in self.results],
            "status": self.status.value,
            "action": self.action.value,
            "exit_code": self.exit_code,
            "counts": {s.value: n for s, n in self.counts.items()},
            "partial": self.partial,
            "interrupted": self.interrupted,
            "injected": list(self.injected),
        }

    @classmethod
    def from_json(cls, doc: JsonValue) -> "Verdict":
        """The verdict `doc` (a parsed JSON document) is, or VerdictError naming its first problem:
        verdict_problem's checks (what the fleet commands read, and a verdict that contradicts
        itself), then every other field this type holds against the schema."""
        if not isinstance(doc, dict):
            raise VerdictError(f"the document is {_kind(doc)}, not an object")
        if doc.get("schema") != SCHEMA_ID:
            raise VerdictError(f"schema {_short(doc.get('schema'))} is not {SCHEMA_ID}")
        if not supported_version(doc.get("schema_version")):
            raise VerdictError(f"schema_version {_short(doc.get('schema_version'))} is not supported (want 1.x)")
        why = verdict_problem(doc)
        if why:
            raise VerdictError(why)
        return _verdict_of(doc)


# -- the one builder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFacts:
    """What a verdict says of its run besides the results."""

    level: Level
    started_at: float  # time.time() when the run began
    duration_s: float
    checks: tuple[CheckEntry, ...]
    software: Mapping[str, str | None]
    host: str
    gpus: tuple[InventoryEntry, ...] = ()
    source: VerdictSource = VerdictSource("none")
    interrupted: str | None = None  # SIGTERM, SIGINT, timeout: the run was cut short
    injected: tuple[str, ...] = ()
    strict: bool = False  # a warn is unhealthy (exit 1)
    on_error: str = "pass"  # fail: could not judge is unhealthy (exit 1)


def build_verdict(results: Sequence[Result | ResultEntry], run: RunFacts) -> Verdict:
    """The verdict of a run's results (a check's Result is listed as its ResultEntry)."""
    entries = tuple(r if isinstance(r, ResultEntry) else ResultEntry.of(r) for r in results)
    partial = run.interrupted is not None
    return Verdict(
        host=run.host,
        time=iso_utc(run.started_at),
        duration_s=round(run.duration_s, 3),
        level=run.level,
        software=dict(run.software),
        gpus=run.gpus,
        source=run.source,
        checks=run.checks,
        results=entries,
        status=overall_status(entries, partial=partial),
        action=strongest_action(r.action for r in entries if r.status in (Status.FAIL, Status.WARN, Status.ERROR)),
        exit_code=exit_code_for(entries, strict=run.strict, on_error=run.on_error, partial=partial),
        partial=partial,
        interrupted=run.interrupted,
        injected=tuple(run.injected),
    )


def unjudged_verdict(check_id: str, cause: str, *, level: Level, started_at: float, duration_s: float,
                     host: str, software: Mapping[str, str | None]) -> Verdict:
    """The verdict of a run that produced none (a Slurm hook whose pipeline could not run): one
    `error` result of `check_id` naming the cause, no telemetry, exit 3."""
    result = Result(check_id, Status.ERROR, cause, action=Action.INVESTIGATE)
    return build_verdict([result], RunFacts(level=level, started_at=started_at, duration_s=duration_s,
                                            checks=(CheckEntry.of(check_id, level, Status.ERROR, duration_s),),
                                            software=software, host=host))


def node_host(snapshot: "Snapshot | None", source_kind: str) -> str:
    """The verdict's host: the host a replayed snapshot was captured on, else this machine's name."""
    host = snapshot.get("host") if snapshot and source_kind == "snapshot" else None
    return host or socket.gethostname()


def gpu_inventory(snapshot: "Snapshot | None") -> tuple[InventoryEntry, ...]:
    if not snapshot:
        return ()
    return tuple(InventoryEntry(index=int(g["index"]), uuid=g.get("uuid"), serial=g.get("serial"),
                                pci_bus_id=g.get("pci_bus_id"), name=g.get("name"), state=g.get("state", "ok"))
                 for g in snapshot.get("gpus", []))


# -- reading a verdict back -----------------------------------------------------------------------
#
# Two passes over a parsed document. verdict_problem: what the sweep, the fleet comparison and
# bisect read (every field the schema requires is present; host, partial, interrupted, the lists
# and objects of their types; status, action, exit_code from their vocabularies; each GPU's index
# and name; each result's check, subject, summary, gpu, status, action, metrics) and a verdict
# that contradicts itself (a fail result under a status other than fail or an exit code other
# than 1; exit code 0 with an error result, an unexamined skip or a partial run). Then
# _verdict_of: every other field the Verdict holds, against the schema (time, duration_s, level,
# the versions, the software fingerprint, source, the checks, the injections, each GPU's other
# fields, each result's thresholds, evidence, injections and duration). A field a later 1.x adds
# is allowed and kept (Verdict.as_received); the software fingerprint may lack a name (unknown).

_VERSION_RE = re.compile(r"^1\.\d+$")
OPERATORS = (">", ">=", "<", "<=", "==", "!=")


class VerdictError(ValueError):
    """A document that is not a verdict the fleet commands can trust: the first problem, one line."""


def supported_version(version: JsonValue) -> bool:
    """Whether `version` is a schema_version this gpucheck reads (any 1.x)."""
    return isinstance(version, str) and _VERSION_RE.fullmatch(version) is not None


def _kind(v: object) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _short(v: object, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TYPES: dict[str, type] = {"string": str, "list": list, "object": dict, "boolean": bool}


def _typed(doc: Mapping[str, JsonValue], key: str, kind: str, *, null: bool = False) -> str | None:
    v = doc.get(key)
    if v is None and null:
        return None
    if not isinstance(v, _TYPES[kind]):
        return f"{key} is {_kind(v)}, not {'a ' if kind != 'object' else 'an '}{kind}" + (" or null" if null else "")
    return None


def _top_problem(doc: dict[str, JsonValue]) -> str | None:
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        return f"missing {', '.join(missing)}"
    for key, kind, null in (("host", "string", False), ("partial", "boolean", False),
                            ("interrupted", "string", True), ("gpus", "list", False),
                            ("checks", "list", False), ("results", "list", False),
                            ("software", "object", False), ("counts", "object", False)):
        why = _typed(doc, key, kind, null=null)
        if why:
            return why
    if doc["status"] not in STATUSES:
        return f"status {_short(doc['status'])} is not one of {', '.join(STATUSES)}"
    if doc["action"] not in ACTIONS:
        return f"action {_short(doc['action'])} is not one of the actions"
    code = doc["exit_code"]
    if not _is_int(code) or code not in EXIT_CODES:
        return f"exit_code {_short(code)} is not 0, 1 or 3"
    return None


def _gpu_problem(i: int, g: JsonValue) -> str | None:
    if not isinstance(g, dict):
        return f"gpus[{i}] is {_kind(g)}, not an object"
    index = g.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return f"gpus[{i}].index is {_short(index)}, not an integer >= 0"
    if g.get("name") is not None and not isinstance(g["name"], str):
        return f"gpus[{i}].name is {_kind(g['name'])}, not a string or null"
    return None


def _result_problem(i: int, r: JsonValue) -> str | None:
    where = f"results[{i}]"
    if not isinstance(r, dict):
        return f"{where} is {_kind(r)}, not an object"
    check = r.get("check")
    if not isinstance(check, str) or not check:
        return f"{where}.check is {_short(check)}, not a check id"
    for key in ("subject", "summary"):
        if not isinstance(r.get(key), str):
            return f"{where}.{key} is {_kind(r.get(key))}, not a string"
    gpu = r.get("gpu")
    if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0):
        return f"{where}.gpu is {_short(gpu)}, not an integer >= 0 or null"
    if r.get("status") not in STATUSES:
        return f"{where}.status is {_short(r.get('status'))}, not one of {', '.join(STATUSES)}"
    if r.get("action") not in ACTIONS:
        return f"{where}.action is {_short(r.get('action'))}, not one of the actions"
    metrics = r.get("metrics")
    if not isinstance(metrics, dict):
        return f"{where}.metrics is {_kind(metrics)}, not an object"
    for name, m in metrics.items():
        if not isinstance(m, dict) or "value" not in m or not isinstance(m.get("unit"), str):
            return f"{where}.metrics.{_short(name, 40)} is not a {{value, unit}} object"
    return None


def _consistency_problem(doc: dict[str, JsonValue], results: list[dict[str, JsonValue]]) -> str | None:
    statuses = {r["status"] for r in results}
    unexamined = any(r.get("unexamined") is True for r in results)
    if "fail" in statuses and (doc["status"] != "fail" or doc["exit_code"] != 1):
        return f"a result fails but the verdict says {doc['status']} (exit code {doc['exit_code']})"
    if doc["exit_code"] == 0 and ("error" in statuses or unexamined or doc["partial"]):
        why = "an error result" if "error" in statuses else "an unexamined skip" if unexamined else "a partial run"
        return f"exit code 0 with {why}"
    return None


def verdict_problem(doc: JsonValue) -> str | None:
    """One line naming why `doc` is not a verdict the fleet commands can read (the first pass of
    Verdict.from_json), or None when it is."""
    if not isinstance(doc, dict):
        return f"the document is {_kind(doc)}, not an object"
    why = _top_problem(doc)
    if why:
        return why
    gpus, results = doc["gpus"], doc["results"]
    assert isinstance(gpus, list) and isinstance(results, list)  # _top_problem
    for i, g in enumerate(gpus):
        why = _gpu_problem(i, g)
        if why:
            return why
    for i, r in enumerate(results):
        why = _result_problem(i, r)
        if why:
            return why
    return _consistency_problem(doc, [r for r in results if isinstance(r, dict)])


# The second pass: each field taken with its type, VerdictError naming the first that breaks it.

def _problem(where: str, v: JsonValue, wanted: str) -> VerdictError:
    return VerdictError(f"{where} is {_short(v) if isinstance(v, (int, float, str)) else _kind(v)}, not {wanted}")


def _string(doc: Mapping[str, JsonValue], key: str, where: str = "") -> str:
    v = doc.get(key)
    if not isinstance(v, str):
        raise _problem(where + key, v, "a string")
    return v


def _string_or_null(doc: Mapping[str, JsonValue], key: str, where: str = "") -> str | None:
    v = doc.get(key)
    if v is not None and not isinstance(v, str):
        raise _problem(where + key, v, "a string or null")
    return v


def _number(doc: Mapping[str, JsonValue], key: str, where: str = "", *, minimum: float | None = None) -> float:
    v = doc.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or (minimum is not None and v < minimum):
        raise _problem(where + key, v, "a number" + (f" >= {minimum:g}" if minimum is not None else ""))
    return v


def _integer(doc: Mapping[str, JsonValue], key: str, where: str = "", *, low: int, high: int) -> int:
    v = doc.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise _problem(where + key, v, f"an integer {low}-{high}")
    return v


def _strings(doc: Mapping[str, JsonValue], key: str, where: str = "") -> tuple[str, ...]:
    v = doc.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _problem(where + key, v, "a list of strings")
    return tuple(x for x in v if isinstance(x, str))


def _object(v: JsonValue, where: str) -> dict[str, JsonValue]:
    if not isinstance(v, dict):
        raise _problem(where, v, "an object")
    return v


def _list(v: JsonValue, where: str) -> list[JsonValue]:
    if not isinstance(v, list):
        raise _problem(where, v, "a list")
    return v


def _software(v: JsonValue) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, version in _object(v, "software").items():
        if version is not None and not isinstance(version, str):
            raise _problem(f"software.{name}", version, "a string or null")
        out[name] = version
    return out


def _inventory_entry(i: int, v: JsonValue) -> InventoryEntry:
    g, where = _object(v, f"gpus[{i}]"), f"gpus[{i}]."
    index = g.get("index")
    assert isinstance(index, int)  # verdict_problem
    return InventoryEntry(index=index, uuid=_string_or_null(g, "uuid", where), serial=_string_or_null(g, "serial", where),
                          pci_bus_id=_string_or_null(g, "pci_bus_id", where), name=_string_or_null(g, "name", where),
                          state=_string(g, "state", where))


def _source(v: JsonValue) -> VerdictSource:
    s = _object(v, "source")
    synthetic = s.get("synthetic")
    if not isinstance(synthetic, bool):
        raise _problem("source.synthetic", synthetic, "a boolean")
    return VerdictSource(_string(s, "kind", "source."), _string_or_null(s, "path", "source."), synthetic)


def _check_entry(i: int, v: JsonValue) -> CheckEntry:
    c, where = _object(v, f"checks[{i}]"), f"checks[{i}]."
    status = c.get("status")
    if status not in STATUSES:
        raise _problem(where + "status", status, f"one of {', '.join(STATUSES)}")
    return CheckEntry(_string(c, "id", where), _integer(c, "level", where, low=1, high=4), Status(status),
                      _number(c, "duration_s", where, minimum=0))


# A verdict holds hundreds of thresholds and metrics, and a sweep reads one verdict per node: the
# entries are built on a fast path (one test of every field at once) and a problem is named on a
# slow one, which checks the fields one by one, in order.
_STATUS_OF = {s.value: s for s in Status}
_ACTION_OF = {a.value: a for a in Action}


def _threshold_problem(where: str, v: JsonValue) -> VerdictError:
    t = _object(v, where)
    where += "."
    op, limit, status = t.get("op"), t.get("limit"), t.get("status")
    if op not in OPERATORS:
        return _problem(where + "op", op, f"one of {' '.join(OPERATORS)}")
    if isinstance(limit, (list, dict)):
        return _problem(where + "limit", limit, "a number, a string, a boolean or null")
    if status not in STATUSES:
        return _problem(where + "status", status, f"one of {', '.join(STATUSES)}")
    _string(t, "metric", where)
    _string(t, "unit", where)
    return VerdictError(f"{where[:-1]} is not a threshold")  # pragma: no cover - one of the above holds


def _threshold_entries(i: int, thresholds: list[JsonValue]) -> tuple[ThresholdEntry, ...]:
    out = []
    for k, t in enumerate(thresholds):
        if isinstance(t, dict):
            metric, op, limit, unit, status = t.get("metric"), t.get("op"), t.get("limit"), t.get("unit"), t.get("status")
            if (isinstance(metric, str) and isinstance(op, str) and op in OPERATORS
                    and not isinstance(limit, (list, dict)) and isinstance(unit, str) and isinstance(status, str)
                    and status in _STATUS_OF):
                out.append(ThresholdEntry(metric, op, limit, unit, _STATUS_OF[status]))
                continue
        raise _threshold_problem(f"results[{i}].thresholds[{k}]", t)
    return tuple(out)


def _result_entry(i: int, v: JsonValue) -> ResultEntry:
    r, where = _object(v, f"results[{i}]"), f"results[{i}]."
    check, subject, summary = r.get("check"), r.get("subject"), r.get("summary")
    gpu, status, action, metrics = r.get("gpu"), r.get("status"), r.get("action"), r.get("metrics")
    assert isinstance(check, str) and isinstance(subject, str) and isinstance(summary, str)  # verdict_problem
    assert (gpu is None or isinstance(gpu, int)) and isinstance(metrics, dict)  # verdict_problem
    assert isinstance(status, str) and isinstance(action, str)  # verdict_problem: from their vocabularies
    duration = r.get("duration_s")
    if duration is not None and (not isinstance(duration, (int, float)) or isinstance(duration, bool)):
        raise _problem(where + "duration_s", duration, "a number or null")
    thresholds = _threshold_entries(i, _list(r.get("thresholds"), where + "thresholds"))
    return ResultEntry(check, subject, gpu, _STATUS_OF[status], summary, _ACTION_OF[action],
                       {name: MetricEntry(m["value"], cast(str, m["unit"])) for name, m in metrics.items()
                        if isinstance(m, dict)},
                       thresholds, _strings(r, "evidence", where), _strings(r, "injected", where), duration,
                       r.get("unexamined") is True)


def _verdict_of(doc: dict[str, JsonValue]) -> Verdict:
    """The Verdict of a document verdict_problem passed (its vocabularies and types hold)."""
    status, action, code, partial = doc["status"], doc["action"], doc["exit_code"], doc["partial"]
    assert isinstance(status, str) and isinstance(action, str) and isinstance(code, int) and isinstance(partial, bool)
    return Verdict(
        host=_string(doc, "host"),
        time=_string(doc, "time"),
        duration_s=_number(doc, "duration_s", minimum=0),
        level=Level(_integer(doc, "level", low=1, high=4)),
        software=_software(doc["software"]),
        gpus=tuple(_inventory_entry(i, g) for i, g in enumerate(_list(doc["gpus"], "gpus"))),
        source=_source(doc["source"]),
        checks=tuple(_check_entry(i, c) for i, c in enumerate(_list(doc["checks"], "checks"))),
        results=tuple(_result_entry(i, r) for i, r in enumerate(_list(doc["results"], "results"))),
        status=Status(status),
        action=Action(action),
        exit_code=code,
        partial=partial,
        interrupted=_string_or_null(doc, "interrupted"),
        injected=_strings(doc, "injected"),
        schema_version=_string(doc, "schema_version"),
        gpucheck_version=_string(doc, "gpucheck_version"),
        as_received=doc,
    )
