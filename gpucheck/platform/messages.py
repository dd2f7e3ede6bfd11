"""The one form of gpucheck's error lines: `gpucheck <command>: error: <what>` (issue 26).

Every command's usage errors (click's, exit 2), refused files and configs (exit 2) and its own
failures ("could not judge", exit 3) are one line on stderr in this form, so that a person, a
Slurm log or a hook reading another gpucheck's stderr finds them the same way. The CLI names
the command once (`set_command`, from the arguments, before it runs); code below the CLI that
reports an error (the run pipeline) asks for the line here and never spells a prefix itself.
"""

from __future__ import annotations

import re
import sys

PROGRAM = "gpucheck"
_command = [PROGRAM]  # the running command's path: "gpucheck", "gpucheck run", "gpucheck nccl run"
# An error line of any gpucheck command: the command's words, then ": error: ".
_ERROR_LINE = re.compile(rf"^{PROGRAM}(?: [a-z][a-z0-9-]*)*: error: (.*)$")


def set_command(path: str) -> None:
    """Name the running command ('gpucheck run'); its error lines start with it."""
    _command[0] = path if path.split(" ", 1)[0] == PROGRAM else PROGRAM


def command() -> str:
    return _command[0]


def error_line(message: str, path: str | None = None) -> str:
    """'gpucheck run: error: <message>' (the running command's, or `path`'s)."""
    return f"{path or _command[0]}: error: {message}"


def error_text(line: str) -> str | None:
    """The message of a gpucheck error line (any command's), None for any other line."""
    m = _ERROR_LINE.match(line.rstrip("\n"))
    return m.group(1).strip() if m else None


def say_error(message: str, path: str | None = None) -> None:
    """The error line on stderr; a stderr that cannot take it changes nothing."""
    try:
        sys.stderr.write(error_line(message, path) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
