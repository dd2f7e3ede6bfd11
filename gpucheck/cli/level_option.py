"""`--level` on every command: 1-4 or quick|standard|extended|burn-in, checked when the option is
parsed, so that a level no node knows is a usage error (exit 2) before anything runs (issue 26:
`sweep --level 9` ran on every node, each refused it, and the sweep blamed them all)."""

from __future__ import annotations

from typing import Any

import click

from ..core.levels import Level


class LevelText(click.ParamType):
    """A level as gpucheck.core.levels.Level.parse reads it; the value stays the text given (a
    sweep passes it on to the nodes as it was written)."""

    name = "level"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, Level):
            return value
        try:
            Level.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


LEVEL = LevelText()
