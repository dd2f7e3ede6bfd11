"""Is a node's answer a verdict the fleet commands can trust? (no jsonschema at run time)

`verdict_problem(doc)` checks a parsed document against the parts of the verdict schema
(gpucheck/core/verdict.py SCHEMA, any 1.x) that the sweep, the fleet comparison and bisect read,
and that the verdict is consistent with itself; it returns one line naming the first problem,
or None. A verdict of a later 1.x may carry fields this version does not know: they are allowed
(a minor schema version only adds optional fields), as are the values nothing here reads.

Checked: every field SCHEMA requires is present; `host` is a string; `status`, `action` and
`exit_code` are from their vocabularies (`exit_code` an integer, not a boolean); `partial` is a
boolean and `interrupted` a string or null; `gpus`, `checks` and `results` are lists and
`software` and `counts` objects; each GPU has an integer `index` >= 0 and a string or null
`name`; each result has a non-empty string `check`, a string `subject` and `summary`, an integer
or null `gpu`, `status` and `action` from their vocabularies and `metrics` an object of
`{"value", "unit": string}` objects. Consistency: a verdict with a `fail` result has status
`fail` and exit code 1; exit code 0 needs no `fail` or `error` result, no unexamined skip and
a run not cut short.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..core.verdict import SCHEMA

STATUSES = ("pass", "warn", "fail", "skip", "error")
ACTIONS = tuple(SCHEMA["properties"]["action"]["enum"])
EXIT_CODES = (0, 1, 3)
REQUIRED = tuple(SCHEMA["required"])
_TYPES = {"string": str, "list": list, "object": dict, "boolean": bool}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(doc: Mapping[str, Any], key: str, kind: str, *, null: bool = False) -> str | None:
    v = doc.get(key)
    if v is None and null:
        return None
    if not isinstance(v, _TYPES[kind]):
        return f"{key} is {_kind(v)}, not {'a ' if kind != 'object' else 'an '}{kind}" + (" or null" if null else "")
    return None


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _top_problem(doc: Mapping[str, Any]) -> str | None:
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
    if not _is_int(doc["exit_code"]) or doc["exit_code"] not in EXIT_CODES:
        return f"exit_code {_short(doc['exit_code'])} is not 0, 1 or 3"
    return None


def _gpu_problem(i: int, g: Any) -> str | None:
    if not isinstance(g, dict):
        return f"gpus[{i}] is {_kind(g)}, not an object"
    if not _is_int(g.get("index")) or g["index"] < 0:
        return f"gpus[{i}].index is {_short(g.get('index'))}, not an integer >= 0"
    if g.get("name") is not None and not isinstance(g["name"], str):
        return f"gpus[{i}].name is {_kind(g['name'])}, not a string or null"
    return None


def _result_problem(i: int, r: Any) -> str | None:
    where = f"results[{i}]"
    if not isinstance(r, dict):
        return f"{where} is {_kind(r)}, not an object"
    if not isinstance(r.get("check"), str) or not r["check"]:
        return f"{where}.check is {_short(r.get('check'))}, not a check id"
    for key in ("subject", "summary"):
        if not isinstance(r.get(key), str):
            return f"{where}.{key} is {_kind(r.get(key))}, not a string"
    if r.get("gpu") is not None and (not _is_int(r["gpu"]) or r["gpu"] < 0):
        return f"{where}.gpu is {_short(r['gpu'])}, not an integer >= 0 or null"
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


def _consistency_problem(doc: Mapping[str, Any]) -> str | None:
    statuses = {r["status"] for r in doc["results"]}
    unexamined = any(r.get("unexamined") is True for r in doc["results"])
    if "fail" in statuses and (doc["status"] != "fail" or doc["exit_code"] != 1):
        return f"a result fails but the verdict says {doc['status']} (exit code {doc['exit_code']})"
    if doc["exit_code"] == 0 and ("error" in statuses or unexamined or doc["partial"]):
        why = "an error result" if "error" in statuses else "an unexamined skip" if unexamined else "a partial run"
        return f"exit code 0 with {why}"
    return None


def verdict_problem(doc: Any) -> str | None:
    """One line naming why `doc` is not a verdict the sweep can read, or None when it is."""
    if not isinstance(doc, dict):
        return f"the document is {_kind(doc)}, not an object"
    why = _top_problem(doc)
    if why:
        return why
    for i, g in enumerate(doc["gpus"]):
        why = _gpu_problem(i, g)
        if why:
            return why
    for i, r in enumerate(doc["results"]):
        why = _result_problem(i, r)
        if why:
            return why
    return _consistency_problem(doc)


def _short(v: Any, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."
