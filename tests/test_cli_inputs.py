"""Numbers on the command line: every float option refuses NaN and the infinities (one click type,
gpucheck.cli.numbers.FiniteFloat), --inject values too, and --workers is bounded when parsed."""

from __future__ import annotations

import importlib

import click
import pytest

from gpucheck import app
from gpucheck.cli.main import main
from gpucheck.core.inject import InjectionError, parse_injection


def _command(target: str) -> click.Command:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _float_options() -> list[tuple[str, str]]:
    """(command target, option) of every float option of every subcommand."""
    from gpucheck.cli.main import SUBCOMMANDS

    found = []
    seen: set[int] = set()

    def walk(target: str, cmd: click.Command) -> None:
        if id(cmd) in seen:
            return
        seen.add(id(cmd))
        for sub in getattr(cmd, "commands", {}).values():
            walk(f"{target}/{sub.name}", sub)
        for p in cmd.params:
            if isinstance(p.type, (click.types.FloatParamType,)):
                found.append((target, p.opts[-1], cmd))

    for name, target in sorted(SUBCOMMANDS.items()):
        walk(name, _command(target))
    return found


FLOAT_OPTIONS = _float_options()


def test_every_float_option_is_a_finite_float():
    from gpucheck.cli.numbers import FiniteFloat

    assert len(FLOAT_OPTIONS) >= 9  # sweep, bisect, nccl pairs, eud, telemetry dump ...
    plain = [f"{t} {o}" for t, o, cmd in FLOAT_OPTIONS
             if not isinstance(next(p for p in cmd.params if p.opts[-1] == o).type, FiniteFloat)]
    assert plain == []


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("target, option, cmd", FLOAT_OPTIONS, ids=[f"{t}{o}" for t, o, _ in FLOAT_OPTIONS])
def test_a_float_option_refuses_what_is_not_a_finite_number(target, option, cmd, value):
    param = next(p for p in cmd.params if p.opts[-1] == option)
    with pytest.raises(click.BadParameter, match="not a finite number|not in the range"):
        param.type.convert(value, param, None)


def test_a_nan_threshold_is_one_usage_line_naming_the_option(capsys):
    assert main(["nccl", "pairs", "n[1-4]", "--min-busbw", "nan"]) == 2
    err = capsys.readouterr().err
    assert err == "gpucheck nccl pairs: error: Invalid value for '--min-busbw': 'nan' is not a finite number in the range 0.0<x<=100000.0.\n"


@pytest.mark.parametrize("spec", ["slow:gpu=1,factor=nan", "slow:gpu=1,factor=inf", "hang:after=-inf",
                                  "slow:factor=1e999", "slow:factor=" + "9" * 5000])
def test_an_injection_value_that_is_not_a_finite_number_is_refused(spec):
    with pytest.raises(InjectionError, match="not a finite number"):
        parse_injection(spec)


def test_injection_values_that_are_numbers_or_words_still_parse():
    inj = parse_injection("slow:gpu=1,factor=0.5,reason=hw_slowdown,name=nanny")
    assert inj.params == {"gpu": 1, "factor": 0.5, "reason": "hw_slowdown", "name": "nanny"}


@pytest.mark.parametrize("argv", [["run"], ["burn"], ["repro", "check"], ["repro", "record"], ["eud"]])
def test_a_worker_count_past_the_limit_is_a_usage_error_when_parsed(argv, capsys):
    assert main([*argv, "--device", "cpu", "--workers", str(app.MAX_WORKERS + 1)]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err and f"1<=x<={app.MAX_WORKERS}" in err


def test_the_run_pipeline_bounds_workers_itself():
    """Callers in-process (the Slurm hooks build a RunRequest) get the same bound: nothing is
    started for a worker count past it."""
    with pytest.raises(app.UsageError, match=f"--workers must be between 1 and {app.MAX_WORKERS}"):
        app.prepare(app.RunRequest(device="cpu", workers=app.MAX_WORKERS + 1, check_patterns=["repro.bitwise"],
                                   history=False))
