"""The console script's first lines: arm the SIGTERM/SIGINT recorder for the commands that write a
verdict, before click, the checks or NVML are imported, then hand over to gpucheck.cli.main.

Only those commands: `run`, `burn`, `poet`, `eud` and `repro check` turn a signal into a partial
verdict (gpucheck.platform.interrupts), and so do the Slurm hooks `slurm prolog|epilog`, which also hold
a signal that comes after the verdict until they have drained and logged; once their last output
is written, a signal is ignored until the process exits with the verdict's code. Every other
command keeps Python's default handlers or installs its own (a sweep stops its fan-out,
`xid --follow` ends on Ctrl-C).
"""

from __future__ import annotations

import sys

VERDICT_COMMANDS = ("run", "burn", "poet", "eud", "repro check", "slurm prolog", "slurm epilog")


def writes_verdict(argv: list[str]) -> bool:
    """Whether `gpucheck <argv>` is one of VERDICT_COMMANDS (its first two words that are not
    options)."""
    words = [a for a in argv[:2] if not a.startswith("-")]
    return bool(words) and (words[0] in VERDICT_COMMANDS or " ".join(words[:2]) in VERDICT_COMMANDS)


def entry() -> None:
    """Console-script and `python -m gpucheck` entry: exit with main()'s code, which no output
    left unwritten at exit may change (gpucheck.cli.main.settle_stdout)."""
    interrupts = None
    if writes_verdict(sys.argv[1:]):
        from ..platform.interrupts import INTERRUPTS as interrupts

        interrupts.arm()
    from .main import main, prepare_stdout, settle_stdout

    prepare_stdout()
    code = main()
    settle_stdout()
    if interrupts is not None:
        interrupts.settle()  # the verdict is out: nothing may turn this exit into a death
    sys.exit(code)
