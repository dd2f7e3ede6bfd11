"""`gpucheck burn`: the burn-in GEMM check (burn.gemm) on its own, through the run pipeline.

    gpucheck burn                                  # level 2: 30 s of bf16 on every GPU
    gpucheck burn --duration 5m --dtype bf16,fp8   # longer, chosen dtypes
    gpucheck burn --level 3                        # 300 s, every dtype
    gpucheck burn --device cpu --workers 4 --size 128 --duration 10s   # no GPU: CPU workers
    gpucheck burn --device cpu --inject bitflip:gpu=1 --inject slow:gpu=2,factor=0.5

Exit codes as for `gpucheck run`: 0 healthy, 1 unhealthy, 2 usage error, 3 could not judge.
"""

from __future__ import annotations

import click

from ..tests_suite.burn_gemm import BurnOptions, burn_gemm
from .check_options import check_options, chosen, chosen_options
from .level_option import LEVEL
from .run import build_request, common_run_options


@click.command("burn")
@check_options(burn_gemm)
@click.option("--level", "-l", type=LEVEL, default="2", show_default=True, help="Level whose burn defaults apply (2, 3, 4).")
@common_run_options
def burn_command(level: str, **kw) -> int:
    """Burn-in GEMMs on every GPU at once, verified bitwise and against float64, compared with
    the SKU's dense rate and with the node's other GPUs.

    Fault injection: bitflip:gpu=N[,bit=B,set=S], slow:gpu=N,factor=F, hang:gpu=N[,after=S].
    """
    from ..app import execute
    from ..render.burn_display import BurnDisplay

    given = chosen(BurnOptions)
    if given.dtypes and "fp8" in given.dtypes and given.size is not None and given.size % 16:
        raise click.BadParameter(f"fp8 needs a size divisible by 16, not {given.size}", param_hint="--size")
    req = build_request(level=level, checks=["burn.gemm"], skips=(), check_options=chosen_options(), **kw)
    return execute(req, display_factory=BurnDisplay)
