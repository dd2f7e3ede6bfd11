"""Raw command-line arguments read without a parser: for the paths that run when the parse
failed or never happened (the last-resort crash handler in gpucheck.cli.main, a Slurm hook whose
arguments did not parse). Imports nothing, so that those paths cannot fail on an import."""

from __future__ import annotations


def option_value(args: list[str], name: str) -> str | None:
    """The last value of option `name` in raw arguments (`--name V` or `--name=V`)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value
