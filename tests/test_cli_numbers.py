"""Every numeric option of every command is finite and bounded (issue 26: a number of 309 digits
or more is `inf` to float(): `sweep --timeout 999...9` was an OverflowError, exit 3; --duration,
--timeout, --sizes, --nproc-per-node, --test-timeout and others took it; `nccl pairs --rounds
999999999999` planned for ever).

The options are found by walking the click commands, not listed by hand: a new numeric option
is in this test the day it is added. Numeric: an int or float type (click.IntRange, FiniteFloat,
...), a duration (gpucheck.cli.numbers.Duration) or byte sizes (Sizes); a count without a
maximum, or a plain int or float, is refused outright. Each gets '9'*400, 'inf', 'nan', '-1' and
'1e999': a usage error (exit 2), before anything runs, naming the option and what it allows."""

from __future__ import annotations

import click
import pytest

from gpucheck.cli.main import cli, main

from cli_commands import leaf_commands
from gpucheck.cli.numbers import Duration, Sizes

BAD_VALUES = ("9" * 400, "inf", "nan", "-1", "1e999")
HOOKS = ("prolog", "epilog")  # docs/exit-codes.md: their usage errors exit 0 (on-error pass), or 42
NEGATIVE_ALLOWED = {("xid", "--boot")}  # journal boots back: -1 is the previous boot


def _is_numeric(param: click.Parameter) -> bool:
    return isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType, Duration, Sizes))


NUMERIC = [(path, param.opts[0]) for path, command in leaf_commands(cli) for param in command.params
           if isinstance(param, click.Option) and _is_numeric(param)]


def test_the_walk_finds_the_options_of_issue_26():
    found = {(" ".join(path), flag) for path, flag in NUMERIC}
    for case in [("sweep", "--timeout"), ("burn", "--duration"), ("bisect", "--test-timeout"),
                 ("nccl pairs", "--sizes"), ("nccl pairs", "--nproc-per-node"), ("nccl pairs", "--rounds"),
                 ("run", "--timeout"), ("hang", "--dump-timeout"), ("slurm prolog", "--budget"),
                 ("eud", "--power-duration"), ("poet", "--rows"), ("telemetry dump", "--timeout")]:
        assert case in found, case
    assert len(found) >= 60


@pytest.mark.parametrize("path, flag", NUMERIC, ids=[f"{' '.join(p)} {f}" for p, f in NUMERIC])
def test_every_numeric_option_has_bounds(path, flag):
    """A count's maximum is what keeps planning finite; a float's, what keeps it comparable."""
    command = dict(leaf_commands(cli))[path]
    param = next(p for p in command.params if p.opts[0] == flag)
    if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
        assert isinstance(param.type, click.types._NumberRangeBase), f"{flag}: a plain {param.type.name}"
        assert param.type.max is not None, f"{flag}: no maximum"


@pytest.mark.parametrize("path, flag", NUMERIC, ids=[f"{' '.join(p)} {f}" for p, f in NUMERIC])
def test_every_numeric_option_refuses_what_is_not_a_finite_number_in_range(path, flag, capsys):
    for value in BAD_VALUES:
        if value == "-1" and (" ".join(path), flag) in NEGATIVE_ALLOWED:
            continue
        rc = main([*path, flag, value])
        err = capsys.readouterr().err
        if path[0] == "slurm" and path[1] in HOOKS:  # a hook's usage error is "could not judge"
            assert rc == 0 and "could not judge: usage error" in err, (path, flag, value[:20], err[-500:])
        else:
            assert rc == 2, (path, flag, value[:20], err[-500:])
        assert flag in err and len(err.strip().splitlines()) == 1, err[-500:]
        assert "range" in err or "want" in err or "is not a valid" in err or "must be" in err, err


@pytest.mark.parametrize("spec", ["burn.gemm:size={}", "burn.gemm:duration={}", "poet.ortho:rows={}",
                                  "eud.power:power-duration={}", "eud.power:power-size={}"])
def test_a_checks_option_given_to_run_is_bounded_as_well(spec, capsys):
    for value in BAD_VALUES:
        rc = main(["run", "--option", spec.format(value)])
        err = capsys.readouterr().err
        assert rc == 2, (spec, value[:20], err[-500:])


def test_the_bounds_hold_what_is_real():
    """The bounds refuse nothing a site uses."""
    for argv in (["sweep", "n1", "--timeout", "6h", "--fanout", "4096", "--help"],
                 ["nccl", "pairs", "n[1-4]", "--rounds", "100", "--sizes", "1K-16G", "--help"],
                 ["xid", "--boot", "-1", "--help"]):
        assert main(argv) == 0
