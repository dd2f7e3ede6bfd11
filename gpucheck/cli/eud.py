"""`gpucheck eud`: the extended utility diagnostics (eud.*) on their own, through the run pipeline.

    gpucheck eud                          # level 3: memtest over nearly all free memory, copy
                                          # bandwidth, power/clock stability, DCGM diag if present
    gpucheck eud --level 2                # the short set: memtest on a fraction, copy bandwidth
    gpucheck eud --check eud.memtest --memtest-fraction 0.5 --pattern walking_ones,random
    gpucheck eud --check eud.dcgm --dcgm-level 2       # or medium
    gpucheck eud --device cpu --workers 2 --level 2 --inject bitflip:gpu=1   # no GPU: CPU workers

Exit codes as for `gpucheck run`: 0 healthy, 1 unhealthy, 2 usage error, 3 could not judge.
"""

from __future__ import annotations

import importlib

import click

from ..core.levels import Level
from ..tests_suite.registry import all_checks
from .check_options import check_options, chosen_options
from .level_option import LEVEL
from .run import build_request, common_run_options

# In this order: their options in `gpucheck eud --help`.
EUD_MODULES = tuple(f"gpucheck.tests_suite.eud_{name}" for name in ("memtest", "bandwidth", "power", "dcgm"))


def eud_check_ids(level: int) -> list[str]:
    """The eud.* check ids at or below `level` (importing only the eud modules)."""
    return [c.id for c in all_checks(EUD_MODULES) if int(c.spec.level) <= level]


def _eud_checks() -> list:
    """The eud checks in EUD_MODULES' order (their options' order in `--help`)."""
    return [c for name in EUD_MODULES for c in importlib.import_module(name).CHECKS]


@click.command("eud")
@click.option("--level", "-l", type=LEVEL, default="3", show_default=True,
              help="2: memtest on a fraction of memory + copy bandwidth; 3: also full memtest, power "
                   "and clock stability, DCGM diag; 4: memtest loops for --duration.")
@click.option("--check", "checks", multiple=True, metavar="ID",
              help="Only these eud checks (ids or globs, comma list, repeatable; any level).")
@click.option("--skip", "skips", multiple=True, metavar="ID", help="Leave these checks out.")
@check_options(*_eud_checks())
@common_run_options
def eud_command(level: str, checks: tuple[str, ...], skips: tuple[str, ...], **kw) -> int:
    """Extended diagnostics: HBM pattern test, copy bandwidth, power and clock stability under
    load, and NVIDIA DCGM's diagnostics when DCGM is installed.

    Fault injection: bitflip:gpu=N[,offset=BYTES,bit=B] (memtest), slow:gpu=N,factor=F (bandwidth),
    throttle:gpu=N[,reason=...,factor=F], hot:gpu=N[,delta=C], lowpower:gpu=N[,factor=F] (power).
    """
    from ..app import execute

    try:
        lv = Level.parse(level)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--level") from None
    wanted = [c for spec in checks for c in spec.split(",") if c.strip()]
    for c in wanted:
        if not c.startswith("eud."):
            raise click.BadParameter(f"{c!r} is not an eud check (use `gpucheck run --check` for others)",
                                     param_hint="--check")
    selected = wanted or eud_check_ids(int(lv))
    if not selected:
        raise click.BadParameter(f"no eud check runs at level {int(lv)} (they start at level 2)",
                                 param_hint="--level")
    req = build_request(level=str(int(lv)), checks=selected, skips=skips, check_options=chosen_options(), **kw)
    return execute(req)
