"""scripts/gpu-validate.sh (the GPU lease kit) without a GPU.

The plan: each part's dry run prints `part N budget S s` (480 s and 180 s: both, with a machine's
start, inside a 15-minute lease) and core steps whose limits plus the spare fit it, the most
valuable evidence first, every `-m gpu` test file and GPU benchmark in one part; `--only/--skip`,
usage errors (exit 2, one stderr line) and refusals. The runner, with a stand-in `python3`
(PYTHON=): OUTDIR ends with two files per part whose names the device tool returns; a hanging
step is cut at what the deadline leaves and the rest are skipped for time, inside the budget; a
SIGKILL of the whole kit at any moment (mid-rewrite of the archive included) leaves readable
archives whose members are the steps done so far and a summary that agrees with them; SIGTERM
stops the running step's process group and the processes that left it. GV_TIME_SCALE (in (0, 1])
shrinks every limit so that a part runs in seconds here.

scripts/gpu_validate.py: `env` names what is missing and the wheel to carry; `figures` reads the
real outputs of the benchmarks (run here on the CPU at tiny sizes) and of gpucheck; and no step's
code needs ClusterShell or jsonschema, which the GPU machine lacks."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-validate.sh"
HELPER = ROOT / "scripts" / "gpu_validate.py"
PART1 = ["env", "telemetry", "run-level1", "pytest-poet", "pytest-eud", "bench-poet", "bench-memtest", "bench-burn",
         "sass", "bench-copy"]
PART2 = ["run-level2", "pytest-busy", "pytest-power", "bench-burn-more", "bench-repro", "bench-level1",
         "bench-allreduce"]
BUDGET = {1: 480, 2: 180}
LEASE_S, MACHINE_START_S, PER_COMMAND_S = 15 * 60, 120, 600
NAME_OK = re.compile(r"[A-Za-z0-9._-]+")
RAN = {"ok", "failed", "timeout", "deadline"}
PLAN_ROW = re.compile(r"^step (\S+)\s+limit\s+(\d+) s\s+(core|extra)\s+(.*)$", re.M)


def _run(*args, env=None, timeout=60):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


def _plan(part: int, *extra: str):
    p = _run("--dry-run", "--part", str(part), *extra)
    assert p.returncode == 0, p.stderr
    return p.stdout, [(n, int(lim), kind, cmd) for n, lim, kind, cmd in PLAN_ROW.findall(p.stdout)]


@pytest.mark.slow
def test_the_script_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck; .ci/run installs it)")
    p = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


@pytest.mark.parametrize("part", [1, 2])
def test_each_parts_core_steps_fit_its_budget_and_the_lease(part, tmp_path):
    out, plan = _plan(part, str(tmp_path / "out"))
    assert f"part {part} budget {BUDGET[part]} s\n" in out
    core = [lim for _, lim, kind, _ in plan if kind == "core"]
    spare = int(re.search(r"core steps (\d+) s \+ spare (\d+) s = (\d+) s, within the budget of (\d+) s", out)
                .group(2))
    assert sum(core) + spare <= BUDGET[part] and spare >= 10
    kinds = [kind for _, _, kind, _ in plan]
    assert kinds == sorted(kinds, key=lambda k: k == "extra")  # extras only after every core step
    assert all(lim <= BUDGET[part] for _, lim, _, _ in plan)
    assert BUDGET[1] + BUDGET[2] + MACHINE_START_S <= LEASE_S and max(BUDGET.values()) + 60 <= PER_COMMAND_S
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_the_plan_puts_the_most_valuable_evidence_first():
    _, plan1 = _plan(1)
    _, plan2 = _plan(2)
    assert [n for n, *_ in plan1] == PART1 and [n for n, *_ in plan2] == PART2
    cmds = {n: cmd for n, _, _, cmd in plan1 + plan2}
    assert "telemetry dump" in cmds["telemetry"] and "run --level 1" in cmds["run-level1"]
    assert "run --level 2" in cmds["run-level2"] and "--timeout" in cmds["run-level2"]
    assert "--dtype bf16,fp8 --size 8192" in cmds["bench-burn"] and "fp64" in cmds["bench-burn-more"]
    assert "--device cuda" in cmds["bench-poet"] and "--device cuda --fraction" in cmds["bench-memtest"]
    # every test file with tests marked gpu runs in exactly one pytest step, with -m gpu
    marks_gpu = re.compile(r"^(\w+ = pytest\.mark\.gpu|@pytest\.mark\.gpu)\b", re.M)
    gpu_files = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if marks_gpu.search(p.read_text()))
    assert len(gpu_files) >= 4
    in_kit = sorted(m for cmd in cmds.values() for m in re.findall(r"tests/(test_\w+\.py)", cmd))
    assert in_kit == gpu_files
    for bench in ("bench_poet", "bench_memtest", "bench_burn", "bench_copy_bandwidth", "bench_allreduce", "bench_repro",
                  "bench_level1"):
        assert any(f"benchmarks/{bench}.py" in cmd for cmd in cmds.values()), bench
    text = SCRIPT.read_text()
    assert "-m pytest -m gpu" in text
    for line in re.findall(r"^.*pip install.*$", text, re.M):  # never an index: the GPU machine has no network
        assert "--no-index" in line, line


def test_only_skip_and_budget_pick_what_runs():
    _, plan = _plan(1, "--only", "sass,telemetry")
    assert [n for n, *_ in plan] == ["telemetry", "sass"]  # the plan's order, not the list's
    _, plan = _plan(2, "--skip", "run-level2,bench-allreduce")
    assert [n for n, *_ in plan] == [n for n in PART2 if n not in ("run-level2", "bench-allreduce")]
    out, _ = _plan(1, "--budget", "300")
    assert "part 1 budget 300 s\n" in out and "over the budget of 300 s" in out


@pytest.mark.parametrize("args, env, says", [
    ([], {}, "--part 1 or --part 2 is required"),
    (["--part", "3"], {}, "--part 3"),
    (["--part", "1", "--only", "bogus"], {}, "unknown step bogus"),
    (["--part", "1", "--only", "run-level2"], {}, "step run-level2 is in part 2"),
    (["--part", "2", "--skip", "telemetry"], {}, "step telemetry is in part 1"),
    (["--part", "1", "--frobnicate"], {}, "unknown option --frobnicate"),
    (["--part", "1", "--wheels", "/nonexistent-wheels"], {}, "is not a directory"),
    (["--part", "1", "a", "b"], {}, "one OUTDIR only"),
    (["--part", "1", "--budget", "481"], {}, "can only be lowered"),
    (["--part", "1", "--budget", "0"], {}, "is not a number of seconds"),
    (["--part", "1"], {"GV_TIME_SCALE": "2"}, "GV_TIME_SCALE=2"),
    (["--part", "1"], {"GV_TIME_SCALE": "1.5"}, "GV_TIME_SCALE=1.5"),
    (["--part", "1"], {"GV_TIME_SCALE": "0"}, "is not in (0, 1]"),
    (["--part", "2"], {"GV_TIME_SCALE": "-1"}, "GV_TIME_SCALE=-1"),
])
def test_usage_errors_exit_2_with_one_line(args, env, says):
    for dry in ([], ["--dry-run"]):
        p = _run(*dry, *args, env=env)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and says in p.stderr, (args, p.stderr)
        assert p.stdout == ""


def test_it_never_changes_a_gpu_setting():
    text = SCRIPT.read_text()
    calls = re.findall(r"nvidia-smi([^\n|;&]*)", text)
    assert len(calls) >= 4  # it reads the GPU with nvidia-smi
    forbidden = re.compile(r"(^|\s)(-r|--gpu-reset|-pm|--persistence-mode|-pl|--power-limit|-ac|--applications-clocks"
                           r"|-rac|-lgc|--lock-gpu-clocks|-lmc|-rgc|-c|--compute-mode|-mig|--multi-instance-gpu|-e"
                           r"|--ecc-config)(=|\s|,|$)")
    for args in calls:
        if args.strip().startswith(("-r,", "-pm,")):  # the comment that lists what it never does
            continue
        assert not forbidden.search(args), args


# -- the runner, with a stand-in python3 ---------------------------------------------------------------

def _exe(tmp_path: Path, name: str, body: str) -> Path:
    """A stand-in program (written aside and renamed in: never executed while open for writing)."""
    exe = tmp_path / name
    part = tmp_path / f"{name}.part"
    part.write_text("#!/bin/bash\n" + body)
    part.chmod(0o755)
    os.replace(part, exe)
    return exe


def _env(tmp_path: Path, py: Path, **extra) -> dict:
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    return {"PYTHON": str(py), "TMPDIR": str(tmpdir), **extra}


def _md_rows(md: str) -> dict[str, list[str]]:
    rows = re.findall(r"^\| (\S+) \| (core|extra) \| (.*) \|$", md, re.M)
    return {name: [kind, *rest.split(" | ")] for name, kind, rest in rows if name != "step"}


def _tsv_rows(text: str) -> dict[str, list[str]]:
    lines = [line.split("\t") for line in text.splitlines()]
    assert lines[0][:7] == ["step", "kind", "limit_s", "allowed_s", "seconds", "rc", "status"], lines[0]
    return {r[0]: r[1:] for r in lines[1:]}


def _check_outdir(out: Path, parts=(1, 2)) -> dict:
    """What the device tool would bring back, and each part's archive against its summary."""
    files = sorted(out.iterdir())
    assert len(files) <= 8, files
    seen = {}
    for f in files:
        assert f.is_file() and not f.is_symlink() and NAME_OK.fullmatch(f.name), f
    for part in parts:
        base = f"gpu-validate-part{part}"
        mine = [f.name for f in files if f.name.startswith(base + ".")]
        assert set(mine) <= {f"{base}.tar.gz", f"{base}.md", f"{base}.tar.gz.tmp", f"{base}.md.tmp"}, mine
        assert len([n for n in mine if n.endswith(".tmp")]) <= 1, mine
        if (out / f"{base}.tar.gz").exists():
            seen[part] = _check_archive(out / f"{base}.tar.gz", base, out / f"{base}.md")
    return seen


def _check_archive(archive: Path, base: str, md: Path) -> dict:
    with tarfile.open(archive) as t:
        names = set(t.getnames())
        assert all(n == base or n.startswith(base + "/") for n in names), names
        tsv = _tsv_rows(t.extractfile(f"{base}/summary.tsv").read().decode())
    for step, row in tsv.items():
        status = row[5]
        if status in RAN:
            assert f"{base}/{step}.log" in names, (step, names)
        if status == "pending":
            assert f"{base}/{step}.log" not in names, step
    if md.exists():  # the summary is rewritten after the archive: a step it says ran, the archive holds
        for step, row in _md_rows(md.read_text()).items():
            if row[5] in RAN:
                assert tsv[step][5] == row[5] and tsv[step][4] == row[4], (step, row, tsv[step])
    return tsv


@pytest.mark.slow
def test_a_part_leaves_two_files_and_records_every_step(tmp_path):
    py = _exe(tmp_path, "python3", 'echo "stand-in python: $*"; exit 3\n')
    out = tmp_path / "out"
    p = _run("--part", "1", "--only", "telemetry,run-level1", str(out), env=_env(tmp_path, py))
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert sorted(f.name for f in out.iterdir()) == ["gpu-validate-part1.md", "gpu-validate-part1.tar.gz"]
    tsv = _check_outdir(out, parts=(1,))[1]
    assert {k: (v[1], v[4], v[5]) for k, v in tsv.items()} == {"telemetry": ("20", "3", "failed"),
                                                                "run-level1": ("30", "3", "failed")}
    md = (out / "gpu-validate-part1.md").read_text()
    assert md.startswith("# gpu-validate part 1: finished") and "| telemetry | core | 20 | 20 |" in md
    with tarfile.open(out / "gpu-validate-part1.tar.gz") as t:
        log = t.extractfile("gpu-validate-part1/run-level1.log").read().decode()
    private = re.search(r"--output (\S+)/gpu-validate-part1/run-level1\.json --no-history", log).group(1)
    assert "stand-in python: -m gpucheck run --level 1 -v --output" in log and str(out) not in private
    assert not Path(private).exists() and not any((tmp_path / "tmpdir").iterdir())  # the private folder went
    p = _run("--part", "2", "--only", "pytest-busy", str(out), env=_env(tmp_path, py))
    assert len(list(out.iterdir())) == 4 and set(_check_outdir(out)) == {1, 2}
    assert "stand-in python: -m pytest -m gpu" in _archived_log(out, 2, "pytest-busy")


def _archived_log(out: Path, part: int, step: str) -> str:
    with tarfile.open(out / f"gpu-validate-part{part}.tar.gz") as t:
        return t.extractfile(f"gpu-validate-part{part}/{step}.log").read().decode()


def test_it_refuses_links_and_folders_others_can_write(tmp_path):
    py = _exe(tmp_path, "python3", "exit 0\n")
    env = _env(tmp_path, py)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    p = _run("--part", "1", "--only", "telemetry", str(tmp_path / "link"), env=env)
    assert p.returncode == 2 and "is a link" in p.stderr and not any(real.iterdir())
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    p = _run("--part", "1", "--only", "telemetry", str(shared), env=env)
    assert p.returncode == 2 and "others can write" in p.stderr and not any(shared.iterdir())
    out = tmp_path / "out"
    (out / "state").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out / "state" / "x.json").symlink_to(victim)  # a planted link anywhere below: refused
    p = _run("--part", "1", "--only", "telemetry", str(out), env=env)
    assert p.returncode == 2 and "holds a link or a special file" in p.stderr and victim.read_text() == "keep"
    out2 = tmp_path / "out2"
    (out2 / "gpu-validate-part2.md").mkdir(parents=True)  # not a regular file where the summary goes
    p = _run("--part", "2", "--only", "pytest-busy", str(out2), env=env)
    assert p.returncode == 2 and "is not a regular file" in p.stderr
    assert not list(out.glob("gpu-validate-part*")) and [f.name for f in out2.iterdir()] == ["gpu-validate-part2.md"]
    assert not any((tmp_path / "tmpdir").iterdir())  # refused before any private folder was made


def _processes_with(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"GV_TEST_MARK={marker}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _kill_marked(marker: str) -> None:
    """The test's own processes (the kit's steps in their own process groups) after a SIGKILL."""
    for pid in _processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_the_deadline_cuts_a_hanging_step_and_skips_the_rest(tmp_path):
    """A step whose own limit is longer than what the part's deadline leaves is cut at the deadline
    (status `deadline`, run for less than its limit), and the steps after it are skipped for time.
    pytest-poet's 160 s limit exceeds the whole 100 s part (x 0.05: 8 s against 5 s), so the cut
    happens however slowly a loaded machine starts the step."""
    marker = uuid.uuid4().hex
    py = _exe(tmp_path, "python3", 'echo "hanging: $*"; setsid sleep 300 & sleep 300\n')
    out = tmp_path / "out"
    t0 = time.monotonic()
    p = _run("--part", "1", "--budget", "100", "--only", "pytest-poet,pytest-eud,bench-poet", str(out),
             env=_env(tmp_path, py, GV_TIME_SCALE="0.05", GV_TEST_MARK=marker))
    wall = time.monotonic() - t0
    try:
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert wall <= 5.0 + 3.0, wall
        tsv = _check_outdir(out, parts=(1,))[1]
        statuses = [row[5] for row in tsv.values()]
        assert statuses == ["deadline", "skipped-for-time", "skipped-for-time"], statuses
        row = list(tsv.values())[0]
        assert float(row[2]) < float(row[1]) and float(row[3]) <= float(row[2]) + 0.5  # given what was left
        assert _processes_with(marker) == []  # the step's `setsid sleep` was found by its token and killed
    finally:
        _kill_marked(marker)


def test_the_archive_is_rewritten_during_a_long_step(tmp_path):
    marker = uuid.uuid4().hex
    py = _exe(tmp_path, "python3", 'echo "progress of $2"; sleep 300\n')
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--part", "2", "--only", "run-level2", str(out)], cwd=ROOT,
                            env={**os.environ, **_env(tmp_path, py, GV_TIME_SCALE="0.02", GV_TEST_MARK=marker)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # run-level2: 120 s x 0.02 = 2.4 s; the archive every 30 s x 0.02 = 0.6 s
        deadline = time.monotonic() + 20
        log = ""
        while time.monotonic() < deadline and "progress of gpucheck" not in log:
            time.sleep(0.1)
            try:
                log = _archived_log(out, 2, "run-level2")
            except (OSError, KeyError, tarfile.TarError):
                pass
        assert "progress of gpucheck" in log and proc.poll() is None
        assert _check_outdir(out, parts=(2,))[2]["run-level2"][5] == "running"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _kill_marked(marker)


def _kill_at(tmp_path: Path, delay: float, tar: Path | None = None, wait_for: Path | None = None) -> Path:
    """Run part 1 (scaled: a few seconds) and SIGKILL the kit's whole process group after `delay`
    seconds, or once `wait_for` exists; the stand-in steps end within a fraction of a second."""
    marker = uuid.uuid4().hex
    py = _exe(tmp_path, "python3", 'echo "stand-in: $*"; sleep 0.1; echo "{}" >"$GV_DIR/$GV_STEP.json"\n')
    out = tmp_path / "out"
    env = {**os.environ, **_env(tmp_path, py, GV_TIME_SCALE="0.05", GV_TEST_MARK=marker)}
    if tar is not None:
        env["PATH"] = f"{tar.parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--part", "1", "--budget", "80", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + (20 if wait_for else delay)
        while time.monotonic() < end and proc.poll() is None and not (wait_for and wait_for.exists()):
            time.sleep(0.01)
        if wait_for is not None:
            assert wait_for.exists(), "the stand-in tar never ran"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        _kill_marked(marker)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_a_sigkill_at_a_random_moment_leaves_what_was_done(tmp_path, seed):
    delay = random.Random(seed).uniform(0.0, 4.5)
    out = _kill_at(tmp_path, delay)
    if out.exists():
        seen = _check_outdir(out, parts=(1,))
        if seen:  # steps that ran have their logs archived; those not reached are pending
            assert list(seen[1]) == PART1


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before-rename", "mid-write"])
def test_a_sigkill_while_the_archive_is_rewritten_keeps_the_last_whole_one(tmp_path, when):
    real_tar = shutil.which("tar")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    count, mark = tmp_path / "tar-calls", tmp_path / "in-tar"
    if when == "before-rename":  # the new archive written in full, not yet renamed over the old one
        hold = f'"{real_tar}" "$@"; touch "{mark}"; sleep 30'
    else:  # half an archive written where the new one goes
        hold = f'printf "\\037\\213 half an archive" >"$2"; touch "{mark}"; sleep 30'
    tar = _exe(bindir, "tar", f'echo x >>"{count}"\n'
                              f'if [ "$(wc -l <"{count}")" -lt 4 ]; then exec "{real_tar}" "$@"; fi\n{hold}\n')
    out = _kill_at(tmp_path, 0, tar=tar, wait_for=mark)
    tsv = _check_outdir(out, parts=(1,))[1]
    assert (out / "gpu-validate-part1.tar.gz.tmp").exists()  # the one leftover, never under the final name
    assert any(row[5] in RAN for row in tsv.values())  # the archive before it: steps done so far


def test_sigterm_stops_the_running_steps_process_group_and_writes_the_summary(tmp_path):
    pids = tmp_path / "pids"
    py = _exe(tmp_path, "python3", f'echo $$ >>"{pids}"; sleep 300 & echo $! >>"{pids}"; '
                                   f'setsid sleep 300 & echo $! >>"{pids}"; wait\n')
    out = tmp_path / "out"
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(["bash", str(SCRIPT), "--part", "2", "--only", "run-level2,pytest-busy", str(out)],
                            cwd=ROOT, env={**os.environ, **_env(tmp_path, py, GV_TEST_MARK=marker)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 3:
            time.sleep(0.05)
        step_pids = [int(x) for x in pids.read_text().split()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        for pid in step_pids:  # the stand-in, its child, and the one that left the group (setsid): all gone
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            assert not _alive(pid), pid
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_marked(marker)
    tsv = _check_outdir(out, parts=(2,))[2]
    assert {k: v[5] for k, v in tsv.items()} == {"run-level2": "interrupted-TERM", "pytest-busy": "not-run"}
    assert (out / "gpu-validate-part2.md").read_text().startswith("# gpu-validate part 2: interrupted (TERM)")
    assert not any((tmp_path / "tmpdir").iterdir())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_wheels_are_installed_from_a_local_folder_into_a_private_one(tmp_path):
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "gvtiny-0.1-py3-none-any.whl", "w") as z:  # a wheel made here, for this test
        z.writestr("gvtiny/__init__.py", "")
        z.writestr("gvtiny-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: gvtiny\nVersion: 0.1\n")
        z.writestr("gvtiny-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("gvtiny-0.1.dist-info/RECORD", "")
    _, plan = _plan(1, "--wheels", str(wheels), "--only", "telemetry")
    assert [n for n, *_ in plan] == ["wheels", "telemetry"] and "--no-index" in plan[0][3]
    py = _exe(tmp_path, "python3", f'if [ "$1 $2" = "-m pip" ]; then exec "{sys.executable}" "$@"; fi\n'
                                   f'exec "{sys.executable}" -c "import gvtiny; print(\'gvtiny at\', gvtiny.__file__)"\n')
    out = tmp_path / "out"
    p = _run("--part", "1", "--only", "telemetry", "--wheels", str(wheels), str(out),
             env=_env(tmp_path, py, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1"))
    tsv = _check_outdir(out, parts=(1,))[1]
    assert p.returncode == 0 and [(k, v[5]) for k, v in tsv.items()] == [("wheels", "ok"), ("telemetry", "ok")], \
        (p.stdout, p.stderr, _archived_log(out, 1, "wheels"))
    assert re.search(r"gvtiny at \S+/gpu-validate\.\w+/site/gvtiny/__init__\.py", _archived_log(out, 1, "telemetry"))
    p = _run("--part", "1", "--wheels", str(tmp_path), "--dry-run")  # a folder without wheels: said at once
    assert p.returncode == 2 and "holds no .whl file" in p.stderr


BLOCKER = """import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ClusterShell", "jsonschema", {extra}):
            sys.stderr.write(f"BLOCKED IMPORT {{name}}\\n")
            raise ImportError(f"{{name}} blocked: the GPU machine lacks it")
sys.meta_path.insert(0, _Blocked())
"""


def _blocked_env(tmp_path: Path, extra: str = "") -> dict:
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(extra=extra))
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}


@pytest.mark.slow
def test_no_step_needs_clustershell_or_jsonschema(tmp_path):
    env = _blocked_env(tmp_path)
    p = subprocess.run([sys.executable, "-c", "import jsonschema"], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "BLOCKED IMPORT jsonschema" in p.stderr  # the blocker works
    _, plan1 = _plan(1)
    _, plan2 = _plan(2)
    files = [f"tests/{m}" for _, _, _, cmd in plan1 + plan2 for m in re.findall(r"tests/(test_\w+\.py)", cmd)]
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                        *files], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "BLOCKED" not in p.stdout + p.stderr, p.stdout[-2000:] + p.stderr[-2000:]
    assert len(re.findall(r"^tests/test_\w+\.py::", p.stdout, re.M)) >= 40
    for args in (["run", "--level", "1", "--json", "--no-history", "--state-dir", str(tmp_path / "s")],
                 ["telemetry", "dump", "-o", str(tmp_path / "t.json")]):
        p = subprocess.run([sys.executable, "-m", "gpucheck", *args], env=env, capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
        assert p.returncode in (0, 3) and "BLOCKED" not in p.stderr, (args, p.stderr[-2000:])


@pytest.mark.slow
def test_env_names_what_is_missing_and_the_wheel_to_carry(tmp_path):
    p = subprocess.run([sys.executable, str(HELPER), "env"], env=_blocked_env(tmp_path, '"cupy", "pynvml"'),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(r"^missing: cupy-cuda13x nvidia-ml-py$", p.stdout, re.M), p.stdout
    for dist in ("cupy-cuda13x", "nvidia-ml-py"):
        line = re.search(rf"^carry its wheel: (.* -d \.whl {dist})$", p.stdout, re.M).group(1)
        assert "--no-deps --only-binary=:all:" in line and f"--python-version {sys.version_info[0]}." in line
    assert re.search(r"^ClusterShell absent: not needed by any step", p.stdout, re.M)
    assert re.search(r"^jsonschema absent: not needed by any step", p.stdout, re.M)
    assert re.search(r"^torch \S+ \(torch: ", p.stdout, re.M)  # what is there is named with its version


def _figures(step: str, d: Path) -> str:
    p = subprocess.run([sys.executable, str(HELPER), "figures", step, str(d)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 1, p.stdout + p.stderr
    return p.stdout.strip()


@pytest.mark.slow
def test_figures_read_the_benchmarks_and_gpucheck_outputs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def bench(name: str, *args: str) -> None:
        p = subprocess.run([sys.executable, f"benchmarks/{name}.py", "--device", "cpu", *args, "--json"], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout

    (tmp_path / "bench-burn.json").write_text(bench("bench_burn", "--dtype", "fp32", "--size", "64", "--seconds",
                                                    "0.3", "--window", "0.1", "--rounds", "1"))
    assert re.fullmatch(r"burn/bare \(goal >= 0\.97\): fp32 \d\.\d{3}", _figures("bench-burn", tmp_path))
    (tmp_path / "bench-memtest.json").write_text(bench("bench_memtest", "--bytes", "1M", "--rounds", "1"))
    assert re.fullmatch(r"memtest \d+ GB/s vs D2D copy \d+ GB/s: ratio \d\.\d{3} \(goal >= 0\.9\)",
                        _figures("bench-memtest", tmp_path))
    (tmp_path / "bench-copy.json").write_text(bench("bench_copy_bandwidth", "--workers", "1", "--bytes", "1M",
                                                    "--repeats", "2"))
    assert re.fullmatch(r"gpu0 h2d [\d.]+ d2h [\d.]+ d2d \d+ GB/s", _figures("bench-copy", tmp_path))
    p = subprocess.run([sys.executable, "-m", "gpucheck", "run", "--level", "1", "--json", "--no-history",
                        "--state-dir", str(tmp_path / "s"), "--output", str(tmp_path / "run-level1.json")], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert re.match(r"\w+ exit \d in [\d.]+ s, partial False, counts \{.*\}; slowest \S+ [\d.]+ s \w+",
                    _figures("run-level1", tmp_path)), p.stderr
    shutil.copy(ROOT / "tests/fixtures/snapshots/h100-healthy.json", tmp_path / "telemetry.json")
    assert _figures("telemetry", tmp_path) == "8 GPU(s) NVIDIA H100 80GB HBM3; driver 550.90.07; nvml ok True"
    assert _figures("bench-allreduce", tmp_path) == "" and _figures("unknown-step", tmp_path) == ""


@pytest.mark.slow
def test_figures_count_a_pytest_run_whole_or_cut_short(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n@pytest.mark.parametrize('b', [1, 2])\ndef test_a(b):\n    print(f'\\nline {b}')\n"
        "def test_f():\n    assert 0\ndef test_s():\n    pytest.skip('why')\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-v", "-s", "-rfEs", "-p", "no:cacheprovider", "test_x.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    (tmp_path / "pytest-x.log").write_text(p.stdout)
    assert _figures("pytest-x", tmp_path) == "1 failed, 2 passed, 1 skipped"
    cut = p.stdout[:p.stdout.index("test_x.py::test_f")] + "test_x.py::test_f "  # killed inside test_f
    (tmp_path / "pytest-x.log").write_text(cut)
    assert _figures("pytest-x", tmp_path) == "2 passed (cut short)"


def test_figures_read_bench_poets_kernel_table_and_ptxas_lines(tmp_path):
    header = "| dtype | b | tensor cores | CUDA cores | torch bmm+gather | torch bmm only | TC vs bmm+gather |"
    assert header in (ROOT / "benchmarks/bench_poet.py").read_text()  # the table the figures are read from
    # synthetic: the (a) table as bench_poet.kernel_table prints it (it needs a GPU), then (b)'s rows
    (tmp_path / "bench-poet.log").write_text(
        "## (a) Y = X[:, perm] · BD(G), m = 16384, n = 4096: TFLOP/s\n\n" + header + " x | x |\n"
        "| bf16 | 32 | 50.00 | 20.00 | 40.00 | 60.00 | 1.25 | 0.83 | 0.50 |\n"
        "| bf16 | 256 | 90.00 | 30.00 | 100.00 | 120.00 | 0.90 | 0.75 | 0.30 |\n\n"
        "## (b) POET forward\n\n| bf16 | 32 | 1.0 | 2.0 | 2.00 | 1.5 | 1.50 |\n")
    assert _figures("bench-poet", tmp_path) == "TC vs bmm+gather (goal >= 1.0 at b <= 128): bf16 b32 1.25, bf16 b256 0.90"
    # synthetic: nvcc --resource-usage's ptxas lines for two kernels of one source
    (tmp_path / "sass.log").write_text(
        "== poet.cu: nvcc\nptxas info    : Function properties for k1\n    0 bytes stack frame, 8 bytes spill stores, "
        "4 bytes spill loads\nptxas info    : Used 83 registers, used 1 barriers, 40448 bytes smem\n"
        "ptxas info    : Function properties for k2\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill "
        "loads\nptxas info    : Used 48 registers, 12544 bytes smem\n")
    assert _figures("sass", tmp_path) == "poet.cu: 2 kernels, max 83 registers, 12 spill bytes"


def test_only_a_core_step_skipped_for_time_makes_the_part_fail(tmp_path):
    py = _exe(tmp_path, "python3", "exit 0\n")
    for step, kind, rc in (("pytest-power", "extra", 0), ("pytest-busy", "core", 1)):
        out = tmp_path / step
        p = _run("--part", "2", "--only", step, "--budget", "5", str(out), env=_env(tmp_path, py))  # 5 s - 5 s reserve
        assert p.returncode == rc, (step, p.stdout, p.stderr)
        md = _md_rows((out / "gpu-validate-part2.md").read_text())
        assert md == {step: [kind, {"extra": "75", "core": "45"}[kind], "-", "-", "-", "skipped-for-time", ""]}, md


@pytest.mark.slow
def test_a_step_past_its_time_or_stopped_gets_to_clean_up(tmp_path):
    """SIGINT first (Python's KeyboardInterrupt: pytest's summary and XML, the benchmarks' finally
    blocks), though a script's background job starts with SIGINT ignored."""
    mark = tmp_path / "sleeping"
    (tmp_path / "stand.py").write_text(
        "import pathlib, sys, time\ntry:\n    print('started', flush=True)\n"
        f"    pathlib.Path({str(mark)!r}).touch()\n    time.sleep(300)\n"
        "except KeyboardInterrupt:\n    print('cleaned up', flush=True)\n    sys.exit(130)\n")
    py = _exe(tmp_path, "python3", f'exec "{sys.executable}" "{tmp_path / "stand.py"}"\n')
    out = tmp_path / "out"
    p = _run("--part", "2", "--only", "run-level2", str(out), env=_env(tmp_path, py, GV_TIME_SCALE="0.02"))
    assert p.returncode == 1 and _check_outdir(out, parts=(2,))[2]["run-level2"][5] == "timeout", p.stdout
    assert _archived_log(out, 2, "run-level2").split() == ["started", "cleaned", "up"]
    mark.unlink()
    out = tmp_path / "out2"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--part", "2", "--only", "run-level2", str(out)], cwd=ROOT,
                            env={**os.environ, **_env(tmp_path, py)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not mark.exists():
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _archived_log(out, 2, "run-level2").split() == ["started", "cleaned", "up"]
