"""`gpucheck list`: the checks as a table, and `list --defaults`: every check's keys at their
defaults as a TOML document that `--config` accepts (issue 26: it printed Python values, `True`
and `['gemm.bf16']`, which no TOML reader takes).

The document is `[checks."<id>"]` tables of `key = value` lines, each with its allowed range as a
comment, and the check's level, needs, budget, what it detects and its own options as comments
above its table: `gpucheck list --defaults > config.toml` is a complete config file, and so is any
part of it an operator keeps.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence, TypedDict

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class ListedCheck(TypedDict):
    """One check as `gpucheck list` shows it (its JSON form, `list --json`)."""

    id: str
    level: int
    level_name: str
    needs: list[str]
    budget_s: float
    title: str
    detects: str
    defaults: dict[str, Any]
    ranges: dict[str, str]
    injects: list[str]
    options: dict[str, str]


def toml_key(key: str) -> str:
    """A TOML key: bare when it may be, else a quoted string."""
    return key if _BARE_KEY.fullmatch(key) else toml_value(key)


def toml_value(value: Any) -> str:
    """`value` (bool, int, float, str, or a list of them) as TOML. Raises ValueError for what TOML
    cannot hold (None, NaN, infinity, a table): a default must be one a config file can set."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no TOML form a config accepts")
        return repr(value)
    if isinstance(value, str):
        # JSON's string escapes are TOML's (\\, \", \n, \uXXXX); a character outside the BMP is
        # written as itself (JSON would write a surrogate pair, which TOML refuses).
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise ValueError(f"{type(value).__name__} {value!r} has no TOML form")


def _comment(text: str) -> str:
    """`text` as one comment line (a newline in it would end the comment)."""
    return "# " + " ".join(str(text).split())


def defaults_toml(rows: Sequence[ListedCheck]) -> str:
    """The TOML document of `list --defaults` (module docstring)."""
    out = [_comment("gpucheck list --defaults: every check's keys at their defaults, as TOML that --config accepts"),
           _comment("(docs/config.md). Keep the keys you change; a check without keys has no table.")]
    for r in rows:
        out.append("")
        out.append(_comment(f"{r['id']}: level {r['level']} {r['level_name']}, needs {', '.join(r['needs']) or '-'}, "
                            f"budget {r['budget_s']:g} s"))
        out.append(_comment(r["detects"] or r["title"]))
        if r["options"]:
            out.append(_comment(f"options (--option {r['id']}:NAME=VALUE): {', '.join(r['options'])}"))
        if r["defaults"]:
            out.append(f"[checks.{toml_key(r['id'])}]")
            out += [f"{toml_key(k)} = {toml_value(v)}  {_comment(r['ranges'][k])}" for k, v in r["defaults"].items()]
    return "\n".join(out) + "\n"


def check_table(rows: Sequence[ListedCheck]) -> Any:
    """`gpucheck list`: one row per check (id, level, needs, budget, what it detects)."""
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("id", "level", "needs", "budget", "detects"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["id"], f"{r['level']} {r['level_name']}", ", ".join(r["needs"]) or "-",
                      f"{r['budget_s']:g} s", r["detects"] or r["title"])
    return table

