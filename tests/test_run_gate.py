"""The run pipeline never passes a node it did not examine: check order and the run's time limit
(read-only checks first, compute checks only with a meaningful slice of what is left), --timeout
as a hard limit, promised durations that a timeout never silently shortens, explicit compute
requests that could not run, the verdict's level, and --inject that nothing can honour."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpucheck import app as app_mod
from gpucheck.core.check import Context, Need, Slice, define, missing_need
from gpucheck.core.levels import Level
from gpucheck.cli.main import main
from gpucheck.core.result import Result, Status
from gpucheck.core.runner import limits, run_checks
from gpucheck.core.verdict import SCHEMA, RunFacts, build_verdict, verdict_level

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
DCGM = ROOT / "tests" / "fixtures" / "dcgm"


def cli_json(capsys, *argv: str) -> tuple[int, dict | None, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    v = json.loads(out) if out.strip() else None
    if v is not None:
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.Draft202012Validator(SCHEMA).validate(v)
        assert v["exit_code"] == rc
    return rc, v, err


def by_check(v: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in v["results"]:
        out.setdefault(r["check"], []).append(r)
    return out


def no_gpu_here() -> bool:
    return missing_need(Need.GPU, Context(snapshot={"gpus": []})) is not None and \
        missing_need(Need.TORCH, Context(device="cuda")) is not None


# -- 1. order and budget ----------------------------------------------------------------------------

def test_read_only_checks_run_before_compute_checks_and_are_listed_as_selected():
    order = []

    def rec(name):
        def fn(ctx):
            order.append(name)
            return [Result(name, Status.PASS, "ok")]
        return fn

    checks = [define("a.compute", title="", level=1, needs=(Need.GPU,))(rec("a.compute")),
              define("b.read", title="", level=1)(rec("b.read")),
              define("c.loads", title="", level=1, compute=True)(rec("c.loads")),
              define("d.read", title="", level=1)(rec("d.read"))]
    out = run_checks(checks, Context(device="cpu"), install_signal_handlers=False)
    assert order == ["b.read", "d.read", "a.compute", "c.loads"]
    assert [r.check_id for r in out.runs] == ["a.compute", "b.read", "c.loads", "d.read"]


def test_a_compute_check_without_a_meaningful_slice_is_not_run_and_says_so():
    ran = []

    def compute(ctx):
        ran.append(ctx.deadline)
        return [Result("heavy", Status.PASS, "ok")]

    heavy = define("heavy", title="", level=1, needs=(Need.GPU,),
                   min_slice_fn=lambda ctx: Slice(30.0, "30 s of load after start-up"))(compute)
    light = define("light", title="", level=1)(lambda ctx: [Result("light", Status.PASS, "ok")])
    out = run_checks([heavy, light], Context(device="cpu"), timeout_s=5.0, install_signal_handlers=False)
    assert not ran
    (r,) = out.runs[0].results
    assert r.status is Status.ERROR and r.summary.startswith("not run: the run's time limit leaves ")
    assert "heavy needs at least 30.0 s (30 s of load after start-up)" in r.summary
    assert r.metrics["time_needed_s"] == 30.0 and r.metrics["time_left_s"] < 5.0
    assert out.runs[1].status is Status.PASS  # the read-only check ran, first
    assert out.interrupted == "timeout"  # the time limit cut the run: exit 3, never a pass


@pytest.mark.slow
def test_a_check_stopped_by_the_deadline_leaves_the_run_partial_even_when_it_is_the_last():
    """A check still running when the checks' time is up (3 s less the stop and output reserves:
    2.2 s) is cancelled; one that returns in its stop time (a pass that ignored the cancel) leaves
    the run partial. The old runner marked a run cut short only when a result's summary said
    "whole-run timeout", and gave no stop time inside the limit at all."""
    def slow(ctx):
        time.sleep(2.45)  # ignores cancel, returns a pass after the deadline, before the stop point
        return [Result("slow", Status.PASS, "fine")]

    out = run_checks([define("slow", title="", level=1)(slow)], Context(), timeout_s=3.0,
                     install_signal_handlers=False)
    assert out.interrupted == "timeout" and out.partial
    assert "stopped early by the whole-run timeout" in out.runs[0].results[0].evidence


def test_prolog_budget_runs_every_read_only_check_before_repro(capsys, tmp_path):
    """`gpucheck slurm prolog --device cpu --budget 2s`: repro.bitwise's torch workers used to eat
    the budget, and xid became "not run". Now the read-only checks run first, and repro gets what
    is left: not started when that cannot hold its workers' start-up, stopped at the deadline
    otherwise; either way an error (could not judge, exit 3), which the hook only logs.

    Eight workers, as on an 8-GPU node: with the default two, an idle 2-core machine can finish
    one worker's runs inside the 2 s and not the other's, and the GPU that finished rightly
    passes (a race this test is not about)."""
    rc = main(["slurm", "prolog", "--device", "cpu", "--workers", "8", "--budget", "2s", "--no-drain", "--json",
               "--state-dir", str(tmp_path)])
    stdout, err = capsys.readouterr()
    v = json.loads(stdout)
    checks = {c["id"]: c for c in v["checks"]}
    assert checks["xid"]["status"] != "error"  # examined, whatever the kernel log says
    repro = by_check(v)["repro.bitwise"]
    if checks["repro.bitwise"]["status"] != "pass":  # a fast machine may fit it in 2 s
        assert all(r["status"] == "error" for r in repro)
        assert repro[0]["summary"].startswith(("not run: the run's time limit leaves", "not finished",
                                               "cut short"))
        assert v["exit_code"] == 3 and v["status"] == "error" and v["partial"]
        assert rc == 0 and "could not judge" in err  # on-error pass: gpucheck's own limit never drains


def test_limits_reserve_the_stop_and_the_output_inside_the_timeout():
    lim = limits(100.0, 15.0)
    assert lim.end == 115.0 and lim.stop_by == pytest.approx(114.7) and lim.stop_s == pytest.approx(1.5)
    assert lim.deadline == pytest.approx(113.2)
    tiny = limits(0.0, 0.4)  # a tiny limit still leaves the checks some of it
    assert 0 < tiny.deadline < tiny.stop_by < tiny.end == 0.4


# -- 2. --timeout is a hard limit -------------------------------------------------------------------

def test_a_check_that_ignores_cancel_is_abandoned_at_the_limit():
    release = threading.Event()

    def stubborn(ctx):
        release.wait(20)
        return [Result("stubborn", Status.PASS, "late")]

    t0 = time.monotonic()
    out = run_checks([define("stubborn", title="", level=1, budget_s=60)(stubborn)], Context(), timeout_s=1.0,
                     install_signal_handlers=False)
    took = time.monotonic() - t0
    release.set()
    assert took <= 1.0 + 0.2, took  # the old runner waited its 5 s cancel grace on top
    (r,) = out.results
    assert r.status is Status.ERROR and "did not stop within" in r.summary
    assert out.abandoned and out.interrupted == "timeout"


def _caught_sigterm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def _still_running(psutil, procs, within_s: float):
    deadline = time.monotonic() + within_s
    while True:
        live = []
        for k in procs:
            try:
                if k.is_running() and k.status() != psutil.STATUS_ZOMBIE:
                    live.append(k)
            except psutil.Error:
                pass
        if not live or time.monotonic() >= deadline:
            return live
        time.sleep(0.02)


@pytest.mark.slow
def test_timeout_ends_the_whole_run_with_its_workers_inside_the_limit():
    """A burn whose GPU 0 hangs, under --timeout 6s: the old runner shortened the burn, waited for
    the hung worker's stop and kill on top of the limit (about 10 s). The whole run, stopping
    the workers and writing the verdict, now ends within the limit plus 1 s of gpucheck's first
    line (docs/run.md's margin); the interpreter's own start comes before that line."""
    psutil = pytest.importorskip("psutil")
    timeout = 6.0
    p = subprocess.Popen(
        [sys.executable, "-m", "gpucheck", "burn", "--device", "cpu", "--workers", "2", "--size", "64",
         "--dtype", "fp32", "--duration", "2s", "--timeout", f"{timeout:g}s", "--inject", "hang:gpu=0,after=0.2",
         "--json", "--no-history"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        t_popen = time.monotonic()
        while not _caught_sigterm(p.pid) and p.poll() is None and time.monotonic() - t_popen < 30:
            time.sleep(0.001)
        t_armed = time.monotonic()
        kids = []
        while p.poll() is None:
            try:
                kids.extend(k for k in psutil.Process(p.pid).children() if k not in kids)
            except psutil.Error:
                pass
            time.sleep(0.02)
        t_end = time.monotonic()
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert t_end - t_armed <= timeout + 1.0, (t_end - t_armed, err)
    assert t_end - t_popen <= timeout + 2.0, (t_end - t_popen, err)  # generous: a loaded machine
    v = json.loads(out)
    assert p.returncode == 3 and v["exit_code"] == 3 and v["duration_s"] <= timeout
    # The workers were killed before gpucheck exited; a process killed a moment ago may still be
    # leaving (exit in progress, reparented): give it 2 s, an orphan would stay for good.
    assert not _still_running(psutil, kids, within_s=2.0)


# -- 3. a timeout never silently shortens what a level or --duration promised ----------------------

def test_a_one_hour_burn_under_a_six_second_timeout_is_not_run_not_shortened(capsys):
    rc, v, _ = cli_json(capsys, "burn", "--device", "cpu", "--duration", "1h", "--timeout", "6s", "--json",
                        "--no-history")
    assert rc == 3 and v["status"] == "error"
    (r,) = v["results"]
    assert r["status"] == "error"
    assert "burn.gemm needs at least 3600." in r["summary"]
    assert "(3600 s of burn (--duration) after at least " in r["summary"]
    assert not any("shortened" in e for e in r["evidence"])


@pytest.mark.parametrize("check,promise", [("burn.gemm", "300 s of burn (the level-3 default)"),
                                           ("poet.ortho", "300 s of POET problems (the level-3 default)")])
def test_the_readme_config_timeout_does_not_cut_a_level_3_check(capsys, tmp_path, check, promise):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[run]\ntimeout = 60\n")
    rc, v, _ = cli_json(capsys, "run", "--level", "3", "--check", check, "--device", "cpu", "--config", str(cfg),
                        "--json", "--no-history")
    assert rc == 3
    (r,) = v["results"]
    assert r["status"] == "error" and promise in r["summary"] and "not run: " in r["summary"]


def test_cut_short_turns_a_pass_into_an_error_naming_the_promise():
    from gpucheck.workers.per_gpu import Promise, cut_short, promised

    ctx = Context(level=Level.STANDARD)
    pr = promised(ctx, {"duration_s_level2": 30.0}, "burn", 5.0)  # --duration 5
    assert pr == Promise(5.0, "--duration", "burn")
    assert promised(Context(level=Level.EXTENDED), {"duration_s_level3": 300.0}, "burn").source == \
        "the level-3 default"
    r = cut_short(Result("burn.gemm", Status.PASS, "bf16 600 TFLOP/s", gpu=0), pr, 1.25, "cancelled")
    assert r.status is Status.ERROR
    assert r.summary == "cut short: 5 s of burn (--duration) promised, stopped (cancelled) after 1.2 s"
    assert r.evidence[0] == "before the stop: pass: bf16 600 TFLOP/s"
    assert r.metrics["promised_s"] == 5.0 and r.metrics["ran_s"] == 1.25
    fail = cut_short(Result("burn.gemm", Status.FAIL, "silent data corruption", gpu=0), pr, 1.0, "cancelled")
    assert fail.status is Status.FAIL  # a fault seen in partial data stands


def test_an_explicit_short_duration_fits_the_time_limit():
    from gpucheck.workers.per_gpu import deadline_problem, promised

    ctx = Context(level=Level.STANDARD, device="cpu", workers=1)
    ctx.deadline = time.monotonic() + 10.0
    assert deadline_problem(ctx, "burn.gemm", promised(ctx, {"duration_s_level2": 30.0}, "burn", 2.0)) is None
    # the level-2 default, 30 s, does not fit in 10 s
    problem = deadline_problem(ctx, "burn.gemm", promised(ctx, {"duration_s_level2": 30.0}, "burn"))
    assert problem is not None and problem.status is Status.ERROR and "the level-2 default" in problem.summary


# -- 4. explicit requests that could not be honoured are not healthy -----------------------------

@pytest.mark.parametrize("argv", [["burn", "--device", "cuda"], ["poet", "--device", "cuda"],
                                  ["eud", "--device", "cuda", "--level", "2"], ["repro", "check", "--device", "cuda"],
                                  ["burn"], ["repro", "check"], ["run", "--check", "eud.dcgm"]])
def test_a_command_whose_purpose_did_not_run_exits_3(capsys, tmp_path, monkeypatch, argv):
    if not no_gpu_here():
        pytest.skip("this machine can compute on a GPU")
    monkeypatch.setenv("PATH", str(tmp_path))  # no dcgmi
    rc, v, _ = cli_json(capsys, *argv, "--json", "--no-history")
    assert rc == 3 and v["status"] == "error"
    assert v["results"] and all(r["status"] == "skip" and r.get("unexamined") is True for r in v["results"])


def test_no_gpu_at_all_and_device_auto_leaves_compute_skips_plain(capsys):
    if not no_gpu_here():
        pytest.skip("this machine can compute on a GPU")
    rc, v, _ = cli_json(capsys, "run", "--level", "2", "--json", "--no-history")
    compute = [r for r in v["results"] if r["check"] in ("burn.gemm", "poet.ortho", "repro.bitwise")]
    assert compute and all(r["status"] == "skip" and "unexamined" not in r for r in compute)
    assert rc != 3 or any(r["status"] == "error" for r in v["results"])  # any 3 comes from an error


def test_gpus_in_nvml_but_a_cpu_only_torch_is_not_healthy(capsys, monkeypatch):
    """A GPU node (NVML shows 8 GPUs) whose torch is a CPU-only build: `run --level 2` used to
    skip every compute check and exit 0."""
    from gpucheck.core import check as check_mod
    from gpucheck.platform.telemetry.snapshot import load_snapshot

    snap = load_snapshot(str(SNAPS / "h100-healthy.json"))
    monkeypatch.setattr(app_mod, "_collect_live", lambda *a, **k: snap)
    monkeypatch.setattr(check_mod, "_torch_has_cuda", lambda spec: False)
    rc, v, _ = cli_json(capsys, "run", "--level", "2", "--skip", "xid", "--json", "--no-history")
    assert rc == 3 and v["status"] == "error"
    burn = by_check(v)["burn.gemm"][0]
    assert burn["status"] == "skip" and burn["unexamined"] is True and "CPU-only build" in burn["summary"]


def test_cupy_is_needed_on_gpus_only():
    from gpucheck.tests_suite.eud_memtest import memtest

    assert Need.CUPY in memtest.spec.needs
    assert missing_need(Need.CUPY, Context(device="cpu")) is None


# -- 5. the verdict's level ---------------------------------------------------------------------------

FAKE_DCGMI = """#!/bin/sh
case "$1" in
discovery) echo "1 GPU found."; exit 0 ;;
diag) cat "$FAKE_DCGMI_FIXTURE"; exit 0 ;;
esac
exit 2
"""


def test_run_check_eud_dcgm_reports_the_level_it_ran_at(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "dcgmi"
    fake.write_text(FAKE_DCGMI)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_DCGMI_FIXTURE", str(DCGM / "v3_r3_all_pass.json"))
    rc, v, _ = cli_json(capsys, "run", "--check", "eud.dcgm", "--json", "--no-history",
                         "--force")  # no NVML here: the load guard cannot tell the GPUs are free
    assert any(r["status"] == "pass" for r in v["results"])
    assert v["level"] == 3 and v["level_name"] == "extended"  # dcgmi diag -r 3 ran; the old verdict said 1


def test_verdict_level_rules():
    assert verdict_level([1, 3, 2], Level.QUICK, [1, 3]) == Level.EXTENDED
    assert verdict_level([], Level.EXTENDED, [2]) == Level.STANDARD  # nothing ran: claim no more
    from gpucheck.tests_suite.burn_gemm import burn_gemm
    from gpucheck.tests_suite.repro_bitwise import repro_bitwise

    assert burn_gemm.spec.run_level(3) == 3 and burn_gemm.spec.run_level(1) == 2
    assert repro_bitwise.spec.run_level(4) == 2 and repro_bitwise.spec.run_level(1) == 1
    v = build_verdict([], RunFacts(level=Level.EXTENDED, started_at=0.0, duration_s=0.0, checks=(), software={},
                                   host="n1")).to_json()
    assert v["level"] == 3 and v["level_name"] == "extended"


def test_a_level_2_run_that_only_ran_level_1_checks_says_level_1(capsys):
    rc, v, _ = cli_json(capsys, "run", "--level", "2", "--snapshot", str(SNAPS / "h100-healthy.json"), "--json",
                        "--no-history")
    assert rc == 0 and v["level"] == 1  # every compute check skipped (a replay is not this node)


# -- 6. --inject that nothing can honour on this run ---------------------------------------------

@pytest.mark.parametrize("argv,needle", [
    (["run", "--snapshot", str(SNAPS / "h100-healthy.json"), "--inject", "bitflip:gpu=0"],
     "no check that honours 'bitflip' can run here (repro.bitwise: judging a recorded snapshot"),
    (["burn", "--device", "cpu", "--workers", "2", "--inject", "bitflip:gpu=7"],
     "no CPU worker 7 is tested on this run (CPU workers tested: 0,1)"),
    (["burn", "--device", "cpu", "--workers", "2", "--gpus", "0", "--inject", "slow:gpu=1,factor=0.5"],
     "no CPU worker 1 is tested on this run (CPU workers tested: 0)"),
    (["eud", "--device", "cpu", "--check", "eud.power", "--inject", "throttle:gpu=0"],
     "no check that honours 'throttle' can run here (eud.power: no power telemetry"),
    (["burn", "--device", "cpu", "--inject", "hang:gpu=x"], "gpu must be an index, not 'x'"),
])
def test_an_injection_nothing_can_honour_is_a_usage_error(capsys, argv, needle):
    rc = main([*argv, "--json", "--no-history"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_an_injection_is_decided_before_any_check_runs(monkeypatch, capsys):
    called = []
    monkeypatch.setattr(app_mod, "_run", lambda *a, **k: called.append(a))
    rc = main(["burn", "--device", "cpu", "--workers", "2", "--inject", "bitflip:gpu=2", "--json", "--no-history"])
    capsys.readouterr()
    assert rc == 2 and not called


def test_injection_on_a_replay_with_cpu_workers_is_honoured():
    """--device cpu computes on CPU workers even while judging a snapshot: the injection stands."""
    def req(text):
        return app_mod.RunRequest(check_patterns=["repro.bitwise"], device="cpu", workers=2, history=False,
                                  snapshot_path=str(SNAPS / "h100-healthy.json"), injections=[text])

    assert [i.text for i in app_mod.prepare(req("bitflip:gpu=1")).injections] == ["bitflip:gpu=1"]
    with pytest.raises(app_mod.UsageError, match="no CPU worker 9 is tested"):
        app_mod.prepare(req("bitflip:gpu=9"))


@pytest.mark.slow
def test_repro_determinism_settings_do_not_import_inductor():
    """torch.use_deterministic_algorithms imports torch._inductor (about 2.3 s of CPU in torch
    2.13, more than torch itself), once per worker, that is per GPU, in every level-1 run."""
    pytest.importorskip("torch")
    code = ("import sys, torch\n"
            "from gpucheck.repro.workloads import determinism\n"
            "with determinism(torch) as s:\n"
            "    assert s['deterministic_algorithms'] and torch.are_deterministic_algorithms_enabled()\n"
            "assert not torch.are_deterministic_algorithms_enabled()\n"
            "assert 'torch._inductor' not in sys.modules, 'torch._inductor imported'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert p.returncode == 0, p.stderr[-1500:]
