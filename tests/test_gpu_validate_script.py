"""scripts/gpu-validate.sh without a GPU: it parses (bash -n) and passes shellcheck; --dry-run
prints every step the GPU validation needs with a time limit, inside 20 minutes; it never changes
a GPU's settings; and its runner records each step (a failing step does not stop the next),
refuses to write through links, and on SIGTERM stops the running step's whole process group and
still writes its summary. The steps' own commands are replaced by a stand-in `python3` (PYTHON=)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-validate.sh"
STEPS = ["env", "install", "ptxas", "pytest-gpu", "bench-burn", "bench-memtest", "bench-poet", "bench-copy",
         "bench-collectives", "run-level1", "run-level2", "telemetry"]


def _run(*args, env=None, timeout=60):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


def test_the_script_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck; .ci/run installs it)")
    p = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_the_dry_run_prints_every_step_with_its_limit_inside_20_minutes(tmp_path):
    p = _run("--dry-run", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    plan = re.findall(r"^step (\S+)\s+limit\s+(\d+) s  (.*)$", p.stdout, re.M)
    assert [name for name, _, _ in plan] == STEPS
    total = sum(int(limit) for _, limit, _ in plan)
    assert f"time budget: {total} s of steps + " in p.stdout and total + 30 <= 20 * 60
    cmds = {name: cmd for name, _, cmd in plan}
    assert "-m pytest -m gpu" in cmds["pytest-gpu"]
    assert "--dtype all --size 8192" in cmds["bench-burn"] and "--fraction 0.9" in cmds["bench-memtest"]
    assert "run --level 1" in cmds["run-level1"] and "run --level 2" in cmds["run-level2"]
    assert "telemetry dump" in cmds["telemetry"] and "bench_poet.py" in cmds["bench-poet"]
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    p = _run("--dry-run", "--only", "bench-burn,telemetry")
    assert re.findall(r"^step (\S+)", p.stdout, re.M) == ["bench-burn", "telemetry"]
    assert "time budget: 180 s of steps" in p.stdout
    p = _run("--dry-run", "--skip", "pytest-gpu")
    assert "pytest-gpu" not in p.stdout and p.returncode == 0
    for bad in (["--only", "bogus"], ["--frobnicate"], ["--wheels", str(tmp_path / "none")], ["a", "b"]):
        p = _run("--dry-run", *bad)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)


def test_it_never_changes_a_gpu_setting():
    text = SCRIPT.read_text()
    calls = re.findall(r"nvidia-smi([^\n|;&]*)", text)
    assert calls  # it reads the GPU with nvidia-smi
    forbidden = re.compile(r"(^|\s)(-r|--gpu-reset|-pm|--persistence-mode|-pl|--power-limit|-ac|--applications-clocks"
                           r"|-rac|-lgc|--lock-gpu-clocks|-lmc|-rgc|-c|--compute-mode|-mig|--multi-instance-gpu|-e"
                           r"|--ecc-config)(=|\s|$)")
    for args in calls:
        if args.strip().startswith(("-r,", "-pm,")):  # the comment that lists what it never does
            continue
        assert not forbidden.search(args), args


def _fake_python(tmp_path: Path, body: str) -> Path:
    """A stand-in `python3` (written aside and renamed in: never executed while open for writing)."""
    exe = tmp_path / "python3"
    part = tmp_path / "python3.part"
    part.write_text("#!/bin/bash\n" + body)
    part.chmod(0o755)
    os.replace(part, exe)
    return exe


def test_every_step_is_recorded_and_a_failing_step_does_not_stop_the_next(tmp_path):
    py = _fake_python(tmp_path, 'echo "stand-in python: $*"; exit 3\n')
    out = tmp_path / "out"
    p = _run("--only", "run-level1,telemetry", str(out), env={"PYTHON": str(py)})
    logs = {f.name: f.read_text() for f in out.glob("*.log")}
    assert p.returncode == 1, (p.stdout, p.stderr, logs)
    rows = [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [("run-level1", "60", "3", "failed"),
                                                         ("telemetry", "30", "3", "failed")], (p.stdout, logs)
    assert "stand-in python: -m gpucheck run --level 1 --json --output " + str(out) in (out / "run-level1.log").read_text()
    assert "| telemetry | 30 |" in (out / "SUMMARY.md").read_text()
    with tarfile.open(out / "gpu-validate.tar.gz") as t:
        assert {"./run-level1.log", "./telemetry.log", "./summary.tsv", "./SUMMARY.md"} <= set(t.getnames())


def test_it_refuses_links_and_folders_others_can_write(tmp_path):
    py = _fake_python(tmp_path, "exit 0\n")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    p = _run("--only", "telemetry", str(tmp_path / "link"), env={"PYTHON": str(py)})
    assert p.returncode == 2 and "is a link" in p.stderr and not any(real.iterdir())
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    p = _run("--only", "telemetry", str(shared), env={"PYTHON": str(py)})
    assert p.returncode == 2 and "others can write" in p.stderr
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out / "state").mkdir()
    (out / "state" / "telemetry.json").symlink_to(victim)  # planted where a step writes: never followed
    p = _run("--only", "telemetry", str(out), env={"PYTHON": str(_fake_python(tmp_path, f'echo x >"{out}/state/telemetry.json"\n'))})
    assert p.returncode == 2 and "holds a link or a special file" in p.stderr and victim.read_text() == "keep"


def test_sigterm_stops_the_running_steps_process_group_and_writes_the_summary(tmp_path):
    pids = tmp_path / "pids"
    py = _fake_python(tmp_path, f'echo $$ >>"{pids}"; sleep 300 & echo $! >>"{pids}"; wait\n')
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--only", "run-level2,telemetry", str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHON": str(py)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.05)
        step_pids = [int(x) for x in pids.read_text().split()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    for pid in step_pids:  # the stand-in and its child: the whole group is gone
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), pid
    rows = [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()]
    assert [(r[0], r[4]) for r in rows] == [("run-level2", "interrupted (TERM)")]  # telemetry never started
    assert (out / "SUMMARY.md").exists() and (out / "gpu-validate.tar.gz").exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
