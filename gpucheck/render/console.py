"""The one way gpucheck makes a rich console, and the status marks and styles it prints.

`make_console` turns off everything rich would otherwise read into the text it prints: console
markup (`[red]...`), emoji codes (`:ab:` -> an emoji) and the highlighter (numbers, paths). A
piece of data (a bus id, a node name, a log line, a user path) is therefore printed exactly as
it is, in a str or in a `rich.text.Text`; styles go on Text spans (`styled`), never into markup.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

# Short marks of the grids, as dcgmi diag prints one test x GPU grid. A plain skip is lower
# case; a skip of something the run was asked to examine (unexamined: exit 3) is upper case.
MARKS = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "error": "ERR", "skip": "skip", "unexamined": "SKIP",
         "unreachable": "UNRCH", "timeout": "TIME"}
NO_RESULT = "."
STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "magenta", "skip": "dim",
          "unexamined": "bold magenta", "unreachable": "bold magenta", "timeout": "bold magenta",
          "ok": "green", "slow": "yellow", "bad": "bold red", "suspect": "yellow"}


def make_console(file: TextIO | None = None, *, width: int | None = None, color: bool | None = None,
                 record: bool = False) -> Any:
    """A rich Console that never interprets data: no markup, no emoji, no highlighting, no soft
    wrap of long lines into the next. `color`: None decides by the terminal (NO_COLOR,
    FORCE_COLOR, TERM honoured), False never, True always. `width`: the terminal's otherwise
    (COLUMNS, else 80 when not a terminal)."""
    from rich.console import Console

    kw: dict[str, Any] = {}
    if width is not None:
        kw["width"] = width
    if color is False:
        kw["color_system"] = None
    elif color is True:
        kw["force_terminal"] = True
        kw["color_system"] = "standard"
    return Console(file=file if file is not None else sys.stdout, markup=False, emoji=False, highlight=False,
                   soft_wrap=False, record=record, **kw)


def styled(text: str, style: str | None = None) -> Any:
    """`text` as a rich Text (literal: never markup, never emoji), in `style`."""
    from rich.text import Text

    return Text(str(text), style=style or "")


def mark(status: str) -> Any:
    """The grid mark of a status (pass, warn, fail, error, skip, unexamined, ...), styled."""
    return styled(MARKS.get(status, status), STYLES.get(status))


def line(*parts: Any) -> Any:
    """A Text made of strings (plain) and Texts (kept with their style)."""
    from rich.text import Text

    out = Text()
    for p in parts:
        out.append(p if isinstance(p, Text) else str(p))
    return out
