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

from ..compute.gemm import DTYPES, DtypeError, parse_dtypes
from .run import build_request, common_run_options, duration_callback, given, parsed_list


@click.command("burn")
@click.option("--duration", callback=duration_callback, default=None,
              help="How long to burn: 30s, 5m, 1h or seconds (default by level: 30 s at 2, 300 s at 3, 3600 s at 4).")
@click.option("--dtype", "dtypes", multiple=True, callback=parsed_list(parse_dtypes, DtypeError),
              help=f"Comma list of {','.join(DTYPES)} (repeatable; default by level: bf16 at 2, all at 3 and 4). "
                   "fp8 runs on GPUs with compute capability >= 8.9 only; elsewhere it is skipped, "
                   "and the result says why.")
@click.option("--size", type=click.IntRange(min=16), default=None,
              help="n of the n x n operands (default 8192 on GPUs, 256 on CPU workers).")
@click.option("--level", "-l", default="2", show_default=True, help="Level whose burn defaults apply (2, 3, 4).")
@common_run_options
def burn_command(duration: float | None, dtypes: list[str] | None, size: int | None, level: str, **kw) -> int:
    """Burn-in GEMMs on every GPU at once, verified bitwise and against float64, compared with
    the SKU's dense rate and with the node's other GPUs.

    Fault injection: bitflip:gpu=N[,bit=B,set=S], slow:gpu=N,factor=F, hang:gpu=N[,after=S].
    """
    from ..app import execute
    from ..render.burn_display import BurnDisplay

    if dtypes and "fp8" in dtypes and size is not None and size % 16:
        raise click.BadParameter(f"fp8 needs a size divisible by 16, not {size}", param_hint="--size")
    options = given(duration_s=duration, dtypes=dtypes, size=size)
    req = build_request(level=level, checks=["burn.gemm"], skips=(), options=options, **kw)
    return execute(req, display_factory=BurnDisplay)
