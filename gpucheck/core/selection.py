"""Which checks a run runs: the checks of levels <= the run's level, or exactly those `--check`
names (ids or globs), minus `--skip`. The checks themselves come from the registry table of
gpucheck.tests_suite.registry; this module imports none."""

from __future__ import annotations

import fnmatch
from typing import Iterable

from .check import Check
from .levels import Level


class SelectionError(ValueError):
    pass


def _match(patterns: Iterable[str], checks: list[Check], what: str) -> set[str]:
    ids = [c.id for c in checks]
    chosen: set[str] = set()
    for p in patterns:
        hits = [i for i in ids if i == p or fnmatch.fnmatchcase(i, p)]
        if not hits:
            raise SelectionError(f"unknown check id {p!r} in {what} (see `gpucheck list`)")
        chosen.update(hits)
    return chosen


def select(
    checks: list[Check],
    level: Level,
    include: Iterable[str] = (),
    skip: Iterable[str] = (),
) -> list[Check]:
    """Checks of levels <= `level`, or exactly those named by `include` (ids or globs, any
    level), minus `skip`. Unknown ids are a SelectionError."""
    include = [p for p in include if p]
    skip = [p for p in skip if p]
    skipped = _match(skip, checks, "--skip")
    if include:
        wanted = _match(include, checks, "--check")
        chosen = [c for c in checks if c.id in wanted]
    else:
        chosen = [c for c in checks if c.spec.level <= level]
    return [c for c in chosen if c.id not in skipped]
