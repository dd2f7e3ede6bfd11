"""Reading `gpucheck report`'s inputs: each file through gpucheck.platform.safeio (a regular file, at most
1 GiB, JSON nested at most 64 levels), classified by its content:

| kind | what identifies it |
|---|---|
| verdict | one JSON object with `schema` "gpucheck.verdict" (`gpucheck run --json`, `--output`) |
| history | JSON lines, one verdict each (the state directory's history.jsonl) |
| sweep | `schema` "gpucheck.sweep" (`gpucheck sweep --report` / `--json`) |
| pairs | `schema` "gpucheck.nccl.pairs" (`gpucheck nccl pairs --json`) |
| bisect | `schema` "gpucheck.bisect" (`gpucheck bisect --json`) |

Every verdict is read with gpucheck.core.verdict.Verdict.from_json, which trusts nothing of its
shape: a verdict file that it refuses is refused (exit 2, naming the first problem); a history
line that is not a verdict it reads (torn by a crash, hand-edited) is skipped and counted, as the
history reader does, and a history with no verdict at all is refused; a node's verdict in a sweep
report that it refuses is left out of the page's grids and plots, as a node without one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..core.documents import FleetInputs, fleet_inputs
from ..core.jsonvalue import JsonValue
from ..core.verdict import SCHEMA_ID, Verdict, VerdictError
from ..render.grid import check_marks


class ReportError(Exception):
    """An input that cannot be used, or an output that cannot be made: exit 2 with this line."""


KINDS = {SCHEMA_ID: "verdict", "gpucheck.sweep": "sweep", "gpucheck.nccl.pairs": "pairs", "gpucheck.bisect": "bisect"}


@dataclass(frozen=True)
class NodeVerdict:
    """What a sweep report's page reads of a node's verdict (as a sweep keeps it: a few hundred
    bytes, not the verdict: a report of thousands of nodes holds no verdict in memory)."""

    checks: tuple[tuple[str, str], ...]  # (check, folded status): render.grid.check_marks
    inputs: FleetInputs  # its throughput values (core.documents.fleet_inputs)


@dataclass(frozen=True)
class Input:
    path: str
    kind: str  # verdict | history | sweep | pairs | bisect
    doc: dict[str, JsonValue] = field(default_factory=dict)  # the document ({} for a history)
    verdicts: tuple[Verdict, ...] = ()  # a verdict: itself; a history: its verdicts (in the file's order)
    node_verdicts: dict[str, NodeVerdict] = field(default_factory=dict)  # a sweep: each node's verdict that reads
    skipped_lines: int = 0


def load_input(path: str) -> Input:
    """Read and classify one input file; ReportError (one line naming the file) otherwise."""
    from ..platform.safeio import describe_error, read_input

    try:
        data = read_input(path, "report input")
    except OSError as e:
        raise ReportError(f"{path}: {describe_error(e, path)}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text (byte {e.start})") from None
    doc, why = _one_document(text)
    if why is None:
        return _classified(path, doc)
    verdicts, skipped = _json_lines(text)
    if verdicts:
        return Input(path, "history", verdicts=tuple(verdicts), skipped_lines=skipped)
    raise ReportError(f"{path}: not a gpucheck document ({why})")


def by_host(inp: Input) -> list[Input]:
    """A history as one Input per host, in the order the hosts first appear: a state directory
    shared by several hosts holds them all, and a node's history reads its own host's verdicts
    only (a page once titled "History of n1, vm"). Any other input as it is."""
    if inp.kind != "history":
        return [inp]
    hosts = list(dict.fromkeys(v.host for v in inp.verdicts))
    if len(hosts) < 2:
        return [inp]
    return [Input(inp.path, "history", verdicts=tuple(v for v in inp.verdicts if v.host == host),
                  skipped_lines=inp.skipped_lines) for host in hosts]


def _one_document(text: str) -> tuple[JsonValue, str | None]:
    from ..platform.safeio import loads_json

    try:
        return loads_json(text), None
    except ValueError as e:
        return None, f"not JSON: {str(e)[:120]}"


def _classified(path: str, doc: JsonValue) -> Input:
    schema = doc.get("schema") if isinstance(doc, dict) else None
    kind = KINDS.get(schema) if isinstance(schema, str) else None
    if kind is None or not isinstance(doc, dict):
        found = f"schema {schema!r}"[:80] if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        raise ReportError(f"{path}: not a verdict, history, sweep report, nccl pairs or bisect result ({found})")
    if kind == "verdict":
        try:
            return Input(path, kind, doc, verdicts=(Verdict.from_json(doc),))
        except VerdictError as e:
            raise ReportError(f"{path}: not a verdict gpucheck can read: {e}") from None
    problem = _shape_problem(kind, doc)
    if problem:
        raise ReportError(f"{path}: a {kind} document without {problem}")
    return Input(path, kind, doc, node_verdicts=_node_verdicts(doc) if kind == "sweep" else {})


def _node_verdicts(doc: dict[str, JsonValue]) -> dict[str, NodeVerdict]:
    """{node: what the page reads of its verdict} of a sweep report, for each node whose verdict
    Verdict.from_json reads."""
    out: dict[str, NodeVerdict] = {}
    nodes = doc.get("nodes")
    for entry in nodes if isinstance(nodes, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("verdict"), dict):
            try:
                verdict = Verdict.from_json(entry["verdict"])
            except VerdictError:
                continue
            out[str(entry.get("node"))] = NodeVerdict(check_marks(verdict), fleet_inputs(verdict))
    return out


_REQUIRED = {
    "sweep": (("nodes", list), ("counts", dict)),
    "pairs": (("nodes", list), ("pairs", list), ("node_scores", list)),
    "bisect": (("records", list), ("bad_nodes", list)),
}


def _shape_problem(kind: str, doc: dict[str, JsonValue]) -> str | None:
    for key, typ in _REQUIRED.get(kind, ()):
        if not isinstance(doc.get(key), typ):
            return f"a {typ.__name__} {key!r}"
    return None


def _json_lines(text: str) -> tuple[list[Verdict], int]:
    """The verdicts of a JSON-lines history and the number of lines that were not one."""
    from ..platform.safeio import loads_json

    verdicts: list[Verdict] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            verdicts.append(Verdict.from_json(loads_json(line)))
        except (ValueError, VerdictError):  # not JSON, nested too deep, or not a verdict
            skipped += 1
    return verdicts, skipped


def display_name(path: str) -> str:
    return os.path.basename(path) or path
