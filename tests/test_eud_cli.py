"""`gpucheck eud`: selects the eud checks of the level, passes its options to them, refuses bad
input with one line and exit 2, and fails the GPU an injected fault hits."""

from __future__ import annotations

import json

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
    (["--duration", "soon"], "--duration"),
    (["--check", "eud.nosuch"], "unknown check id"),
    (["--pattern", "zeros,nosuch"], "unknown pattern 'nosuch'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys, tmp_path):
    rc = main(["eud", "--device", "cpu", "--state-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and words in err, err


def _run(tmp_path, capsys, *argv):
    # CPU workers share one memory bus: their copy rates differ by 2-3x on a loaded machine, so the
    # peer comparison (tested with injected slowness in test_eud_bandwidth.py) is loosened here.
    cfg = tmp_path / "loose.toml"
    cfg.write_text('[checks."eud.bandwidth"]\npeer_warn_fraction = 0.97\npeer_fail_fraction = 0.99\n')
    rc = main(["eud", "--device", "cpu", "--workers", "2", "--no-history", "--state-dir", str(tmp_path),
               "--config", str(cfg), "--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


def test_level2_on_cpu_workers_passes_and_runs_only_level2_checks(tmp_path, capsys):
    rc, v = _run(tmp_path, capsys, "--level", "2", "--memtest-fraction", "0.5", "--pattern", "zeros,random")
    assert rc == 0, [(r["check"], r["status"], r["summary"]) for r in v["results"]]
    assert {r["check"] for r in v["results"]} == {"eud.memtest", "eud.bandwidth"}
    mem = [r for r in v["results"] if r["check"] == "eud.memtest"]
    assert len(mem) == 2 and all("2 pattern(s)" in r["summary"] for r in mem)


def test_injected_bitflip_fails_that_gpu_only(tmp_path, capsys):
    rc, v = _run(tmp_path, capsys, "--level", "2", "--check", "eud.memtest", "--pattern", "checkerboard",
                 "--inject", "bitflip:gpu=1,offset=4096,bit=5")
    assert rc == 1
    by_gpu = {r["gpu"]: r for r in v["results"]}
    assert by_gpu[0]["status"] == "pass"
    assert by_gpu[1]["status"] == "fail" and "memory errors" in by_gpu[1]["summary"]
    assert by_gpu[1]["injected"] == ["bitflip:gpu=1,offset=4096,bit=5"]
