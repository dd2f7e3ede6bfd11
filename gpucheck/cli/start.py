"""The console script's first lines: arm the SIGTERM/SIGINT recorder for every command, before
click, the checks or NVML are imported, then hand over to gpucheck.cli.main.

A signal may come at any moment, also while Python imports the command and it plans its work
(0.2-0.3 s for a sweep). The recorder (gpucheck.platform.interrupts) holds it from the first line
on, never fatal, and then:

- `run`, `burn`, `poet`, `eud` and `repro check` turn it into a partial verdict, and so do the
  Slurm hooks `slurm prolog|epilog`, which also hold a signal that comes after the verdict until
  they have drained and logged;
- the commands that stop their children on a signal (`sweep`, `bisect`, `nccl pairs`, `slurm
  resume`, `hang`) take it when their own handling starts: their children are stopped as they
  start, and they report what they have (nothing yet), exit 3;
- every other command gets Python's own handlers back before it begins (a SIGINT is then
  KeyboardInterrupt: exit 3; `xid --follow` ends on Ctrl-C), or, when a signal already came,
  does not begin: one line, exit 3.

Once a command's last output is written, a signal is ignored until the process exits with its
code.
"""

from __future__ import annotations

import sys

VERDICT_COMMANDS = ("run", "burn", "poet", "eud", "repro check", "slurm prolog", "slurm epilog")
STOPPING_COMMANDS = ("sweep", "bisect", "nccl pairs", "slurm resume", "hang")
INTERRUPTED_EXIT = 3  # docs/exit-codes.md: an interrupted run could not judge


def _is_one_of(argv: list[str], commands: tuple[str, ...]) -> bool:
    """Whether `gpucheck <argv>` is one of `commands` (its first two words that are not options)."""
    words = [a for a in argv[:2] if not a.startswith("-")]
    return bool(words) and (words[0] in commands or " ".join(words[:2]) in commands)


def handles_signals(argv: list[str]) -> bool:
    """Whether `gpucheck <argv>` acts on a signal itself: VERDICT_COMMANDS and STOPPING_COMMANDS."""
    return _is_one_of(argv, VERDICT_COMMANDS + STOPPING_COMMANDS)


def entry() -> None:
    """Console-script and `python -m gpucheck` entry: exit with main()'s code, which no output
    left unwritten at exit may change (gpucheck.cli.main.settle_stdout)."""
    try:
        from ..platform.interrupts import INTERRUPTS

        INTERRUPTS.arm()
    except KeyboardInterrupt:  # Python's own SIGINT handling, the moment before the recorder's
        sys.stderr.write("gpucheck: interrupted by SIGINT before it began\n")
        sys.exit(INTERRUPTED_EXIT)
    from .main import main, prepare_stdout, settle_stdout

    try:
        if not handles_signals(sys.argv[1:]) and (signame := INTERRUPTS.hand_back()):
            sys.stderr.write(f"gpucheck: interrupted by {signame} before it began\n")
            code = INTERRUPTED_EXIT
        else:
            prepare_stdout()
            code = main()
    except KeyboardInterrupt:  # a SIGINT after hand_back(), before main() catches its own
        sys.stderr.write("gpucheck: interrupted by SIGINT\n")
        code = INTERRUPTED_EXIT
    settle_stdout()
    INTERRUPTS.settle()  # the output is out: nothing may turn this exit into a death
    sys.exit(code)
