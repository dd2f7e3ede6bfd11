"""`gpucheck poet`: the POET orthogonal-matmul check (poet.ortho) on its own, through the run
pipeline.

    gpucheck poet                                          # level 2: 30 s, every dtype and block size
    gpucheck poet --duration 5m --block 64,256 --dtype bf16
    gpucheck poet --level 3                                # 300 s
    gpucheck poet --device cpu --workers 2 --duration 5s   # no GPU: CPU workers, torch path
    gpucheck poet --device cpu --workers 2 --inject bitflip:gpu=1[,op=forward|output|merge|roundtrip|cnp,bit=B]

Exit codes as for `gpucheck run`: 0 healthy, 1 unhealthy, 2 usage error, 3 could not judge.
"""

from __future__ import annotations

import click

from ..tests_suite.poet_ortho import PoetOptions, poet_ortho
from .check_options import check_options, chosen, chosen_options
from .level_option import LEVEL
from .run import build_request, common_run_options


@click.command("poet")
@check_options(poet_ortho)
@click.option("--level", "-l", type=LEVEL, default="2", show_default=True, help="Level whose defaults apply (2, 3, 4).")
@common_run_options
def poet_command(level: str, **kw) -> int:
    """POET-style orthogonal matmuls on every GPU at once, verified by invariants that hold in
    exact arithmetic (Cayley-Neumann orthogonality, input- vs weight-centric forward, norm
    preservation, round trip, merge chain) and against float64 references.

    Fault injection: bitflip:gpu=N[,op=forward|output|merge|roundtrip|cnp,bit=B,row=R,col=C,problem=P],
    hang:gpu=N[,after=S].
    """
    from ..app import execute
    from ..render.burn_display import BurnDisplay

    given = chosen(PoetOptions)
    if given.size is not None:
        bad = [b for b in (given.blocks or [32, 64, 128, 256]) if given.size % b]
        if bad:
            raise click.BadParameter(f"{given.size} is not a multiple of block size(s) {','.join(map(str, bad))}",
                                     param_hint="--size")
    if given.backend == "cupy" and kw.get("device") == "cpu":
        raise click.BadParameter("cupy runs the CUDA kernels on GPUs, not on CPU workers (--device cpu)",
                                 param_hint="--backend")
    req = build_request(level=level, checks=["poet.ortho"], skips=(), check_options=chosen_options(), **kw)
    return execute(req, display_factory=BurnDisplay)
