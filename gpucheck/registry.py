"""Where checks come from. The core imports no check at import time: modules are listed by name
and imported on demand (`gpucheck list`, `gpucheck run`). Each module exposes `CHECKS`, a list of
`gpucheck.core.check.Check`.
"""

from __future__ import annotations

import fnmatch
import importlib
from typing import Iterable

from .core.check import Check, Level

CHECK_MODULES: tuple[str, ...] = (
    "gpucheck.tests_suite.inventory",
    "gpucheck.tests_suite.ecc",
    "gpucheck.tests_suite.memory_remap",
    "gpucheck.tests_suite.clocks",
    "gpucheck.tests_suite.pcie",
    "gpucheck.tests_suite.nvlink",
    "gpucheck.tests_suite.recovery_action",
    "gpucheck.tests_suite.xid",
    "gpucheck.tests_suite.burn",
    "gpucheck.tests_suite.repro",
    "gpucheck.tests_suite.poet",
    "gpucheck.nccl.checks",
    "gpucheck.eud.memtest",
    "gpucheck.eud.bandwidth",
    "gpucheck.eud.power",
    "gpucheck.eud.dcgm",
)


class SelectionError(ValueError):
    pass


# The lowest level of any check in a module, for modules above level 1: a run at a lower level
# does not import them at all (a level-1 prolog pays only for the level-1 checks).
# tests/test_registry.py keeps this table true.
MODULE_MIN_LEVEL: dict[str, int] = {
    "gpucheck.tests_suite.burn": 2,
    "gpucheck.nccl.checks": 2,
    "gpucheck.tests_suite.poet": 2,
    "gpucheck.eud.memtest": 2,
    "gpucheck.eud.bandwidth": 2,
    "gpucheck.eud.power": 3,
    "gpucheck.eud.dcgm": 3,
}


def all_checks(modules: Iterable[str] = CHECK_MODULES, max_level: int | None = None) -> list[Check]:
    """Every check of `modules`; with `max_level`, only modules that have a check at or below it
    are imported (the checks returned may still include higher levels of those modules)."""
    checks: list[Check] = []
    seen: set[str] = set()
    for name in modules:
        if max_level is not None and MODULE_MIN_LEVEL.get(name, 1) > max_level:
            continue
        mod = importlib.import_module(name)
        for c in getattr(mod, "CHECKS"):
            if c.id in seen:
                raise RuntimeError(f"duplicate check id {c.id!r} in {name}")
            seen.add(c.id)
            checks.append(c)
    return sorted(checks, key=lambda c: (c.spec.level, c.id))


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
