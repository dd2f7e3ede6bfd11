"""The one table of checks: every check module of gpucheck/tests_suite/ with the level of its
check. Nothing imports a check module at import time: `gpucheck list` and `gpucheck run` import
a module by name when a run can use it, so a level-1 prolog never imports a level-2 check (nor
torch, CuPy or the worker plumbing). tests/test_registry.py keeps the levels true.

Adding a check: one module here that exposes `CHECKS` (docs/checks.md), and one line in TABLE.
"""

from __future__ import annotations

import importlib
from typing import Iterable

from ..core.check import Check

# module of gpucheck.tests_suite -> the level of its check (the lowest level of its CHECKS)
TABLE: dict[str, int] = {
    "inventory": 1,
    "ecc": 1,
    "memory_remap": 1,
    "clocks": 1,
    "pcie": 1,
    "pcie_aer": 1,
    "fabric_nvswitch": 1,
    "nvlink": 1,
    "recovery_action": 1,
    "xid": 1,
    "net_ports": 1,
    "gdr_peermem": 1,
    "net_flaps": 1,
    "burn_gemm": 2,
    "repro_bitwise": 1,
    "poet_ortho": 2,
    "nccl_intra": 2,
    "eud_memtest": 2,
    "eud_bandwidth": 2,
    "eud_power": 3,
    "eud_dcgm": 3,
}

_PACKAGE = __name__.rpartition(".")[0]


def module_levels() -> dict[str, int]:
    """TABLE with full module names (gpucheck.tests_suite.ecc -> 1), as it is now."""
    return {f"{_PACKAGE}.{m}": level for m, level in TABLE.items()}


# The table's full module names and levels when gpucheck was imported (tests/test_registry.py).
CHECK_MODULES: tuple[str, ...] = tuple(module_levels())
MODULE_MIN_LEVEL: dict[str, int] = module_levels()


def all_checks(modules: Iterable[str] | None = None, max_level: int | None = None) -> list[Check]:
    """Every check of `modules` (default: every module of TABLE); with `max_level`, only modules
    that have a check at or below it are imported (the checks returned may still include higher
    levels of those modules). A module TABLE does not list counts as level 1."""
    levels = module_levels()
    checks: list[Check] = []
    seen: set[str] = set()
    for name in (levels if modules is None else modules):
        if max_level is not None and levels.get(name, 1) > max_level:
            continue
        mod = importlib.import_module(name)
        for c in getattr(mod, "CHECKS"):
            if c.id in seen:
                raise RuntimeError(f"duplicate check id {c.id!r} in {name}")
            seen.add(c.id)
            checks.append(c)
    return sorted(checks, key=lambda c: (c.spec.level, c.id))


def find(check_id: str) -> Check | None:
    """The check of id `check_id`, or None: its module by the naming rule first (`burn.gemm` is
    burn_gemm, `memory-remap` memory_remap), then every module of TABLE."""
    name = f"{_PACKAGE}.{check_id.replace('.', '_').replace('-', '_')}"
    named = (name,) if name in module_levels() else ()
    for modules in (named, None):
        for check in all_checks(modules):
            if check.id == check_id:
                return check
    return None
