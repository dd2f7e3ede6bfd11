"""Placeholders (`{host}`, `{nodes}`, ...) in text that a shell will read, substituted safely.

A value is substituted shell-quoted (shlex.quote), in one pass (a value never brings a
placeholder of its own). Quoting is only right where the placeholder stands bare in the shell
text: inside '...' the quotes would be literal characters, inside "..." a quote in the value
would end the string, after a backslash the first quote would be escaped. So a template that
puts a placeholder inside a quoted string or after a backslash is refused (`quoted_placeholder`
names it); hand the value to the inner shell as an argument instead:
`sh -c '... "$1"' sh {nodes}`.

`quoted_placeholder` reads the text as a POSIX shell does for quoting: '...' (no escapes
inside), "..." and bash's $'...' (backslash escapes inside), a backslash escaping the next
character outside quotes.
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable, Mapping


def quoted_placeholder(text: str, names: Iterable[str]) -> str | None:
    """The first placeholder of `names` (e.g. "{host}") that stands inside a quoted string or
    right after a backslash in the shell text `text`; None when all of them stand bare."""
    names = [n for n in names if n]
    quote = ""  # "", "'", '"' or "$'" (bash's ANSI-C quoting: backslash escapes inside)
    escaped = dollar = False  # dollar: the previous character was a bare, unescaped $
    for i, c in enumerate(text):
        if c == "{" and (quote or escaped):
            hit = next((n for n in names if text.startswith(n, i)), None)
            if hit:
                return hit
        was_dollar, dollar = dollar, False
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            escaped = True
        elif quote:
            quote = "" if c == quote[-1] else quote
        elif c in "'\"":
            quote = "$'" if c == "'" and was_dollar else c
        else:
            dollar = c == "$"
    return None


def substitute(text: str, values: Mapping[str, str], *, quote: bool = True) -> str:
    """`text` with every placeholder of `values` replaced by its value (shell-quoted when
    `quote`), in one pass."""
    if not values:
        return text
    pattern = re.compile("|".join(re.escape(k) for k in sorted(values, key=len, reverse=True)))
    return pattern.sub(lambda m: shlex.quote(values[m[0]]) if quote else values[m[0]], text)


def refusal(what: str, template: str, placeholder: str) -> str:
    """The one-line usage error for a placeholder inside a quoted string."""
    return (f"{what} {template!r}: {placeholder} stands inside a quoted string or after a backslash, where "
            f"quoting cannot protect it; put it outside the quotes (e.g. sh -c '... \"$1\"' sh {placeholder})")
