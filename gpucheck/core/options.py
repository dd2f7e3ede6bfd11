"""A check's own options: what a per-check command (`gpucheck burn --size`, `gpucheck eud
--pattern`) or `gpucheck run --option ID:NAME=VALUE` passes to one check, declared by the check.

A check declares its options as a frozen dataclass whose every field is an `option(...)`, and
names the class in its `define(..., options=...)`:

    @dataclass(frozen=True)
    class BurnOptions:
        size: int | None = option("--size", "int", low=16, high=MAX_DIMENSION, help="n of the n x n operands ...")

    size = ctx.options_for(BurnOptions).size  # None: not given, the check's default applies

Every value defaults to None ("not given": the check's level default or its config parameter
applies). The command line builds its options from the declarations (gpucheck.cli.check_options:
the flag, the help, the parsing of each kind); a command gives a check an instance of its class,
so a name that is not declared is a TypeError, as any dataclass makes it. What is not one
check's but the run's (a recorded snapshot, the peer nodes, the Slurm epilog's job start) is in
gpucheck.core.check.RunOptions.

Kinds, and how the command line reads them:
- "int": an integer, within [low, high]: `high` must be given (a count or a size that planning
  and allocation can hold; MAX_DIMENSION for a matrix's side, whose real limit, the memory, is
  judged when the check runs);
- "real": a finite number (never NaN or infinite), within low / high, open where low_open /
  high_open say;
- "choice": one of `choices`;
- "list": a comma list, repeatable (`--dtype bf16 --dtype fp8,fp16`): the texts joined with
  commas, then `parse(text)`;
- "text": one text, `parse(text)` where given (a duration, a level name, a file that must load).
`parse` raises `error` for a bad value: a usage error (exit 2) naming the option, with its message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

Kind = Literal["int", "real", "choice", "list", "text"]
KINDS: tuple[str, ...] = ("int", "real", "choice", "list", "text")

# The highest `high` of a matrix side: far above any GPU's memory (what does not fit is the run's
# `error`), low enough that no size computation overflows a float.
MAX_DIMENSION = 1 << 40

# The dataclass field metadata key that holds a field's Option.
METADATA_KEY = "gpucheck.option"


@dataclass(frozen=True)
class Option:
    """How one option of a check is given on the command line (see the module's docstring)."""

    flag: str  # "--size": its spelling on the per-check command; `--option ID:size=...` drops the dashes
    kind: Kind
    help: str
    metavar: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    parse: Callable[[str], Any] | None = None
    error: type[Exception] = ValueError

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TypeError(f"option {self.flag}: kind {self.kind!r} is none of {', '.join(KINDS)}")
        if not self.flag.startswith("--") or len(self.flag) < 3:
            raise TypeError(f"option flag {self.flag!r} does not start with --")
        if self.kind == "choice" and not self.choices:
            raise TypeError(f"option {self.flag}: a choice needs its choices")
        if self.kind == "int" and self.high is None:
            raise TypeError(f"option {self.flag}: an int needs its high bound")
        if self.kind == "list" and self.parse is None:
            raise TypeError(f"option {self.flag}: a list needs its parse function")

    @property
    def name(self) -> str:
        """The option's name in `gpucheck run --option ID:NAME=VALUE`: its flag without the dashes."""
        return self.flag[2:]


def option(flag: str, kind: Kind = "text", *, help: str, metavar: str | None = None, low: float | None = None,
           high: float | None = None, low_open: bool = False, high_open: bool = False,
           choices: tuple[str, ...] | list[str] = (), parse: Callable[[str], Any] | None = None,
           error: type[Exception] = ValueError) -> Any:
    """A field of a check's options dataclass: default None (not given), declared as `Option`."""
    declared = Option(flag, kind, help, metavar, low, high, low_open, high_open, tuple(choices), parse, error)
    return dataclasses.field(default=None, metadata={METADATA_KEY: declared})


def declared(options_class: type) -> list[tuple[str, Option]]:
    """(field name, Option) of every option `options_class` declares, in its order; TypeError
    when it is not a dataclass of `option(...)` fields, or two fields share a flag."""
    if not (isinstance(options_class, type) and dataclasses.is_dataclass(options_class)):
        raise TypeError(f"check options must be a dataclass of option(...) fields, not {options_class!r}")
    out: list[tuple[str, Option]] = []
    for f in dataclasses.fields(options_class):
        decl = f.metadata.get(METADATA_KEY)
        if not isinstance(decl, Option) or f.default is not None:
            raise TypeError(f"{options_class.__name__}.{f.name} is not declared with option(...)")
        out.append((f.name, decl))
    flags = [d.flag for _, d in out]
    doubled = sorted({f for f in flags if flags.count(f) > 1})
    if doubled:
        raise TypeError(f"{options_class.__name__} declares {', '.join(doubled)} more than once")
    return out


def flag_of(options_class: type, name: str) -> str:
    """The flag of option `name` of `options_class` (`--power-duration`); TypeError when it
    declares no such option."""
    for field_name, decl in declared(options_class):
        if field_name == name:
            return decl.flag
    raise TypeError(f"{options_class.__name__} declares no option {name!r}")

