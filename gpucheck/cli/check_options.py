"""The checks' own options on the command line, built from their declarations
(gpucheck.core.options): the flags of a per-check command (`gpucheck burn --size`, `gpucheck eud
--pattern`) and `gpucheck run --option ID:NAME=VALUE`, parsed the same way.

    @click.command("burn")
    @check_options(burn_gemm)          # --duration, --dtype, --size, as burn.gemm declares them
    @common_run_options
    def burn_command(**kw):
        options = chosen_options()     # what was given: (BurnOptions(size=64),) or ()

Each kind becomes the click type or callback that parses it: "int" click.IntRange, "real"
FiniteFloat (never NaN or infinite), "choice" click.Choice, "list" a repeatable comma list,
"text" one value; `parse` errors are usage errors naming the option (exit 2).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import click

from ..core.check import Check
from ..core.options import Option, declared
from ..platform.durations import parse_duration
from .numbers import DURATION, FiniteFloat

# click.Context.meta key: options class -> {field name: value} of what the command line gave.
_META_KEY = "gpucheck.check_options"


def _parsing(decl: Option) -> Callable[[Any], Any]:
    """What turns the command line's value (after click's type) into the option's value; None is
    "not given", and so is a list option not given or one that parses to no items."""

    def parse(value: Any) -> Any:
        if value is None or value == ():
            return None
        if decl.parse is None:
            return value
        text = ",".join(value) if decl.kind == "list" else value
        try:
            parsed = decl.parse(text)
        except decl.error as e:
            raise click.BadParameter(str(e)) from None
        return None if parsed in ([], ()) else parsed

    return parse


def _click_args(field: str, decl: Option, options_class: type) -> tuple[list[str], dict[str, Any]]:
    """The declarations and attributes of the click option of one declared option: its value goes
    to the click context's meta, under its class and field, when given."""
    parse = _parsing(decl)

    def store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        parsed = parse(value)
        if parsed is not None:
            ctx.meta.setdefault(_META_KEY, {}).setdefault(options_class, {})[field] = parsed

    attrs: dict[str, Any] = {"default": None, "help": decl.help, "metavar": decl.metavar, "callback": store,
                             "expose_value": False}
    if decl.kind == "int":
        attrs["type"] = click.IntRange(min=_int(decl.low), max=_int(decl.high))
    elif decl.kind == "real":
        attrs["type"] = FiniteFloat(min=decl.low, max=decl.high, min_open=decl.low_open, max_open=decl.high_open)
    elif decl.kind == "choice":
        attrs["type"] = click.Choice(list(decl.choices))
    elif decl.kind == "list":
        attrs["multiple"] = True
    elif decl.parse is parse_duration:
        attrs["type"] = DURATION  # checked as any duration option: finite, within its range
    return [decl.flag, f"{options_class.__name__}_{field}"], attrs


def _int(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


def check_options(*checks: Check, only: Iterable[str] | None = None, exclude: Iterable[str] = ()):
    """Decorator: the options `checks` declare, in their order (`only` / `exclude`: field names),
    as options of a command; chosen_options() returns what was given. TypeError when two of them
    share a flag, or `only` / `exclude` names a field none of them declares."""
    wanted = None if only is None else set(only)
    unwanted = set(exclude)
    options: list[tuple[list[str], dict[str, Any]]] = []
    fields: set[str] = set()
    for check in checks:
        options_class = check.spec.options
        if options_class is None:
            continue
        for field, decl in declared(options_class):
            fields.add(field)
            if (wanted is None or field in wanted) and field not in unwanted:
                options.append(_click_args(field, decl, options_class))
    unknown = sorted(((wanted or set()) | unwanted) - fields)
    if unknown:
        raise TypeError(f"{', '.join(c.id for c in checks)} declare(s) no option {', '.join(unknown)}")
    flags = [decls[0] for decls, _ in options]
    doubled = sorted({f for f in flags if flags.count(f) > 1})
    if doubled:
        raise TypeError(f"options {', '.join(doubled)} declared by more than one of "
                        f"{', '.join(c.id for c in checks)}")

    def decorate(f):
        for decls, attrs in reversed(options):
            f = click.option(*decls, **attrs)(f)
        return f

    return decorate


def chosen_options(ctx: click.Context | None = None) -> tuple[Any, ...]:
    """The checks' options given on this command line: one instance of each options class given."""
    ctx = ctx or click.get_current_context()
    given = ctx.meta.get(_META_KEY, {})
    return tuple(cls(**values) for cls, values in given.items())


def chosen(options_class: type, ctx: click.Context | None = None) -> Any:
    """The options of `options_class` given on this command line (the class's defaults: none)."""
    ctx = ctx or click.get_current_context()
    return options_class(**ctx.meta.get(_META_KEY, {}).get(options_class, {}))


def options_from_text(texts: Iterable[str], find: Callable[[str], Check | None],
                      ctx: click.Context | None = None) -> tuple[Any, ...]:
    """`--option ID:NAME=VALUE` (repeatable; NAME is the option's flag without the dashes) ->
    the checks' options, parsed as their own flags parse them (a list option given twice is one
    list, any other the last value). `find(check id)` -> the check, None when there is none.
    A usage error (click.BadParameter naming --option) for what cannot be given."""
    ctx = ctx or click.get_current_context()
    targets: dict[tuple[str, str], tuple[Check, list[str]]] = {}  # (check id, field) -> the check, its texts
    for text in texts:
        check, field = _target(text, find)
        targets.setdefault((check.id, field), (check, []))[1].append(text.partition("=")[2])
    for (_, field), (check, given) in targets.items():
        assert check.spec.options is not None
        decl = dict(declared(check.spec.options))[field]
        decls, attrs = _click_args(field, decl, check.spec.options)
        try:
            click.Option(decls, **attrs).process_value(ctx, tuple(given) if decl.kind == "list" else given[-1])
        except click.BadParameter as e:
            raise click.BadParameter(f"{check.id}:{decl.name}: {e.message}", param_hint="--option") from None
    return chosen_options(ctx)


def _target(text: str, find: Callable[[str], Check | None]) -> tuple[Check, str]:
    """The check and the field an `--option ID:NAME=VALUE` names; BadParameter otherwise."""
    target, eq, _ = text.partition("=")
    check_id, colon, name = target.partition(":")
    if not (eq and colon and check_id.strip() and name.strip()):
        raise click.BadParameter(f"{text!r} is not ID:NAME=VALUE (e.g. burn.gemm:duration=5m)",
                                 param_hint="--option")
    check = find(check_id.strip())
    if check is None:
        raise click.BadParameter(f"unknown check id {check_id.strip()!r}", param_hint="--option")
    names = {decl.name: field for field, decl in declared(check.spec.options)} if check.spec.options else {}
    field = names.get(name.strip().removeprefix("--"))
    if field is None:
        have = ", ".join(sorted(names)) or "none"
        raise click.BadParameter(f"{check.id} has no option {name.strip()!r} (its options: {have})",
                                 param_hint="--option")
    return check, field
