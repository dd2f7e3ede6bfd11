"""docs/checks.md's example check is a working check: the very code block of the doc is imported
and run through the registry, the runner and the run pipeline, on recorded snapshots; and the
doc's way to add it (the file in gpucheck/tests_suite/ and one line in the registry's TABLE) is
all that `gpucheck list` and `gpucheck run` need."""

from __future__ import annotations

import ast
import copy
import json
import re
import sys
from pathlib import Path

import pytest

from gpucheck import app
from gpucheck.tests_suite import registry
from gpucheck.core.check import Context, Need
from gpucheck.core.levels import Level
from gpucheck.core.config import load_config
from gpucheck.core.options import declared
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.platform.telemetry.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "checks.md"
HEALTHY = ROOT / "tests" / "fixtures" / "snapshots" / "h100-healthy.json"
MODULE = "gpucheck_doc_example_check"


def example_source() -> str:
    """The first python block after the doc's "## The example" heading."""
    text = DOC.read_text()
    section = text[text.index("## The example"):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "docs/checks.md has no python block under '## The example'"
    return m.group(1)


def table_line() -> tuple[str, int]:
    """The line the doc adds to the registry's TABLE (the python block after the example): the
    module's name and its level."""
    text = DOC.read_text()
    section = text[text.index("## The example"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2, "docs/checks.md shows no TABLE line after the example"
    ((name, level),) = ast.literal_eval("{" + blocks[1].strip() + "}").items()
    return name, level


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The doc's example as an importable module; the check it registers."""
    (tmp_path / f"{MODULE}.py").write_text(example_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    (check,) = registry.all_checks(modules=(MODULE,))
    return check


def _gpu(snapshot, index):
    return next(g for g in snapshot["gpus"] if g["index"] == index)


def test_the_example_is_about_thirty_lines():
    code = [ln for ln in example_source().splitlines() if ln.strip()]
    assert len(code) <= 35, len(code)


def test_the_example_registers_a_level_1_nvml_check(example):
    assert example.id == "example.temperature"
    assert example.spec.level is Level.QUICK and example.spec.needs == (Need.NVML,)
    assert example.spec.defaults == {"warn_c": 85, "fail_c": 95}
    assert not example.spec.is_compute
    assert [(d.name, d.kind) for _, d in declared(example.spec.options)] == [("fail-above", "real")]


def test_the_examples_option_wins_over_its_config_for_the_run(example, tmp_path):
    """The option the example declares reaches its judge, typed, and for this run wins over the
    config's fail_c; not given, the config's limits judge as before."""
    snap = copy.deepcopy(load_snapshot(HEALTHY))
    _gpu(snap, 2)["temperature"]["gpu_c"] = 90  # over warn_c 85, under fail_c 95
    cfg = tmp_path / "config.toml"
    cfg.write_text('[checks."example.temperature"]\nfail_c = 99\n')
    config = load_config(str(cfg))

    def status_of_gpu2(**given):
        ctx = Context(level=Level.QUICK, snapshot=snap, config=config,
                      check_options=[example.spec.options(**given)] if given else [])
        return {r.gpu: r for r in run_checks([example], ctx, install_signal_handlers=False).results}[2]

    assert status_of_gpu2().status is Status.WARN
    hot = status_of_gpu2(fail_above=88.0)
    assert hot.status is Status.FAIL and ("temperature_c", ">", 88.0, Status.FAIL) in [
        (t.metric, t.op, t.limit, t.status) for t in hot.thresholds]
    with pytest.raises(TypeError):
        example.spec.options(fail_c=88.0)  # not an option it declares


def test_the_example_judges_every_case_through_the_runner(example):
    snap = copy.deepcopy(load_snapshot(HEALTHY))
    _gpu(snap, 1)["temperature"]["gpu_c"] = 90  # warn
    _gpu(snap, 2)["temperature"]["gpu_c"] = 99  # fail
    lost = _gpu(snap, 3)
    lost["state"], lost["error"] = "lost", {"kind": "gpu_lost", "message": "GPU is lost"}
    _gpu(snap, 4)["temperature"]["gpu_c"] = None  # not reported: a skip that says why
    unreadable = _gpu(snap, 5)
    unreadable["temperature"]["gpu_c"] = None
    unreadable["errors"] = {"temperature.gpu_c": "unknown"}  # could not be read: never a pass
    _gpu(snap, 6)["temperature"]["gpu_c"] = "hot"  # garbage: never a pass

    out = run_checks([example], Context(level=Level.QUICK, snapshot=snap), install_signal_handlers=False)
    by = {r.gpu: r for r in out.results}
    assert [r.gpu for r in out.results] == sorted(by)
    assert by[0].status is Status.PASS and by[0].summary == f"GPU 0: {_gpu(snap, 0)['temperature']['gpu_c']} C"
    assert by[1].status is Status.WARN and by[1].action is Action.INVESTIGATE
    assert by[2].status is Status.FAIL and "runs hot (99 C)" in by[2].summary
    assert [(t.metric, t.op, t.limit, t.status) for t in by[2].thresholds] == [
        ("temperature_c", ">", 95, Status.FAIL), ("temperature_c", ">", 85, Status.WARN)]
    assert by[3].status is Status.FAIL and "lost" in by[3].summary.lower()
    assert by[4].status is Status.SKIP and "no temperature reported" in by[4].summary
    assert by[5].status is Status.ERROR and "temperature.gpu_c" in by[5].summary
    assert by[6].status is Status.ERROR and "temperature.gpu_c" in by[6].summary
    assert by[7].status is Status.PASS


def test_the_examples_limits_come_from_the_config(example, tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[checks."example.temperature"]\nwarn_c = 20\n')
    config = load_config(str(cfg))
    config.validate_checks([example.spec])
    out = run_checks([example], Context(level=Level.QUICK, snapshot=load_snapshot(HEALTHY), config=config),
                     install_signal_handlers=False)
    assert {r.status for r in out.results} == {Status.WARN}


def test_the_example_runs_in_the_pipeline_with_its_verdict_and_exit_code(example, monkeypatch, capsys, tmp_path):
    from gpucheck.cli.main import main

    real = registry.all_checks
    monkeypatch.setattr(app, "all_checks",
                        lambda max_level=None: real((*registry.CHECK_MODULES, MODULE), max_level=max_level))
    snap = copy.deepcopy(load_snapshot(HEALTHY))
    _gpu(snap, 2)["temperature"]["gpu_c"] = 99
    snap_file = tmp_path / "hot.json"
    snap_file.write_text(json.dumps(snap))
    rc = main(["run", "--snapshot", str(snap_file), "--check", "example.temperature", "--json", "--no-history"])
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 1 and verdict["exit_code"] == 1 and verdict["status"] == "fail"
    assert [(r["subject"], r["status"]) for r in verdict["results"] if r["status"] != "pass"] == [("gpu2", "fail")]


def test_one_file_and_one_line_add_the_check_to_gpucheck(tmp_path, monkeypatch, capsys):
    """The file saved in gpucheck/tests_suite/ (here: a folder added to that package's path) and
    the doc's line in TABLE: `gpucheck list` lists the check, `gpucheck run` judges with it."""
    from gpucheck import tests_suite
    from gpucheck.cli.main import main

    name, level = table_line()
    assert name == "example_temperature" and level == 1
    (tmp_path / f"{name}.py").write_text(example_source())
    monkeypatch.setattr(tests_suite, "__path__", [*tests_suite.__path__, str(tmp_path)])
    monkeypatch.setitem(registry.TABLE, name, level)
    monkeypatch.delitem(sys.modules, f"gpucheck.tests_suite.{name}", raising=False)
    try:
        assert main(["list", "--json"]) == 0
        assert "example.temperature" in [c["id"] for c in json.loads(capsys.readouterr().out)]
        snap = copy.deepcopy(load_snapshot(HEALTHY))
        _gpu(snap, 2)["temperature"]["gpu_c"] = 99
        snap_file = tmp_path / "hot.json"
        snap_file.write_text(json.dumps(snap))
        rc = main(["run", "--snapshot", str(snap_file), "--json", "--no-history"])
        verdict = json.loads(capsys.readouterr().out)
    finally:
        sys.modules.pop(f"gpucheck.tests_suite.{name}", None)
    mine = [(r["subject"], r["status"]) for r in verdict["results"] if r["check"] == "example.temperature"]
    assert rc == 1 and ("gpu2", "fail") in mine and len(mine) == len(snap["gpus"])


def test_the_examples_option_is_given_on_the_command_line(tmp_path, monkeypatch, capsys):
    """With the file and the line of the doc, `gpucheck run --option example.temperature:fail-above=88`
    fails the GPU at 90 C that the defaults only warn about; a value that is no finite number, or
    an option the example does not declare, is a usage error (exit 2) naming --option."""
    from gpucheck import tests_suite
    from gpucheck.cli.main import main

    name, level = table_line()
    (tmp_path / f"{name}.py").write_text(example_source())
    monkeypatch.setattr(tests_suite, "__path__", [*tests_suite.__path__, str(tmp_path)])
    monkeypatch.setitem(registry.TABLE, name, level)
    monkeypatch.delitem(sys.modules, f"gpucheck.tests_suite.{name}", raising=False)
    snap = copy.deepcopy(load_snapshot(HEALTHY))
    _gpu(snap, 2)["temperature"]["gpu_c"] = 90
    snap_file = tmp_path / "warm.json"
    snap_file.write_text(json.dumps(snap))
    run = ["run", "--snapshot", str(snap_file), "--check", "example.temperature", "--json", "--no-history"]

    def gpu2(*argv):
        rc = main([*run, *argv])
        out = capsys.readouterr()
        assert out.out, (rc, out.err)
        verdict = json.loads(out.out)
        return rc, next(r["status"] for r in verdict["results"] if r["subject"] == "gpu2")

    try:
        assert gpu2() == (0, "warn")
        assert gpu2("--option", "example.temperature:fail-above=88") == (1, "fail")
        for bad, words in (("fail-above=nan", "not a finite number"), ("fail_c=88", "has no option 'fail_c'")):
            assert main([*run, "--option", f"example.temperature:{bad}"]) == 2
            err = capsys.readouterr().err
            assert "--option" in err and words in err, err
    finally:
        sys.modules.pop(f"gpucheck.tests_suite.{name}", None)
