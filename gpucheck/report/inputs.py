"""Reading `gpucheck report`'s inputs: each file through gpucheck.platform.safeio (a regular file, at most
1 GiB, JSON nested at most 64 levels), classified by its content:

| kind | what identifies it |
|---|---|
| verdict | one JSON object with `schema` "gpucheck.verdict" (`gpucheck run --json`, `--output`) |
| history | JSON lines, two or more verdicts (the state directory's history.jsonl) |
| sweep | `schema` "gpucheck.sweep" (`gpucheck sweep --report` / `--json`) |
| pairs | `schema` "gpucheck.nccl.pairs" (`gpucheck nccl pairs --json`) |
| bisect | `schema` "gpucheck.bisect" (`gpucheck bisect --json`) |

A history line that is not a verdict (torn by a crash, hand-edited) is skipped and counted, as the
history reader does; a history with no verdict at all is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


class ReportError(Exception):
    """An input that cannot be used, or an output that cannot be made: exit 2 with this line."""


KINDS = {"gpucheck.verdict": "verdict", "gpucheck.sweep": "sweep", "gpucheck.nccl.pairs": "pairs",
         "gpucheck.bisect": "bisect"}


@dataclass
class Input:
    path: str
    kind: str  # verdict | history | sweep | pairs | bisect
    doc: Any  # the document; for a history, the list of verdicts (oldest first)
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
        return Input(path, "history", verdicts, skipped)
    raise ReportError(f"{path}: not a gpucheck document ({why})")


def _one_document(text: str) -> tuple[Any, str | None]:
    from ..platform.safeio import loads_json

    try:
        return loads_json(text), None
    except ValueError as e:
        return None, f"not JSON: {str(e)[:120]}"


def _classified(path: str, doc: Any) -> Input:
    schema = doc.get("schema") if isinstance(doc, dict) else None
    kind = KINDS.get(schema) if isinstance(schema, str) else None
    if kind is None:
        found = f"schema {schema!r}"[:80] if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        raise ReportError(f"{path}: not a verdict, history, sweep report, nccl pairs or bisect result ({found})")
    problem = _shape_problem(kind, doc)
    if problem:
        raise ReportError(f"{path}: a {kind} document without {problem}")
    return Input(path, kind, doc)


_REQUIRED = {
    "verdict": (("results", list), ("host", str), ("status", str)),
    "sweep": (("nodes", list), ("counts", dict)),
    "pairs": (("nodes", list), ("pairs", list), ("node_scores", list)),
    "bisect": (("records", list), ("bad_nodes", list)),
}


def _shape_problem(kind: str, doc: dict[str, Any]) -> str | None:
    for key, typ in _REQUIRED.get(kind, ()):
        if not isinstance(doc.get(key), typ):
            return f"a {typ.__name__} {key!r}"
    return None


def _json_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """The verdicts of a JSON-lines history and the number of lines that were not one."""
    from ..platform.safeio import loads_json

    verdicts, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            doc = loads_json(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(doc, dict) and doc.get("schema") == "gpucheck.verdict" and not _shape_problem("verdict", doc):
            verdicts.append(doc)
        else:
            skipped += 1
    return verdicts, skipped


def display_name(path: str) -> str:
    return os.path.basename(path) or path
