"""Durations on the command line and in configs: '30s', '5m', '1h30m', '2.5m', '250ms', '90'."""

from __future__ import annotations

import math
import re

MAX_DURATION_S = 366 * 86400.0  # a year: no time limit, window or test of gpucheck's is longer

_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0,
          "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
          "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|mins|min|secs|sec|s|m|hrs|hr|h|days|day|d|w)?", re.IGNORECASE)


def parse_duration(text: str | float | int, *, require_unit: bool = False) -> float:
    """Seconds; ValueError with a one-line message for anything else or a non-positive value.

    require_unit: every number needs a unit (where a bare number means something else, such as
    an epoch timestamp in `--since`)."""
    s = str(text).strip().lower()
    if not s:
        raise ValueError("empty duration")
    total, pos = 0.0, 0
    for m in _PART.finditer(s):
        if m.start() != pos or (require_unit and not m.group(2)):
            break
        total += float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
        pos = m.end()
        while pos < len(s) and s[pos] == " ":
            pos += 1
    if pos != len(s):
        raise ValueError(f"bad duration {text!r} (want e.g. 30s, 5m, 1h or seconds)")
    if total <= 0:
        raise ValueError(f"duration must be positive, not {_shown(text)} (want more than 0 and at most 366 days)")
    if not math.isfinite(total) or total > MAX_DURATION_S:
        raise DurationRangeError(f"duration {_shown(text)} is out of range (want more than 0 and at most 366 days)")
    return total


class DurationRangeError(ValueError):
    """A well-formed duration longer than MAX_DURATION_S (or infinite)."""


def _shown(text: str | float | int) -> str:
    """`text` for a message: a number of 400 digits is cut."""
    s = repr(str(text))
    return s if len(s) <= 40 else s[:30] + "...' (" + str(len(str(text))) + " characters)"
