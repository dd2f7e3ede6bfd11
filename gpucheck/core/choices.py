"""Comma lists of names from the command line or a config (`--dtype bf16,fp16`, `--pattern all`):
one parser for every such option, so that they all accept and refuse the same things."""

from __future__ import annotations

from typing import Iterable


def parse_choices(
    value: str | Iterable[object],
    choices: Iterable[str],
    *,
    what: str,
    error: type[ValueError] = ValueError,
    aliases: dict[str, str] | None = None,
    dash_underscore: bool = False,
    allow_all: bool = False,
) -> list[str]:
    """'a,b' or ['a', 'b,c'] -> canonical names in the order given, without repeats.

    Names are matched case-insensitively, through `aliases`; with `dash_underscore`, `_` and `-`
    are the same; with `allow_all`, 'all' stands for every choice. An unknown name or an empty list
    raises `error` naming the choices."""
    allowed = list(choices)
    items = [part for v in ([value] if isinstance(value, str) else value) for part in str(v).split(",")]
    listing = ", ".join(allowed) + (", or all" if allow_all else "")
    out: list[str] = []
    for raw in items:
        name = raw.strip().lower()
        if dash_underscore:
            name = name.replace("_", "-")
        if not name:
            continue
        if allow_all and name == "all":
            out.extend(n for n in allowed if n not in out)
            continue
        name = (aliases or {}).get(name, name)
        if name not in allowed:
            raise error(f"unknown {what} {raw.strip()!r} (use {listing})")
        if name not in out:
            out.append(name)
    if not out:
        raise error(f"no {what} given (use {listing})")
    return out
