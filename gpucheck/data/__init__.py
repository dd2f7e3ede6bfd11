"""Data tables (per-SKU performance, ...): plain data, no logic beyond lookups."""

from __future__ import annotations

import re
from typing import Iterable, TypeVar

Row = TypeVar("Row")


def name_matches(pattern: str, device_name: str) -> bool:
    """Whether a table row's regex `pattern` is found in an NVML / torch device name (any case)."""
    return re.search(pattern, device_name, flags=re.IGNORECASE) is not None


def first_match(rows: Iterable[Row], device_name: str | None) -> Row | None:
    """The first row (order matters: specific rows before general ones) whose `matches(name)` is
    true, or None for an empty or unknown name."""
    if not device_name:
        return None
    return next((row for row in rows if row.matches(device_name)), None)  # type: ignore[attr-defined]
