"""A node's output in one line: what the fleet commands (sweep, hang) quote of it in a reason."""

from __future__ import annotations

SNIPPET = 200


def snippet(s: str) -> str:
    """`s` on one line, cut at SNIPPET characters."""
    s = " ".join(s.split())
    return s[:SNIPPET] + ("..." if len(s) > SNIPPET else "")


def last_line(s: str) -> str:
    """The last non-blank line of `s`, as a snippet."""
    lines = [ln.strip() for ln in s.splitlines() if ln.strip()]
    return snippet(lines[-1]) if lines else ""
