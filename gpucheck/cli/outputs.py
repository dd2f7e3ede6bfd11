"""The one way a command writes its product to a user-named output (-o FILE, - or none is
standard output): refused before any work when it cannot be written, atomically after, one line
naming the file on stderr when it cannot be (exit 2)."""

from __future__ import annotations

import click

from ..platform.messages import say_error


def _to_stdout(output: str | None) -> bool:
    return output is None or output == "-"


def output_refused(prog: str, output: str | None) -> bool:
    """True (after one line on stderr) when `output` could not be written: a device, an untrusted
    symlink, no such folder. Called before anything is read or collected."""
    from ..platform.safeio import check_output, output_problem

    if _to_stdout(output):
        return False
    try:
        check_output(output)
    except OSError as e:
        say_error(f"cannot write {output}: {output_problem(e, output)}", prog)
        return True
    return False


def emit(prog: str, output: str | None, text: str) -> int | None:
    """`text` to standard output (0) or written to `output` (None: the caller says what it wrote);
    2 (after one line on stderr) when it could not be written."""
    from ..platform.safeio import output_problem, write_output

    if _to_stdout(output):
        click.echo(text, nl=False)
        return 0
    try:
        write_output(output, text)
    except OSError as e:
        say_error(f"cannot write {output}: {output_problem(e, output)}", prog)
        return 2
    return None
