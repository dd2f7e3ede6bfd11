"""Progress without a terminal (issue 17): `burn`/`poet` under cron, Slurm or ssh printed nothing
until the verdict; now one line per GPU as soon as it reports and at least every 10 s after.
And `gpucheck nccl run`: nccl-tests' table on a terminal, JSON lines otherwise or with --json."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Check:
    id = "burn.gemm"


class _Run:
    check_id = "burn.gemm"
    duration_s = 31.0

    class status:  # noqa: N801
        value = "pass"


def test_one_line_per_gpu_at_once_then_every_interval_with_staleness():
    from gpucheck.render.progress import PROGRESS_INTERVAL_S, ProgressLines

    clock, out = Clock(), io.StringIO()
    p = ProgressLines(out, clock=clock)
    p._thread = object()  # no ticker thread: the test calls tick() with its own clock
    p.started(_Check())
    info = {"dtype": "bf16", "tflops": 700.0, "tflops_median": 712.4, "errors": 0, "temperature_c": 71,
            "sm_clock_mhz": 1980, "power_w": 690.2, "time_left_s": 20.0, "windows": 3}
    p.progress("burn.gemm", "gpu0", info)
    p.progress("burn.gemm", "gpu1", info)
    p.progress("burn.gemm", "gpu0", {**info, "tflops_median": 713.0})  # within the interval: no line
    assert out.getvalue().splitlines() == [
        "gpucheck: burn.gemm gpu0 (0 s): bf16, 712.4 TFLOP/s, 0 errors, 71 C, 1980 MHz, 690 W, 20 s left",
        "gpucheck: burn.gemm gpu1 (0 s): bf16, 712.4 TFLOP/s, 0 errors, 71 C, 1980 MHz, 690 W, 20 s left"]
    clock.now += PROGRESS_INTERVAL_S - 1
    p.tick()
    assert len(out.getvalue().splitlines()) == 2
    clock.now += 1
    p.progress("burn.gemm", "gpu1", {**info, "tflops_median": 650.0})
    p.tick()
    lines = out.getvalue().splitlines()[2:]  # gpu0 went quiet: still a line, with the age of its last report
    assert lines == ["gpucheck: burn.gemm gpu0 (10 s): bf16, 713 TFLOP/s, 0 errors, 71 C, 1980 MHz, 690 W, 20 s left"
                     " (as of 10 s ago: its last report)",
                     "gpucheck: burn.gemm gpu1 (10 s): bf16, 650 TFLOP/s, 0 errors, 71 C, 1980 MHz, 690 W, 20 s left"]
    clock.now += PROGRESS_INTERVAL_S
    p.tick()
    assert out.getvalue().splitlines()[4].endswith("(as of 20 s ago: its last report)")
    assert "no report" not in out.getvalue()  # it read as a hang (issue 26)
    p.finished(_Run())
    assert out.getvalue().splitlines()[-1] == "gpucheck: burn.gemm pass (31.0 s)"


@pytest.mark.slow
def test_a_check_that_reports_nothing_still_prints_every_interval():
    from gpucheck.render.progress import ProgressLines

    out = io.StringIO()
    p = ProgressLines(out, interval_s=0.2)  # the real ticker thread
    p.started(_Check())
    time.sleep(1.0)
    p.finished(_Run())
    p.close()
    running = [ln for ln in out.getvalue().splitlines() if re.fullmatch(r"gpucheck: burn\.gemm running \(\d+ s\)", ln)]
    assert len(running) >= 3, out.getvalue()
    assert out.getvalue().splitlines()[-1] == "gpucheck: burn.gemm pass (31.0 s)"
    p.close()  # twice is fine


def test_short_quiet_checks_print_nothing_and_describe_is_plain():
    from gpucheck.render.progress import ProgressLines, describe

    out = io.StringIO()
    p = ProgressLines(out)
    p.started(_Check())
    p.finished(_Run())
    p.close()
    assert out.getvalue() == ""
    assert describe({"pattern": "walking_ones", "pass": 2, "gbps": 1234.5, "errors": 0, "first_error": {"x": 1}}) == \
        "pattern walking_ones, pass 2, 1234 GB/s, 0 errors"
    assert describe({"what": "p2p 0->1", "new_key": 0.123456}) == "p2p 0->1, new_key=0.1235"


@pytest.mark.slow
def test_burn_without_a_terminal_prints_progress_lines_on_stderr(tmp_path):
    cmd = [sys.executable, "-m", "gpucheck", "burn", "--device", "cpu", "--workers", "2", "--duration", "3s",
           "--size", "64", "--no-history"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    for gpu in ("gpu0", "gpu1"):
        assert re.search(rf"^gpucheck: burn\.gemm {gpu} \(\d+ s\): \w+, [\d.]+ TFLOP/s, 0 errors", r.stderr, re.M), \
            r.stderr
    assert re.search(r"^gpucheck: burn\.gemm (pass|warn) \(", r.stderr, re.M)  # warn: a CPU is below a GPU's rate
    assert "burn.gemm" in r.stdout and "gpucheck:" not in r.stdout  # the verdict on stdout, progress apart
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] in ("pass", "warn")
    assert "gpucheck: burn.gemm" not in r.stderr  # --json runs (sweeps, prologs) stay quiet


NCCL_RUN = [sys.executable, "-m", "gpucheck", "nccl", "run", "--node-rank", "0", "--nnodes", "1", "--nproc-per-node",
            "2", "--backend", "gloo", "--sizes", "64K,1M", "--iters", "2"]


def _on_a_terminal(cmd: list[str], cwd: Path) -> tuple[int, str, str]:
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=ENV, cwd=cwd)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    err = p.stderr.read().decode() if p.stderr else ""
    return p.wait(timeout=120), re.sub(r"\x1b\[[0-9;]*m", "", out.decode()), err


@pytest.mark.slow
def test_nccl_run_prints_the_nccl_tests_table_on_a_terminal_and_json_lines_otherwise(tmp_path):
    rc, out, err = _on_a_terminal(NCCL_RUN, tmp_path)
    assert rc == 0, err
    lines = out.replace("\r\n", "\n").splitlines()
    assert lines[0] == "# all_reduce: 2 ranks, gloo"
    assert lines[1].split() == ["#", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    assert lines[3].split()[:5] == ["65536", "16384", "float", "sum", lines[3].split()[4]]
    assert lines[4].split()[:4] == ["1048576", "262144", "float", "sum"] and lines[4].split()[-1] == "0"
    assert lines[5].startswith("# Avg bus bandwidth    : ") and lines[6].startswith("OK: 2 ranks, data verified")
    assert "{" not in out and "rank 0 listening on port" in err
    rc, out, err = _on_a_terminal([*NCCL_RUN, "--json"], tmp_path)
    events = [json.loads(ln) for ln in out.replace("\r\n", "\n").splitlines() if ln.strip()]
    assert rc == 0 and [e["event"] for e in events].count("result") == 2
    r = subprocess.run(NCCL_RUN, capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=120)
    events = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]  # a pipe: JSON lines, as launchers read
    assert r.returncode == 0 and {e["event"] for e in events} == {"listening", "ready", "result"}
