"""A check's own options (gpucheck.core.options): declared by the check, typed in the context,
built into its command's flags and into `gpucheck run --option`, parsed and refused as the flags
always were; what is not declared is a programming error (TypeError)."""

from __future__ import annotations

import dataclasses

import click
import pytest

from gpucheck.cli.burn import burn_command
from gpucheck.cli.check_options import check_options
from gpucheck.cli.eud import eud_command
from gpucheck.cli.main import main
from gpucheck.cli.poet import poet_command
from gpucheck.cli.repro import check_command as repro_check_command, record_command
from gpucheck.core.check import Context, RunOptions, define
from gpucheck.core.levels import Level
from gpucheck.core.options import Option, declared, flag_of, option
from gpucheck.tests_suite import registry
from gpucheck.tests_suite.burn_gemm import BurnOptions, burn_gemm
from gpucheck.tests_suite.eud_memtest import MemtestOptions
from gpucheck.tests_suite.eud_power import PowerOptions
from gpucheck.tests_suite.repro_bitwise import ReproOptions


def _flags(command: click.Command) -> list[str]:
    return [o for p in command.params for o in p.opts if o.startswith("--")]


# -- every per-check command shows every option its checks declare, once --------------------------

@pytest.mark.parametrize("command, check_ids", [
    (burn_command, ["burn.gemm"]),
    (poet_command, ["poet.ortho"]),
    (eud_command, ["eud.memtest", "eud.bandwidth", "eud.power", "eud.dcgm"]),
    (repro_check_command, ["repro.bitwise"]),
])
def test_a_command_takes_its_checks_options_from_their_declarations(command, check_ids):
    flags = _flags(command)
    assert len(flags) == len(set(flags)), flags
    for cid in check_ids:
        check = registry.find(cid)
        assert check is not None
        for _, decl in declared(check.spec.options) if check.spec.options else ():
            (param,) = [p for p in command.params if decl.flag in p.opts]
            assert param.help == decl.help


def test_repro_record_takes_only_the_workloads():
    assert "--workload" in _flags(record_command) and "--reference" not in _flags(record_command)


def test_an_option_added_to_a_check_reaches_its_command_with_no_other_edit():
    """The command builds its flags from the check's class: one more field is one more flag."""

    @dataclasses.dataclass(frozen=True)
    class More:
        size: int | None = option("--size", "int", low=16, high=1024, help="n")
        shape: str | None = option("--shape", "choice", choices=("square", "tall"), help="operand shape")

    check = define("t.more", title="t", level=1, detects="t", options=More)(lambda ctx: [])
    seen = []

    @click.command()
    @check_options(check)
    def command():
        from gpucheck.cli.check_options import chosen_options

        seen.append(chosen_options())

    assert _flags(command) == ["--size", "--shape"]
    assert command.main(["--shape", "tall", "--size", "32"], standalone_mode=False) is None
    assert seen == [(More(size=32, shape="tall"),)]
    with pytest.raises(click.BadParameter, match="'round' is not one of"):
        command.main(["--shape", "round"], standalone_mode=False)


def test_two_checks_of_one_command_may_not_share_a_flag():
    @dataclasses.dataclass(frozen=True)
    class Same:
        size: int | None = option("--size", "int", high=1024, help="n")

    other = define("t.other", title="t", level=1, detects="t", options=Same)(lambda ctx: [])
    with pytest.raises(TypeError, match="--size"):
        check_options(burn_gemm, other)
    with pytest.raises(TypeError, match="no option sise"):
        check_options(burn_gemm, only=("sise",))  # a misspelt field would silently drop the flag


# -- declarations ----------------------------------------------------------------------------------

def test_what_is_not_an_options_dataclass_is_a_programming_error():
    @dataclasses.dataclass(frozen=True)
    class Plain:
        size: int | None = None  # no option(...): no flag, no help

    @dataclasses.dataclass(frozen=True)
    class Twice:
        a: int | None = option("--n", "int", high=9, help="a")
        b: int | None = option("--n", "int", high=9, help="b")

    for bad in (dict, Plain, Twice, {"size": 1}):
        with pytest.raises(TypeError):
            define("t.bad", title="t", level=1, options=bad)
    with pytest.raises(TypeError):
        Option("size", "int", help="no dashes", high=9)
    with pytest.raises(TypeError, match="high bound"):
        Option("--size", "int", help="a count without a maximum")  # issue 26: 10**400 was taken
    with pytest.raises(TypeError):
        Option("--n", "number", help="no such kind")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Option("--l", "list", help="a list needs its parse function")
    with pytest.raises(TypeError, match="no option 'nosuch'"):
        flag_of(BurnOptions, "nosuch")
    assert flag_of(PowerOptions, "duration_s") == "--power-duration"


def test_the_context_holds_typed_options_and_refuses_anything_else():
    assert Context().options_for(BurnOptions) == BurnOptions()  # nothing given: every option None
    ctx = Context(level=Level.STANDARD, check_options=[BurnOptions(size=64), MemtestOptions(fraction=0.5)])
    assert ctx.options_for(BurnOptions).size == 64 and ctx.options_for(MemtestOptions).fraction == 0.5
    assert ctx.options_for(ReproOptions) == ReproOptions()
    with pytest.raises(TypeError):
        BurnOptions(nosuch=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Context(check_options=[{"size": 64}])
    with pytest.raises(TypeError, match="given twice"):
        Context(check_options=[BurnOptions(size=64), BurnOptions(size=32)])
    with pytest.raises(TypeError):
        ctx.options_for(dict)
    # a check's option is not the run's any more: the error says where it went
    with pytest.raises(TypeError, match="check_options"):
        Context(options={"duration_s": 5.0})
    assert [f.name for f in dataclasses.fields(RunOptions)] == ["snapshot_path", "xid_since", "peers"]


# -- parsing: the flags and --option refuse what the flags always refused ---------------------------

@pytest.mark.parametrize("argv, words", [
    (["eud", "--memtest-fraction", "nan"], "not a finite number"),
    (["eud", "--memtest-fraction", "inf"], "--memtest-fraction"),
    (["eud", "--power-size", "8"], "--power-size"),
    (["burn", "--size", "8"], "--size"),
    (["burn", "--dtype", "bf17"], "--dtype"),
    (["poet", "--backend", "numba"], "--backend"),
    (["repro", "check", "--workload", "nosuch"], "unknown workload 'nosuch'"),
    (["run", "--option", "eud.memtest:memtest-fraction=nan"], "not a finite number"),
    (["run", "--option", "eud.power:power-duration=0"], "duration must be positive"),
    (["run", "--option", "nosuch.check:size=1"], "unknown check id 'nosuch.check'"),
    (["run", "--option", "burn.gemm:size"], "is not ID:NAME=VALUE"),
])
def test_a_bad_value_is_one_line_and_exit_2(argv, words, capsys, tmp_path):
    rc = main([*argv, "--device", "cpu", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and words in err, err


def test_option_gives_run_what_the_per_check_flags_give(monkeypatch, tmp_path):
    """`gpucheck run --option` and `gpucheck eud` build the same typed options; a list option
    given twice is one list, any other takes the last value, as with the flags."""
    from gpucheck import app
    from gpucheck.cli import run

    seen = []
    monkeypatch.setattr(app, "execute", lambda req, **kw: seen.append(req) or 0)
    monkeypatch.setattr(run, "execute", lambda req, **kw: seen.append(req) or 0)
    common = ["--device", "cpu", "--state-dir", str(tmp_path)]
    assert main(["eud", *common, "--pattern", "zeros", "--pattern", "ones", "--power-size", "64",
                 "--power-duration", "1m", "--power-duration", "2m"]) == 0
    assert main(["run", *common, "--option", "eud.memtest:pattern=zeros", "--option", "eud.memtest:pattern=ones",
                 "--option", "eud.power:power-size=64", "--option", "eud.power:power-duration=1m",
                 "--option", "eud.power:--power-duration=2m"]) == 0
    eud_req, run_req = seen
    expected = [MemtestOptions(patterns=["zeros", "ones"]), PowerOptions(duration_s=120.0, size=64)]
    assert list(eud_req.check_options) == expected and list(run_req.check_options) == expected
    assert run_req.check_patterns == [] and run_req.options == {}


def test_the_power_size_reaches_the_gemm_load(monkeypatch):
    """`--power-size` (PowerOptions.size) is the n of eud.power's GEMMs, over the cpu_size parameter."""
    from gpucheck.platform.telemetry.fake import FakeTelemetry
    from gpucheck.tests_suite import eud_power

    sizes = []

    def started(ctx, check_id, worker, targets, **kw):
        sizes.append(kw["make_args"](0)["size"])
        raise RuntimeError("no worker started")

    monkeypatch.setattr(eud_power, "run_per_gpu", started)
    for given, size in ((PowerOptions(size=48), 48), (PowerOptions(), eud_power.DEFAULTS["cpu_size"])):
        ctx = Context(level=Level.EXTENDED, device="cpu", workers=1, check_options=[given],
                      telemetry=FakeTelemetry(samples=lambda gpu: {"temperature_c": 40}))
        with pytest.raises(RuntimeError, match="no worker started"):
            eud_power.power_check.run(ctx)
        assert sizes.pop() == size
