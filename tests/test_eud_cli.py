"""`gpucheck eud`: selects the eud checks of the level, passes its options to them, refuses bad
input with one line and exit 2, and fails the GPU an injected fault hits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.cli.eud import eud_check_ids
from gpucheck.cli.main import main


def test_level_selects_eud_checks():
    assert sorted(eud_check_ids(2)) == ["eud.bandwidth", "eud.memtest"]
    assert sorted(eud_check_ids(3)) == ["eud.bandwidth", "eud.dcgm", "eud.memtest", "eud.power"]
    assert eud_check_ids(1) == []


@pytest.mark.parametrize("argv, words", [
    (["--level", "1"], "no eud check runs at level 1"),
    (["--level", "7"], "unknown level"),
    (["--check", "burn.gemm"], "not an eud check"),
    (["--memtest-fraction", "0"], "--memtest-fraction"),
    (["--memtest-fraction", "1.5"], "--memtest-fraction"),
    (["--dcgm-level", "5"], "--dcgm-level"),
    (["--dcgm-level", "huge"], "bad DCGM diag level 'huge'"),
    (["--power-duration", "0"], "--power-duration"),
    (["--pattern", ""], "--pattern"),
    (["--duration", "soon"], "--duration"),
    (["--check", "eud.nosuch"], "unknown check id"),
    (["--pattern", "zeros,nosuch"], "unknown pattern 'nosuch'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys, tmp_path):
    rc = main(["eud", "--device", "cpu", "--state-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and words in err, err


def test_every_option_reaches_the_checks(monkeypatch, tmp_path):
    """The options land in the run request, and the functions the checks plan with read them."""
    from gpucheck import app
    from gpucheck.core.check import Context
    from gpucheck.core.levels import Level
    from gpucheck.tests_suite import eud_dcgm as dcgm, eud_memtest as memtest, eud_power as power

    seen = []
    monkeypatch.setattr(app, "execute", lambda req, **kw: seen.append(req) or 0)
    rc = main(["eud", "--device", "cpu", "--state-dir", str(tmp_path), "--level", "4", "--memtest-fraction", "0.25",
               "--pattern", "zeros", "--pattern", "moving_inversions", "--duration", "90s",
               "--power-duration", "2m", "--dcgm-level", "medium"])
    assert rc == 0
    (req,) = seen
    assert req.check_options == (
        memtest.MemtestOptions(fraction=0.25, patterns=["zeros", "moving-inversions"], duration_s=90.0),
        power.PowerOptions(duration_s=120.0), dcgm.DcgmOptions(diag_level=2))
    assert sorted(req.check_patterns) == ["eud.bandwidth", "eud.dcgm", "eud.memtest", "eud.power"]
    ctx = Context(level=Level.BURN_IN, check_options=req.check_options)
    assert memtest.plan(ctx) == {"fraction": 0.25, "duration_s": 90.0, "passes": 1,
                                 "patterns": ["zeros", "moving-inversions"], "headroom_round": True}
    assert power.power_duration(ctx) == 120.0 and dcgm.dcgm_level(ctx) == 2
    # nothing given: nothing passed, the checks' level defaults apply
    seen.clear()
    assert main(["eud", "--device", "cpu", "--state-dir", str(tmp_path), "--level", "3"]) == 0
    assert seen[0].options == {} and seen[0].check_options == ()
    ctx = Context(level=Level.EXTENDED, check_options=seen[0].check_options)
    assert memtest.plan(ctx)["fraction"] == 1.0 and power.power_duration(ctx) == 120.0 and dcgm.dcgm_level(ctx) == 3


def test_dcgm_level_reaches_dcgmi(tmp_path, capsys):
    """`--dcgm-level 2` runs `dcgmi diag -r 2 -j` (a fake dcgmi that logs its arguments and prints
    a hand-written DCGM 3.x document)."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "dcgm" / "v3_r3_all_pass.json"
    log = tmp_path / "args.log"
    fake = tmp_path / "dcgmi"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                    f'case "$1" in discovery) echo "2 GPUs found."; exit 0;; diag) cat {fixture}; exit 0;; esac\nexit 2\n')
    fake.chmod(0o755)
    cfg = tmp_path / "dcgm.toml"
    cfg.write_text(f'[checks."eud.dcgm"]\ndcgmi_path = "{fake}"\n')
    # --force: without a GPU, NVML lists none, so whether they are in use cannot be told (gpucheck.workers.busy)
    rc = main(["eud", "--check", "eud.dcgm", "--dcgm-level", "2", "--no-history", "--json", "--force",
               "--state-dir", str(tmp_path / "s"), "--config", str(cfg)])
    v = json.loads(capsys.readouterr().out)
    assert rc == 0, [(r["subject"], r["status"], r["summary"]) for r in v["results"]]
    assert log.read_text().splitlines() == ["discovery -l", "diag -r 2 -j"]
    # (on a GPU machine a live snapshot adds the before/after settings comparison, node/settings)
    dcgm_results = [r for r in v["results"] if r["check"] == "eud.dcgm" and r.get("subject") != "node/settings"]
    assert len(dcgm_results) == 21 and all(r["status"] == "pass" for r in dcgm_results)
    assert all(any("dcgmi diag -r 2 exit code 0" in e for e in r["evidence"]) for r in dcgm_results)
    # CPU stand-ins never start DCGM on the real GPUs; named alone, nothing the run was asked
    # was examined: the skip is unexamined, exit 3
    log.write_text("")
    rc = main(["eud", "--check", "eud.dcgm", "--device", "cpu", "--no-history", "--json",
               "--state-dir", str(tmp_path / "s"), "--config", str(cfg)])
    (r,) = [r for r in json.loads(capsys.readouterr().out)["results"] if r["check"] == "eud.dcgm"]
    assert rc == 3 and r["status"] == "skip" and r["summary"].startswith("--device cpu:") and log.read_text() == ""
    assert r["unexamined"] is True


def _run(tmp_path, capsys, *argv):
    # CPU workers share one memory bus: their copy rates differ by 2-3x on a loaded machine, so the
    # peer comparison (tested with injected slowness in test_eud_bandwidth.py) is loosened here.
    cfg = tmp_path / "loose.toml"
    cfg.write_text('[checks."eud.bandwidth"]\npeer_warn_fraction = 0.97\npeer_fail_fraction = 0.99\n')
    rc = main(["eud", "--device", "cpu", "--workers", "2", "--no-history", "--state-dir", str(tmp_path),
               "--config", str(cfg), "--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_level2_on_cpu_workers_passes_and_runs_only_level2_checks(tmp_path, capsys):
    rc, v = _run(tmp_path, capsys, "--level", "2", "--memtest-fraction", "0.5", "--pattern", "zeros,random")
    assert rc == 0, [(r["check"], r["status"], r["summary"]) for r in v["results"]]
    assert {r["check"] for r in v["results"]} == {"eud.memtest", "eud.bandwidth"}
    mem = [r for r in v["results"] if r["check"] == "eud.memtest"]
    assert len(mem) == 2 and all("2 pattern(s)" in r["summary"] for r in mem)
    for r in mem:  # the fraction and the patterns reached the workers
        assert any(e.startswith("plan: memtest_fraction 0.5 of the free memory") and "patterns zeros, random" in e
                   for e in r["evidence"]), r["evidence"]


def test_injected_bitflip_fails_that_gpu_only(tmp_path, capsys):
    rc, v = _run(tmp_path, capsys, "--level", "2", "--check", "eud.memtest", "--pattern", "checkerboard",
                 "--inject", "bitflip:gpu=1,offset=4096,bit=5")
    assert rc == 1
    by_gpu = {r["gpu"]: r for r in v["results"]}
    assert by_gpu[0]["status"] == "pass"
    assert by_gpu[1]["status"] == "fail" and "memory errors" in by_gpu[1]["summary"]
    assert by_gpu[1]["injected"] == ["bitflip:gpu=1,offset=4096,bit=5"]
