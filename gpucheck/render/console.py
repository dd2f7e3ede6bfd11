"""The one way gpucheck makes a rich console, and the status marks and styles it prints.

`make_console` turns off everything rich would otherwise read into the text it prints: console
markup (`[red]...`), emoji codes (`:ab:` -> an emoji) and the highlighter (numbers, paths). A
piece of data (a bus id, a node name, a log line, a user path) is therefore printed exactly as
it is, in a str or in a `rich.text.Text`; styles go on Text spans (`styled`), never into markup.

Nor does data reach the terminal as control sequences: a node's stderr, a verdict summary or a
process name holding ESC (`\x1b]52;...` sets the clipboard, `\x1b[2J` clears the screen) is
printed with every control character shown as its Unicode "control picture" (ESC as ␛, one
character for one, so a Text's styled spans stay where they were): `plain()` for text written
directly, and the console itself for everything it prints (strings, Texts, tables).
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

# Short marks of the grids, as dcgmi diag prints one test x GPU grid. Each says a different
# thing, not the same word in another case: `skip` a check that does not apply here (or was left
# out), `MISS` something the run was asked to examine and did not (could not judge: exit 3).
MARKS = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "error": "ERR", "skip": "skip", "unexamined": "MISS",
         "unreachable": "UNRCH", "timeout": "TIME"}
NO_RESULT = "."
# What the marks that do not say it themselves mean (ok, WARN and FAIL do): the legend under a grid.
MEANINGS = {"error": "could not judge", "unexamined": "not examined (exit 3)",
            "unreachable": "node not reached", "timeout": "node out of time",
            "skip": "does not apply here (why below)", NO_RESULT: "no result here"}
_LEGEND_ORDER = ("error", "unexamined", "unreachable", "timeout", "skip", NO_RESULT)
STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "magenta", "skip": "dim",
          "unexamined": "bold magenta", "unreachable": "bold magenta", "timeout": "bold magenta",
          "ok": "green", "slow": "yellow", "bad": "bold red", "suspect": "yellow"}


# C0 controls but newline and tab, DEL, and the C1 controls (0x80-0x9f: 0x9b is a one-byte CSI)
_PICTURES = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_PICTURES.update({0x7F: 0x2421, **{c: 0xFFFD for c in range(0x80, 0xA0)}})


def plain(text: str) -> str:
    """`text` with every terminal control character made visible, one character for one."""
    return str(text).translate(_PICTURES)


def _safe(obj: Any) -> Any:
    """A str or Text with its control characters made visible; any other renderable (a table)
    wrapped so that the text of every segment it renders is."""
    from rich.text import Text

    if isinstance(obj, str):
        return plain(obj)
    if isinstance(obj, Text):
        out = obj.copy()
        out.plain = plain(obj.plain)  # same length: the spans keep their places
        return out
    return _Visible(obj)


class _Visible:
    """A renderable whose rendered text has its control characters made visible (rich's own
    styles are not text: they are rendered after this, as the console's escape codes)."""

    def __init__(self, renderable: Any):
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        for seg in console.render(self.renderable, options):
            yield seg if seg.control else Segment(plain(seg.text), seg.style, seg.control)


# The width of output that is not a terminal: wide enough that no line is ever wrapped (a table
# row, a word, a TOML key stay whole in a cron mail, an ssh capture or a Slurm log).
UNWRAPPED_WIDTH = 1_000_000


def output_width(file: TextIO, width: int | None = None) -> int | None:
    """The width to lay `file`'s text out in: `width` when given; else COLUMNS when set; else the
    terminal's (None: rich asks it); else, not a terminal, UNWRAPPED_WIDTH: never wrapped."""
    if width is not None:
        return width
    if os.environ.get("COLUMNS", "").strip().isdecimal() and int(os.environ["COLUMNS"]) > 0:
        return int(os.environ["COLUMNS"])
    try:
        return None if file.isatty() else UNWRAPPED_WIDTH
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file: not a terminal
        return UNWRAPPED_WIDTH


def make_console(file: TextIO | None = None, *, width: int | None = None, color: bool | None = None,
                 record: bool = False) -> Any:
    """A rich Console that never interprets data: no markup, no emoji, no highlighting, no soft
    wrap of long lines into the next. `color`: None decides by the terminal (NO_COLOR,
    FORCE_COLOR, TERM honoured), False never, True always. `width`: COLUMNS when set, else the
    terminal's; output that is not a terminal is never wrapped (`output_width`)."""
    from rich.console import Console

    file = file if file is not None else sys.stdout
    kw: dict[str, Any] = {}
    width = output_width(file, width)
    if width is not None:
        kw["width"] = width
    if color is False:
        kw["color_system"] = None
    elif color is True:
        kw["force_terminal"] = True
        kw["color_system"] = "standard"
    class DataConsole(Console):  # every object printed goes through _safe
        def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
            super().print(*(_safe(o) for o in objects), **kwargs)

    return DataConsole(file=file, markup=False, emoji=False, highlight=False,
                       soft_wrap=False, record=record, **kw)


def styled(text: str, style: str | None = None) -> Any:
    """`text` as a rich Text (literal: never markup, never emoji), in `style`."""
    from rich.text import Text

    return Text(str(text), style=style or "")


def mark(status: str) -> Any:
    """The grid mark of a status (pass, warn, fail, error, skip, unexamined, ...), styled."""
    return styled(MARKS.get(status, status), STYLES.get(status))


def legend(shown: set[str]) -> Any | None:
    """One line under a grid: what each mark in it that is not a plain word means ('marks: skip
    does not apply here (why below); . no result here'); None when there is none.
    `shown`: the statuses in its cells, and NO_RESULT when a cell is empty."""
    explained = [s for s in _LEGEND_ORDER if s in shown]
    if not explained:
        return None
    out = line(styled("marks: ", "dim"))
    for i, status in enumerate(explained):
        if i:
            out.append("; ", style="dim")
        out.append(mark(status) if status != NO_RESULT else styled(NO_RESULT, "dim"))
        out.append(f" {MEANINGS[status]}")
    return out


def line(*parts: Any) -> Any:
    """A Text made of strings (plain) and Texts (kept with their style)."""
    from rich.text import Text

    out = Text()
    for p in parts:
        out.append(p if isinstance(p, Text) else str(p))
    return out
