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

from ..poet.bounds import PoetInputError, parse_blocks, parse_dtypes
from .run import build_request, common_run_options, duration_callback, given, parsed_list


@click.command("poet")
@click.option("--duration", callback=duration_callback, default=None,
              help="How long: 30s, 5m, 1h or seconds (default by level: 30 s at 2, 300 s at 3, 1800 s at 4).")
@click.option("--block", "blocks", multiple=True, callback=parsed_list(parse_blocks, PoetInputError),
              help="Comma list of block sizes from 32,64,128,256 (repeatable; default all).")
@click.option("--dtype", "dtypes", multiple=True, callback=parsed_list(parse_dtypes, PoetInputError),
              help="Comma list of fp32,bf16,fp16 (repeatable; default all).")
@click.option("--size", type=click.IntRange(min=32), default=None,
              help="n, the features of x and W: a multiple of every block size (default 4096 on GPUs, "
                   "2 blocks on CPU workers).")
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="m, the rows of x (default 4096 on GPUs, 64 on CPU workers).")
@click.option("--backend", type=click.Choice(["auto", "cupy", "torch"]), default=None,
              help="auto (default): the CUDA kernels through CuPy on GPUs when CuPy is installed, torch otherwise.")
@click.option("--level", "-l", default="2", show_default=True, help="Level whose defaults apply (2, 3, 4).")
@common_run_options
def poet_command(duration: float | None, blocks: list[int] | None, dtypes: list[str] | None, size: int | None,
                 rows: int | None, backend: str | None, level: str, **kw) -> int:
    """POET-style orthogonal matmuls on every GPU at once, verified by invariants that hold in
    exact arithmetic (Cayley-Neumann orthogonality, input- vs weight-centric forward, norm
    preservation, round trip, merge chain) and against float64 references.

    Fault injection: bitflip:gpu=N[,op=forward|output|merge|roundtrip|cnp,bit=B,row=R,col=C,problem=P],
    hang:gpu=N[,after=S].
    """
    from ..app import execute
    from ..render.burn_display import BurnDisplay

    if size is not None:
        bad = [b for b in (blocks or [32, 64, 128, 256]) if size % b]
        if bad:
            raise click.BadParameter(f"{size} is not a multiple of block size(s) {','.join(map(str, bad))}",
                                     param_hint="--size")
    if backend == "cupy" and kw.get("device") == "cpu":
        raise click.BadParameter("cupy runs the CUDA kernels on GPUs, not on CPU workers (--device cpu)",
                                 param_hint="--backend")
    options = given(duration_s=duration, dtypes=dtypes, blocks=blocks, size=size, rows=rows, backend=backend)
    req = build_request(level=level, checks=["poet.ortho"], skips=(), options=options, **kw)
    return execute(req, display_factory=BurnDisplay)
