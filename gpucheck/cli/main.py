"""`gpucheck` entry point. Subcommands are imported only when invoked, so that a level-1 run
starts fast and never imports torch or rich when it does not need them."""

from __future__ import annotations

import importlib
import sys

import click

from .. import __version__

# name -> "module:attribute" of a click command. One line per subcommand.
SUBCOMMANDS: dict[str, str] = {
    "run": "gpucheck.cli.run:run_command",
    "list": "gpucheck.cli.run:list_command",
    "schema": "gpucheck.cli.run:schema_command",
    "telemetry": "gpucheck.cli.telemetry:telemetry_group",
    "xid": "gpucheck.cli.xid:xid_command",
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


def main(argv: list[str] | None = None) -> int:
    try:
        rv = cli.main(args=argv, prog_name="gpucheck", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code or 0)
    except click.ClickException as e:
        # One line, like every other usage error (DESIGN.md exit code 2).
        cmd = getattr(getattr(e, "ctx", None), "command_path", None) or "gpucheck"
        click.echo(f"{cmd}: error: {e.format_message()}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 3
    except BrokenPipeError:
        return 0
    return int(rv or 0)


def entry() -> None:
    """Console-script entry of installs made before gpucheck.cli.start existed."""
    from .start import entry as start

    start()


if __name__ == "__main__":  # pragma: no cover - `python -m gpucheck.cli.main`
    sys.exit(main())
