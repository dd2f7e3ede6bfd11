"""Numbers on the command line: one click type for every float option.

click.FloatRange accepts 'nan' (every comparison with NaN is false, so no bound refuses it) and
'inf': a NaN threshold then makes every test against it false (`busbw < nan` never holds, so no
node is ever slow). FiniteFloat refuses both, with or without bounds: a usage error (exit 2)
naming the option.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses NaN and the infinities."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number
