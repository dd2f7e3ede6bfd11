"""Audit of issue 13 (the gate tells the truth): defects found by pushing on the merged fixes.

Each defect's test was committed marked xfail(strict=True), failing on the code of the time, and
the mark was removed with the fix: every one is fixed now, so each test guards its fix. The other
tests pin guarantees that held but had no test of their own.

Ordered by severity: a bad node passed or a healthy one failed first, then the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import pytest
from capped_run import private_device
from xid_log import xid79_config

from gpucheck import app
from gpucheck.core.config import read_on_error
from gpucheck.core.levels import Level
from gpucheck.core.verdict import RunFacts, build_verdict
from gpucheck.fleet import hook as hook_mod
from gpucheck.core.state import State
from gpucheck.platform.telemetry.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
HEALTHY, DBE = SNAPS / "h100-healthy.json", SNAPS / "h100-ecc-dbe.json"
ENV = {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice"}


def gpucheck_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


# -- 1. the last-pass Xid cursor moves after a run that judged only some GPUs ------------------------

def _live_node_with_an_xid_on_gpu1(tmp_path: Path, monkeypatch) -> Path:
    """This machine's NVML replaced by the healthy 8-GPU recording, and a kernel log (a file the
    xid check reads) holding Xid 79 on GPU 1, a few seconds ago. Returns the config."""
    snap = load_snapshot(HEALTHY)
    snap.pop("kernel_log", None)
    monkeypatch.setattr(app, "_collect_live", lambda *a, **k: json.loads(json.dumps(snap)))
    return xid79_config(tmp_path, snap["gpus"][1]["pci_bus_id"].rsplit(".", 1)[0])  # 0000:2a:00


def test_a_prolog_on_some_gpus_never_hides_another_gpus_xid_from_the_next_prolog(tmp_path, monkeypatch):
    config = _live_node_with_an_xid_on_gpu1(tmp_path, monkeypatch)
    calls: list[list[str]] = []

    def prolog(job: str, gpus: str) -> hook_mod.HookOutcome:
        opts = hook_mod.HookOptions("prolog", checks=["xid"], config_path=str(config),
                                    state_dir=str(tmp_path / "state"))
        environ = {**ENV, "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus}
        return hook_mod.run_hook(opts, environ, runner=lambda argv: (calls.append(argv), (0, "", ""))[1],
                                 log=lambda p, m: None)

    assert prolog("1", "0").exit_code == 0  # GPU 0 is fine: this job may run
    out = prolog("2", "1")  # GPU 1 fell off the bus a few seconds ago
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and out.judgement == "unhealthy", out.log_line


def test_a_run_on_some_gpus_never_hides_another_gpus_xid(tmp_path, monkeypatch, capsys):
    config = _live_node_with_an_xid_on_gpu1(tmp_path, monkeypatch)

    def run(gpus):
        return app.execute(app.RunRequest(check_patterns=["xid"], gpus=gpus, config_path=str(config),
                                          state_dir=str(tmp_path / "state"), json=True))

    assert run(None) == 1  # the whole node: GPU 1's Xid 79 fails it
    assert run([0]) == 0  # GPU 0 alone is fine
    assert run(None) == 1  # still the same node, still the same Xid


@pytest.mark.slow
def test_a_hung_nvml_never_starves_the_prolog_of_its_xid_check(tmp_path, monkeypatch):
    from gpucheck.platform.telemetry import snapshot as telemetry_snapshot

    release = threading.Event()
    monkeypatch.setattr(telemetry_snapshot, "collect_snapshot", lambda *a, **k: release.wait(60) and {})
    opts = hook_mod.HookOptions("prolog", config_path=str(xid79_config(tmp_path)), state_dir=str(tmp_path / "state"),
                                budget_s=4.0, skips=["repro.bitwise"])
    try:
        out = hook_mod.run_hook(opts, ENV, runner=lambda argv: (0, "", ""), log=lambda p, m: None)
    finally:
        release.set()  # the stand-in for the hung driver call returns
    xid = [r for r in out.verdict.results if r.check == "xid"]
    assert xid and not xid[0].summary.startswith("not run"), xid
    assert out.judgement == "unhealthy" and out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY, out.log_line


def test_a_job_gpu_missing_from_nvml_fails_the_prolog(tmp_path):
    snap = json.loads(HEALTHY.read_text())
    snap["gpus"] = [g for g in snap["gpus"] if g["index"] != 7]  # GPU 7 still on the PCI bus, gone from NVML
    seven = tmp_path / "seven-of-eight.json"
    seven.write_text(json.dumps(snap))
    calls: list[list[str]] = []
    opts = hook_mod.HookOptions("prolog", snapshot=str(seven), state_dir=str(tmp_path / "state"))
    out = hook_mod.run_hook(opts, {**ENV, "SLURM_JOB_GPUS": "7"},
                            runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    assert out.judgement == "unhealthy" and out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY, out.log_line
    assert calls and calls[0][3] == "State=DRAIN"


# -- 2. a signal after the verdict: the hook dies, the wrapper lets the job run on a bad node -------------

@pytest.mark.slow
def test_sigterm_while_the_prolog_drains_keeps_the_unhealthy_exit(tmp_path):
    marker = tmp_path / "scontrol-called"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{marker}"\nsleep 3\n')
    scontrol.chmod(0o755)
    argv = [sys.executable, "-m", "gpucheck", "slurm", "prolog", "--snapshot", str(DBE),
            "--state-dir", str(tmp_path / "state"), "--scontrol", str(scontrol)]
    p = subprocess.Popen(argv, env=gpucheck_env(**ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        t0 = time.monotonic()
        while not marker.exists() and p.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        assert marker.exists(), "the prolog never called scontrol"
        p.send_signal(signal.SIGTERM)  # the node is judged and being drained: Slurm's timeout, a Ctrl-C
        p.wait(timeout=30)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the fake scontrol left behind, by our child's group
        except ProcessLookupError:
            pass
        p.wait()
    assert "update NodeName=gpu7 State=DRAIN" in marker.read_text()
    assert p.returncode == hook_mod.EXIT_HOOK_UNHEALTHY


# -- 3. a failing stdout turns `gpucheck run` on a healthy node into exit 1 (unhealthy) -----------------

def _run_healthy(tmp_path: Path, stdout, **env: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gpucheck", "run", "--snapshot", str(HEALTHY), "--state-dir", str(tmp_path / "state")]
    return subprocess.run(argv, env=gpucheck_env(**env), stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


def _history_lines(tmp_path: Path) -> int:
    path = tmp_path / "state" / "history.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_full_stdout_never_turns_a_healthy_run_into_exit_1(tmp_path):
    full = private_device(tmp_path, "full", 1, 7)  # our own /dev/full
    with open(full, "w") as sink:
        r = _run_healthy(tmp_path, sink)
    assert r.returncode == 0, r.stderr[-600:]
    assert "Traceback" not in r.stderr
    assert _history_lines(tmp_path) == 1


@pytest.mark.slow
def test_a_closed_stdout_pipe_never_turns_a_healthy_run_into_exit_1(tmp_path):
    argv = [sys.executable, "-m", "gpucheck", "run", "--snapshot", str(HEALTHY), "--state-dir", str(tmp_path / "state"),
            "--json"]
    p = subprocess.Popen(argv, env=gpucheck_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # nobody reads the verdict (bigger than a pipe's buffer)
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) == 0, err[-600:]
    assert _history_lines(tmp_path) == 1


@pytest.mark.slow
def test_the_table_prints_bus_ids_as_they_are(tmp_path):
    """rich turned ':ab:' of a PCI bus id into an emoji: the table showed the wrong bus id, and a
    non-UTF-8 stdout crashed a healthy run with exit 1. (The default view is the grid, which
    prints a passing result's summary nowhere: the full table, -v, does.)"""
    import io

    from gpucheck.render.terminal import print_verdict

    captured: list = []
    assert app.execute(app.RunRequest(snapshot_path=str(HEALTHY), history=False, json=True),
                       on_verdict=captured.append) == 0
    buf = io.StringIO()
    print_verdict(captured[0], file=buf, verbose=True)
    assert "0000:ab:00.0" in buf.getvalue()  # GPU 5 of the recording
    r = _run_healthy(tmp_path, subprocess.DEVNULL, PYTHONIOENCODING="latin-1")
    assert r.returncode == 0, r.stderr[-600:]


# -- 4. a site's fail-closed choice is lost when its config has a BOM, or a TOML form the wrapper misses --

def test_fail_closed_survives_a_byte_order_mark(tmp_path):
    config = tmp_path / "config.toml"
    config.write_bytes('\ufeff[run]\non_error = "fail"\n'.encode())
    assert read_on_error(config) == "fail"
    calls: list[list[str]] = []
    opts = hook_mod.HookOptions("prolog", config_path=str(config), snapshot=str(HEALTHY), state_dir=str(tmp_path / "s"))
    out = hook_mod.run_hook(opts, ENV, runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    assert out.judgement == "could-not-judge"  # the config is not valid TOML
    assert out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and calls  # ... and asks to fail closed


WRAPPER = ROOT / "scripts" / "slurm" / "gpucheck-hook.sh"


@pytest.mark.parametrize("text", ['\ufeff[run]\non_error = "fail"\n', '["run"]\non_error = "fail"\n',
                                  'run = { on_error = "fail" }\n'], ids=["bom", "quoted-table", "inline-table"])
def test_wrapper_fails_closed_for_every_toml_spelling_of_run_on_error(tmp_path, text):
    (tmp_path / "config.toml").write_bytes(text.encode())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(  # `show config` (the wrapper's PrologEpilogTimeout): nothing set
        f'#!/bin/sh\ncase "$1" in show) exit 0 ;; esac\nprintf "%s\\n" "$*" >> "{tmp_path}/scontrol.calls"\n')
    (bin_dir / "logger").write_text("#!/bin/sh\n")
    for tool in ("scontrol", "logger"):
        (bin_dir / tool).chmod(0o755)
    hook = tmp_path / "gpucheck-prolog.sh"
    hook.write_text(WRAPPER.read_text())
    (tmp_path / "gpucheck-slurm.env").write_text(
        f'PATH="{bin_dir}:$PATH"\nGPUCHECK="{tmp_path}/nowhere"\nGPUCHECK_ARGS="--config {tmp_path}/config.toml"\n')
    r = subprocess.run(["/bin/sh", str(hook)], env={"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert (tmp_path / "scontrol.calls").read_text().startswith("update NodeName=n1 State=DRAIN")


# -- 5. a config nested too deeply: the hooks crash with a traceback ------------------------------------

def deep_config(tmp_path: Path) -> Path:
    config = tmp_path / "deep.toml"
    config.write_text('[run]\non_error = "fail"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    return config


def test_a_deeply_nested_config_is_could_not_judge_in_a_hook(tmp_path):
    config = deep_config(tmp_path)
    assert read_on_error(config) == "fail"
    calls: list[list[str]] = []
    opts = hook_mod.HookOptions("prolog", config_path=str(config), snapshot=str(HEALTHY), state_dir=str(tmp_path / "s"))
    out = hook_mod.run_hook(opts, ENV, runner=lambda argv: (calls.append(argv), (0, "", ""))[1], log=lambda p, m: None)
    assert out.judgement == "could-not-judge" and out.exit_code == hook_mod.EXIT_HOOK_UNHEALTHY and calls


def test_a_deeply_nested_config_is_a_usage_error_for_run(tmp_path, capsys):
    """Holds (untested): `gpucheck run` reads the config through safeio/tomllib with the
    RecursionError caught: exit 2 naming the file."""
    from gpucheck.cli.main import main

    rc = main(["run", "--snapshot", str(HEALTHY), "--no-history", "--config", str(deep_config(tmp_path))])
    err = capsys.readouterr().err
    assert rc == 2 and "deep.toml" in err and "nested too deeply" in err


def _read_on_error_with_a_deadline(path: Path, seconds: float) -> tuple[bool, object]:
    box: dict[str, object] = {}
    th = threading.Thread(target=lambda: box.setdefault("v", read_on_error(path)), daemon=True)
    th.start()
    th.join(seconds)
    hung = th.is_alive()
    if hung:  # release the reader blocked in open(): a writer comes and goes (EOF)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        th.join(5)
    return hung, box.get("v")


def test_a_fifo_config_never_hangs_a_hook(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    hung, value = _read_on_error_with_a_deadline(fifo, 3.0)
    assert not hung and value is None


# -- 6. bisect names a node BAD because its GPU is in use ------------------------------------------------

def test_bisect_never_names_a_node_bad_because_its_gpu_is_busy(monkeypatch):
    from gpucheck.fleet import bisect as B
    from gpucheck.fleet.bisect.builtin import CollectiveTest
    from gpucheck.nccl import launch as L

    def run_group(hosts, launcher, args, *, deadline_s, index=0, **kw):
        if "n3" in hosts:
            summary = "rank 2 on host n3 did not start: GPU 0 is in use by PID 4711 (python)"
            return {"status": "error", "summary": summary, "results": [], "launch_errors": {},
                    "failure": {"kind": "busy", "host": "n3", "rank": 2, "summary": summary}}
        return {"status": "ok", "summary": "ok", "launch_errors": {}, "failure": None,
                "results": [{"op": "all_reduce", "bytes": 1 << 24, "busbw_gbs": 10.0, "algbw_gbs": 5.0}]}

    monkeypatch.setattr(L, "run_group", run_group)
    test = CollectiveTest(L.Launcher(), [], deadline_s=10.0, ops=("all_reduce",))
    result = B.bisect(["n1", "n2", "n3", "n4"], test, min_group=2)
    assert "n3" not in result.bad_nodes
    assert result.to_dict()["exit_code"] == 3  # could not judge the busy node, nothing localized


def test_nccl_pairs_with_a_node_it_never_measured_is_not_healthy(monkeypatch, capsys):
    import gpucheck.nccl.pairs_run as pairs_run
    from gpucheck.cli.main import main
    from gpucheck.nccl.pairs import PairOutcome

    def run_plan(plan, lau, args, **kw):
        out = []
        for number, pairs in enumerate(plan):
            for pair in pairs:
                if "n3" in pair:
                    out.append(PairOutcome(number, pair, "error", summary="rank 1 on host n3 did not start: GPU 0 "
                                           "is in use by PID 4711 (python)", failure={"kind": "busy", "host": "n3"}))
                else:
                    out.append(PairOutcome(number, pair, "ok", busbw_gbs=10.0, algbw_gbs=5.0, time_s=0.1,
                                           bytes=1 << 24))
        return out

    monkeypatch.setattr(pairs_run, "run_plan", run_plan)
    rc = main(["nccl", "pairs", "n[1-4]"])
    out = capsys.readouterr().out
    assert "UNMEASURED" in out  # n3 was never tested ...
    assert rc == 3  # ... so the node set could not be judged


# -- 7. NaN thresholds on the command line --------------------------------------------------------------

NAN_OPTIONS = [
    ("gpucheck.cli.sweep:sweep_command", ["n1"], "--mad-z"),
    ("gpucheck.cli.sweep:sweep_command", ["n1"], "--rel-floor"),
    ("gpucheck.cli.bisect:bisect_command", ["n[1-4]"], "--slow-limit"),
    ("gpucheck.cli.bisect:bisect_command", ["n[1-4]"], "--min-busbw"),
    ("gpucheck.cli.bisect:bisect_command", ["n[1-4]"], "--flake-rate"),
    ("gpucheck.cli.nccl:pairs_command", ["n[1-4]"], "--slow-limit"),
    ("gpucheck.cli.nccl:pairs_command", ["n[1-4]"], "--min-busbw"),
    ("gpucheck.cli.eud:eud_command", [], "--memtest-fraction"),
]


def _command(target: str) -> click.Command:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("target, args, option", NAN_OPTIONS, ids=[f"{t.split(':')[1]}{o}" for t, _, o in NAN_OPTIONS])
def test_a_nan_threshold_on_the_command_line_is_a_usage_error(target, args, option):
    command = _command(target)
    with pytest.raises(click.BadParameter):
        command.make_context(command.name, [*args, option, "nan"])


def test_a_nan_mad_z_would_let_a_slow_node_pass():
    """Why the option matters: the comparison itself has no defence (it is given checked input)."""
    from gpucheck.fleet.compare import low_outliers

    values = {"n1": 100.0, "n2": 101.0, "n3": 99.0, "n4": 40.0}
    assert low_outliers(values).outliers.keys() == {"n4"}
    assert low_outliers(values, mad_z=float("nan")).outliers == {}


# -- 8. two prologs at once lose a job's record ----------------------------------------------------------

@pytest.mark.slow
def test_two_prologs_at_once_both_remember_their_job(tmp_path, monkeypatch):
    barrier = threading.Barrier(2, timeout=3)
    real = State.read_cursor

    def read_then_meet(self, name):
        value = real(self, name)
        if name == hook_mod.JOBS_CURSOR:
            try:
                barrier.wait()  # both prologs have read the cursor before either writes it
            except threading.BrokenBarrierError:
                pass
        return value

    monkeypatch.setattr(State, "read_cursor", read_then_meet)
    healthy = build_verdict([], RunFacts(level=Level.QUICK, started_at=0.0, duration_s=0.0, checks=(), software={},
                                         host="gpu7"))  # exit 0, no result, no GPU

    def execute(req, on_verdict, on_warning=None):
        on_verdict(healthy)
        return 0

    def prolog(job: str) -> None:
        opts = hook_mod.HookOptions("prolog", state_dir=str(tmp_path / "state"))
        hook_mod.run_hook(opts, {**ENV, "SLURM_JOB_ID": job}, runner=lambda argv: (0, "", ""), log=lambda p, m: None,
                          execute=execute)

    threads = [threading.Thread(target=prolog, args=(job,)) for job in ("101", "102")]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    monkeypatch.undo()
    jobs = State(tmp_path / "state").read_cursor(hook_mod.JOBS_CURSOR)
    assert set(jobs) == {"101", "102"}


# -- guarantees that hold (variations of the items, untested until now) --------------------------

@pytest.mark.slow
def test_repro_record_of_an_explicit_cuda_run_without_a_gpu_exits_3_and_records_nothing(tmp_path):
    """`repro record --device cuda` where CUDA cannot run: the command's purpose did not run
    (exit 3, the reason on stderr) and no reference file appears."""
    out = tmp_path / "refs.json"
    r = subprocess.run([sys.executable, "-m", "gpucheck", "repro", "record", "--device", "cuda", "--out", str(out)],
                       env=gpucheck_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr[-600:]
    assert "cannot record" in r.stderr and not out.exists()


def test_a_usage_error_in_the_epilogs_own_arguments_never_drains(tmp_path, capsys):
    """The epilog's own options (--failed-budget) reach the same could-not-judge path as the
    prolog's: exit 0 with on-error pass, nothing drained, the cause recorded."""
    from gpucheck.cli.main import main

    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\n')
    scontrol.chmod(0o755)
    rc = main(["slurm", "epilog", "--failed-budget", "0s", "--scontrol", str(scontrol),
               "--state-dir", str(tmp_path / "state"), "--snapshot", str(DBE)])
    err = capsys.readouterr().err
    assert rc == 0 and not (tmp_path / "calls").exists()
    assert "usage error in the hook's arguments" in err and "--failed-budget" in err
