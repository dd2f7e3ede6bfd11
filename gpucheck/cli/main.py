"""`gpucheck` entry point. Subcommands are imported only when invoked, so that a level-1 run
starts fast and never imports torch or rich when it does not need them."""

from __future__ import annotations

import importlib
import os
import sys

import click

from .. import __version__
from ..platform import messages
from ..platform.argv import option_value

# name -> "module:attribute" of a click command. One line per subcommand.
SUBCOMMANDS: dict[str, str] = {
    "run": "gpucheck.cli.run:run_command",
    "list": "gpucheck.cli.run:list_command",
    "schema": "gpucheck.cli.run:schema_command",
    "telemetry": "gpucheck.cli.telemetry:telemetry_group",
    "xid": "gpucheck.cli.xid:xid_command",
    "judge": "gpucheck.cli.judge:judge_command",
    "burn": "gpucheck.cli.burn:burn_command",
    "poet": "gpucheck.cli.poet:poet_command",
    "eud": "gpucheck.cli.eud:eud_command",
    "repro": "gpucheck.cli.repro:repro_group",
    "sweep": "gpucheck.cli.sweep:sweep_command",
    "slurm": "gpucheck.cli.slurm:slurm_group",
    "bisect": "gpucheck.cli.bisect:bisect_command",
    "nccl": "gpucheck.cli.nccl:nccl_group",
    "hang": "gpucheck.cli.hang:hang_command",
    "report": "gpucheck.cli.report:report_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return None
        mod_name, _, attr = target.partition(":")
        return getattr(importlib.import_module(mod_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpucheck")
def cli() -> None:
    """Node-health and stress diagnostics for GPU training clusters.

    Exit codes: 0 healthy, 1 unhealthy, 2 usage/config error, 3 could not judge.
    """


# Commands whose output is no judgement: a reader that goes away early (`gpucheck list | head`)
# is no failure of theirs. Every other command judges something (a node, a fleet, a job's ranks).
NO_JUDGEMENT = ("list", "schema")


def main(argv: list[str] | None = None) -> int:
    """Run `gpucheck ARGV`; return its exit code. Nothing but a judgement exits 1 (or a
    could-not-judge under `--on-error fail`): a usage error is 2, and an uncaught exception or an
    output that could not be written (stdout on a full disk, a closed pipe) is 3, "could not
    judge", with one line on stderr. A command that judged and then failed only to print keeps its
    code where it handles its own printing (app.execute: run, burn, poet, eud, repro check)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "_GPUCHECK_COMPLETE" in os.environ:  # click's shell completion (exits when it is asked for)
        cli._main_shell_completion({}, "gpucheck")
    messages.set_command(_command_name(args))  # every error line: `gpucheck <command>: error: ...`
    try:
        # Not cli.main(): click turns EPIPE into SystemExit(1), "unhealthy".
        with cli.make_context("gpucheck", args) as ctx:
            rv = cli.invoke(ctx)
    except click.exceptions.Exit as e:
        return int(e.exit_code or 0)
    except click.ClickException as e:
        # One line, like every other usage error (DESIGN.md exit code 2).
        cmd = getattr(getattr(e, "ctx", None), "command_path", None)
        _say(messages.error_line(e.format_message(), cmd))
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt, EOFError):
        _say(messages.error_line("aborted"))
        return 3
    except Exception as e:  # gpucheck's own failure is "could not judge", never "unhealthy" (exit 1)
        return _could_not_judge(args, e)
    return int(rv or 0)


def _could_not_judge(args: list[str], e: Exception) -> int:
    """Exit 3 (1 with `--on-error fail` among the arguments: fail-closed) and one line for an
    exception no command handled: an output it could not write, or gpucheck's own bug. A reader
    gone from a command that judges nothing (`list | head`) is 0."""
    from ..platform.streams import flush_or_discard

    stdout_error = flush_or_discard(sys.stdout)  # what it still holds could not be written either
    if isinstance(e, BrokenPipeError) and _command_word(args) in (None, *NO_JUDGEMENT):
        return 0
    if stdout_error is not None and isinstance(e, OSError):
        why = f"standard output could not be written: {e}"
    elif isinstance(e, OSError):  # the system refused something (a full disk, a closed pipe): no bug of ours
        why = f"{type(e).__name__}: {e}{_where(e)}"
    else:
        why = f"internal error: {type(e).__name__}: {e}{_where(e)}"
    fail_closed = option_value(args, "--on-error") == "fail"
    _say(messages.error_line(f"could not judge: {why}" + (" (--on-error fail: exit 1)" if fail_closed else ""),
                             _command_name(args)))
    return 1 if fail_closed else 3


def _command_word(args: list[str]) -> str | None:
    """The subcommand `args` names (their first word that is not an option), if it is one."""
    words = [a for a in args if not a.startswith("-")]
    return words[0] if words and words[0] in SUBCOMMANDS else None


def _command_name(args: list[str]) -> str:
    """'gpucheck run', 'gpucheck nccl run' (a group's subcommand too), or 'gpucheck'."""
    word = _command_word(args)
    if word is None:
        return "gpucheck"
    try:
        group = cli.get_command(click.Context(cli), word)
    except Exception:  # a subcommand that cannot even be imported: its error names the word
        return f"gpucheck {word}"
    words = [a for a in args if not a.startswith("-")]
    if isinstance(group, click.Group) and len(words) > 1 and words[1] in group.commands:
        return f"gpucheck {word} {words[1]}"
    return f"gpucheck {word}"


def _where(e: BaseException) -> str:
    """' (at FILE:LINE in FUNCTION)': where in gpucheck the exception was raised (its innermost
    gpucheck frame), for the report of an internal error that fits on one line."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../gpucheck
    tb, here = e.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith(package + os.sep):
            where = os.path.relpath(code.co_filename, os.path.dirname(package))
            here = f" (at {where}:{tb.tb_lineno} in {code.co_name})"
        tb = tb.tb_next
    return here


def _say(line: str) -> None:
    """One line on stderr; a stderr that cannot take it changes nothing."""
    try:
        click.echo(line, err=True)
    except Exception:
        pass


def prepare_stdout() -> None:
    """Before any output: a closed stdin, stdout or stderr becomes /dev/null, and text that a
    non-UTF-8 stdout cannot encode is written escaped."""
    from ..platform.streams import ensure_standard_streams, escape_unencodable

    ensure_standard_streams()
    escape_unencodable(sys.stdout)


def settle_stdout(argv: list[str] | None = None) -> None:
    """After the last output: flush stdout and stderr. What stdout cannot take (a closed pipe, a
    full disk) is named in one line on stderr (a judging command's exit code stands: its
    judgement was made); what neither can take goes nowhere, so that Python's own flush at exit
    cannot turn the exit code into 120."""
    from ..platform.streams import flush_or_discard

    error = flush_or_discard(sys.stdout)
    args = list(sys.argv[1:] if argv is None else argv)
    if error is not None and _command_word(args) not in (None, *NO_JUDGEMENT):
        _say(f"{_command_name(args)}: WARNING: standard output was not written whole: {error}")
    flush_or_discard(sys.stderr)


if __name__ == "__main__":  # pragma: no cover - `python -m gpucheck.cli.main`
    prepare_stdout()
    code = main()
    settle_stdout()
    sys.exit(code)
