"""A JSON value as it comes off the wire (`json.loads` of a node's answer, a file, a history line):
nothing has vouched for its shape yet. A parser narrows it, field by field (isinstance), into a
typed object (gpucheck.core.verdict.Verdict.from_json), or says why it cannot."""

from __future__ import annotations

from typing import Union

JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
