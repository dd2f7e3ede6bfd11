"""Numbers on the command line: the click types of every numeric option, each finite and bounded.

click.FloatRange accepts 'nan' (every comparison with NaN is false, so no bound refuses it) and
'inf': a NaN threshold then makes every test against it false (`busbw < nan` never holds, so no
node is ever slow). FiniteFloat refuses both, with or without bounds. A number of 309 digits or
more is `inf` to float(), and click.IntRange without a maximum takes any integer (`nccl pairs
--rounds 999999999999` planned for ever): Count is an IntRange that must have a maximum, and
every duration (Duration) and byte size (Sizes) is parsed at once, finite and within its bounds.
Every one is a usage error (exit 2) naming the option and the range it allows.
`tests/test_cli_numbers.py` walks every command's options and feeds each one that is numeric
'9'*400, 'inf', 'nan', '-1' and '1e999'.
"""

from __future__ import annotations

import math
from typing import Any

import click

from ..platform.durations import MAX_DURATION_S, parse_duration

# The bounds of the counts: far above any real use, low enough that planning stays quick.
MAX_NODES = 65536  # a node set, a group, nodes at once
MAX_RANKS = 1 << 20  # ranks of one collective
MAX_LOCAL_RANKS = 1024  # ranks (GPUs) on one node, as --workers
MAX_ITERS = 10_000_000  # iterations of one collective measurement (tests keep ranks busy with 10**6)
MAX_PAIR_ROUNDS = 100  # rounds of pairings of `nccl pairs`
MAX_BOOTS = 10_000  # journal boots back (`xid --boot -N`)
MAX_BUSBW_GBS = 100_000.0  # a bus bandwidth floor, GB/s


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses NaN and the infinities."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            within = f" in the range {self._describe_range()}" if self.min is not None or self.max is not None else ""
            self.fail(f"{value!r} is not a finite number{within}.", param, ctx)
        return number


class Count(click.IntRange):
    """click.IntRange with a maximum that must be given: a count that planning can handle."""

    def __init__(self, min: int, max: int) -> None:  # noqa: A002 - click's names
        super().__init__(min=min, max=max)


class Duration(click.ParamType):
    """A duration ('90', '30s', '5m', '1h30m'), checked when the option is parsed (finite, above 0,
    at most MAX_DURATION_S); the value stays the text, which the command parses again."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, (int, float)):
            return value
        try:
            parse_duration(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


class Sizes(click.ParamType):
    """Byte sizes and ranges ('1M,4M', '1M-64M'; gpucheck.nccl.bandwidth.parse_sizes), checked
    when the option is parsed; the value stays the text."""

    name = "sizes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..nccl.bandwidth import parse_sizes

        if value is None:
            return value
        try:
            parse_sizes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


DURATION = Duration()
SIZES = Sizes()
__all__ = ["MAX_BOOTS", "MAX_BUSBW_GBS", "MAX_DURATION_S", "MAX_ITERS", "MAX_LOCAL_RANKS", "MAX_NODES",
           "MAX_PAIR_ROUNDS", "MAX_RANKS", "Count", "DURATION", "Duration", "FiniteFloat", "SIZES", "Sizes"]
