"""The worker pool on its own, with small targets (spawned processes, no torch): ok, crash,
killed by a signal, hang, cancel, over budget, and the NVML sampler beside it."""

from __future__ import annotations

import os
import signal
import threading
import time
from io import StringIO

import pytest

from gpucheck.workers import pool as pool_mod
from gpucheck.workers.pool import (
    CANCELLED,
    CRASHED,
    HUNG,
    OK,
    OVER_BUDGET,
    WorkerJob,
    run_workers,
)
from gpucheck.workers.sampler import Sampler, summarize
from gpucheck.platform.telemetry.fake import FakeTelemetry

# Short limits: these targets answer in milliseconds.
FAST = dict(heartbeat_timeout_s=1.5, startup_timeout_s=30.0, stop_grace_s=1.0, term_grace_s=0.5,
            kill_wait_s=2.0, poll_s=0.05)


# -- targets (module level: spawned workers import them by name) ------------------------------------
def double_target(args, chan):
    chan.progress({"step": 1, "gpu": chan.gpu})
    return {"double": args["x"] * 2, "gpu": chan.gpu, "device": chan.device,
            "cuda_order": os.environ.get("CUDA_DEVICE_ORDER")}


def raise_target(args, chan):
    chan.heartbeat(force=True)
    raise ValueError("boom in the worker")


def sigkill_target(args, chan):
    chan.progress({"step": 1})
    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    time.sleep(30)


def exit3_target(args, chan):
    chan.heartbeat(force=True)
    os._exit(3)


def hang_target(args, chan):
    chan.progress({"step": 7})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a process stuck in a kernel
    while True:
        time.sleep(1)


def silent_target(args, chan):
    time.sleep(60)  # never says a word: stuck before its first heartbeat


def busy_target(args, chan):
    """Keeps answering for longer than the heartbeat timeout: must not be killed."""
    end = time.monotonic() + args["seconds"]
    i = 0
    while time.monotonic() < end:
        i += 1
        chan.heartbeat()
        time.sleep(0.02)
    return {"loops": i}


def cooperative_target(args, chan):
    """Loops until asked to stop; returns what it has."""
    i = 0
    while True:
        i += 1
        chan.progress({"i": i, "pid": os.getpid()})
        if chan.should_stop():
            return {"stopped": chan.stop_reason, "i": i}
        time.sleep(0.05)


def stubborn_target(args, chan):
    """Keeps reporting progress but never looks at stop requests (and ignores SIGTERM)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    i = 0
    while True:
        i += 1
        chan.progress({"i": i})
        time.sleep(0.05)


def not_a_dict_target(args, chan):
    return [1, 2, 3]


# -- tests ----------------------------------------------------------------------------------------
def test_ok_results_and_progress_arrive_for_every_worker():
    seen = []
    jobs = [WorkerJob(f"gpu{i}", gpu=i, device="cpu", args={"x": 10 + i}) for i in range(2)]
    out = run_workers(double_target, jobs, budget_s=60,
                      on_progress=lambda job, info: seen.append((job.worker_id, info)), **FAST)
    assert set(out) == {"gpu0", "gpu1"}
    for i in range(2):
        oc = out[f"gpu{i}"]
        assert oc.kind == OK and oc.ok
        got = {k: oc.result[k] for k in ("double", "gpu", "device")}
        assert got == {"double": 2 * (10 + i), "gpu": i, "device": "cpu"}
        assert oc.exitcode == 0 and oc.signal is None and oc.reaped
    assert sorted(w for w, _ in seen) == ["gpu0", "gpu1"]
    assert all(info["step"] == 1 for _, info in seen)


@pytest.mark.slow
def test_exception_crash_and_signal_kill_do_not_stop_the_others():
    jobs = [
        WorkerJob("gpu0", gpu=0, args={"x": 1}),
        WorkerJob("gpu1", gpu=1),
        WorkerJob("gpu2", gpu=2),
        WorkerJob("gpu3", gpu=3),
    ]
    targets = {"gpu0": double_target, "gpu1": raise_target, "gpu2": sigkill_target, "gpu3": exit3_target}
    # one target per pool call would hide interference; run a mixed pool through a dispatcher
    for j in jobs:
        j.args["target"] = f"{targets[j.worker_id].__module__}:{targets[j.worker_id].__name__}"
    out = run_workers(dispatch_target, jobs, budget_s=60, **FAST)
    assert out["gpu0"].kind == OK and out["gpu0"].result["double"] == 2
    crash = out["gpu1"]
    assert crash.kind == CRASHED
    assert crash.error == "ValueError: boom in the worker"
    assert "raise_target" in crash.traceback and crash.exitcode == 1
    killed = out["gpu2"]
    assert killed.kind == CRASHED and killed.signal == "SIGKILL" and killed.exitcode == -signal.SIGKILL
    assert "SIGKILL" in killed.error
    assert killed.progress == {"step": 1}  # the last progress survives the crash
    ex = out["gpu3"]
    assert ex.kind == CRASHED and ex.exitcode == 3 and "exited with code 3" in ex.error


def dispatch_target(args, chan):
    from gpucheck.workers.pool import resolve_target

    return resolve_target(args["target"])(args, chan)


@pytest.mark.slow
def test_hung_worker_is_killed_and_keeps_its_last_progress():
    jobs = [WorkerJob("gpu0", gpu=0, args={"target": f"{__name__}:hang_target"}),
            WorkerJob("gpu1", gpu=1, args={"target": f"{__name__}:busy_target", "seconds": 2.5})]
    out = run_workers(dispatch_target, jobs, budget_s=60, **FAST)
    hung = out["gpu0"]
    assert hung.kind == HUNG
    assert "no heartbeat" in hung.error
    assert hung.progress == {"step": 7}
    assert hung.signal == "SIGKILL"  # it ignored SIGTERM: escalated
    assert hung.reaped
    # busy for twice the heartbeat timeout, but answering all along: not a hang
    assert out["gpu1"].kind == OK and out["gpu1"].result["loops"] > 0


@pytest.mark.slow
def test_worker_that_never_starts_is_a_hang():
    out = run_workers(silent_target, [WorkerJob("gpu0", gpu=0)], budget_s=60,
                      **{**FAST, "startup_timeout_s": 1.0})
    assert out["gpu0"].kind == HUNG
    assert "did not start within 1 s" in out["gpu0"].error


@pytest.mark.slow
def test_cancel_stops_every_worker_and_returns_partial_data():
    cancel = threading.Event()
    jobs = [WorkerJob("gpu0", gpu=0, args={"target": f"{__name__}:cooperative_target"}),
            WorkerJob("gpu1", gpu=1, args={"target": f"{__name__}:cooperative_target"}),
            WorkerJob("gpu2", gpu=2, args={"target": f"{__name__}:stubborn_target"})]
    started = set()

    def on_progress(job, info):
        started.add(job.worker_id)
        if len(started) == 3:
            cancel.set()  # cancel once every worker is running

    out = run_workers(dispatch_target, jobs, budget_s=60, cancel=cancel, on_progress=on_progress, **FAST)
    assert {oc.kind for oc in out.values()} == {CANCELLED}
    for wid in ("gpu0", "gpu1"):
        assert out[wid].result["stopped"] == "cancelled"
        assert out[wid].result["i"] >= 1
    stubborn = out["gpu2"]
    assert stubborn.result is None
    assert stubborn.progress["i"] >= 1  # partial data: the last progress
    assert "did not stop" in stubborn.error and stubborn.signal == "SIGKILL"


@pytest.mark.slow
def test_over_budget_asks_to_stop_then_reports():
    jobs = [WorkerJob("gpu0", gpu=0, args={"target": f"{__name__}:cooperative_target"})]
    out = run_workers(dispatch_target, jobs, budget_s=1.0, **FAST)
    oc = out["gpu0"]
    assert oc.kind == OVER_BUDGET
    assert oc.result["stopped"] == "over_budget"


def test_sigterm_from_outside_means_stop_at_the_next_step():
    def on_progress(job, info):
        if info["i"] == 3:
            os.kill(info["pid"], signal.SIGTERM)  # e.g. Slurm signalling the whole job step

    jobs = [WorkerJob("gpu0", gpu=0, args={"target": f"{__name__}:cooperative_target"})]
    out = run_workers(dispatch_target, jobs, budget_s=60, on_progress=on_progress, **FAST)
    assert out["gpu0"].kind == OK
    assert out["gpu0"].result["stopped"] == "SIGTERM"


@pytest.mark.slow
def test_bad_return_value_and_bad_target_names():
    out = run_workers(not_a_dict_target, [WorkerJob("w", gpu=0)], budget_s=60, **FAST)
    assert out["w"].kind == CRASHED and "not a dict" in out["w"].error
    out = run_workers("gpucheck.no_such_module:fn", [WorkerJob("w", gpu=0)], budget_s=60, **FAST)
    assert out["w"].kind == CRASHED and "ModuleNotFoundError" in out["w"].error
    with pytest.raises(ValueError, match="module-level"):
        run_workers(lambda a, c: {}, [WorkerJob("w")], budget_s=5)
    with pytest.raises(ValueError, match="unique"):
        run_workers(double_target, [WorkerJob("w"), WorkerJob("w")], budget_s=5)


def test_cuda_jobs_pin_the_pci_order_in_the_worker():
    # No GPU needed: the worker only reports its environment.
    out = run_workers(double_target, [WorkerJob("gpu0", gpu=0, device="cuda", args={"x": 1},
                                                visible_device="GPU-1234")], budget_s=60, **FAST)
    assert out["gpu0"].result["cuda_order"] == "PCI_BUS_ID"


@pytest.mark.slow
def test_sampler_runs_beside_the_workers_and_summarizes():
    calls = []

    def fake(gpu):
        calls.append(gpu)
        hot = gpu == 1
        return {"sm_clock_mhz": 1200 if hot else 1980, "temperature_c": 91 if hot else 65,
                "power_w": 650.0, "throttle_reasons": 0x41 if hot else 0x1,
                "throttle_reason_names": ["gpu_idle", "hw_thermal_slowdown"] if hot else ["gpu_idle"]}

    source = FakeTelemetry(samples=fake, xids=lambda: [(1, 79)] if len(calls) < 3 else [])
    sampler = Sampler([0, 1], interval_s=0.05, source=source)
    out = run_workers(busy_target, [WorkerJob("gpu0", gpu=0, args={"seconds": 0.3})], budget_s=60,
                      sampler=sampler, **FAST)
    assert out["gpu0"].kind == OK
    cold, hot = sampler.summary(0), sampler.summary(1)
    assert cold["samples"] >= 2 and hot["samples"] == cold["samples"]
    assert cold["slowdown_reasons"] == [] and cold["throttle_reasons"] == ["gpu_idle"]
    assert hot["slowdown_reasons"] == ["hw_thermal_slowdown"]
    assert hot["sm_clock_median_mhz"] == 1200 and hot["temperature_max_c"] == 91
    assert hot["xid"] == [79] and cold["xid"] == []


def test_sampler_without_nvml_says_so_instead_of_failing():
    s = Sampler([0], interval_s=0.05)  # this machine has no NVIDIA driver
    s.start()
    s.stop()
    summary = s.summary(0)
    if summary["samples"]:  # a machine with a working driver: real readings
        assert summary["sm_clock_max_mhz"] is None or summary["sm_clock_max_mhz"] > 0
    else:
        assert s.note.startswith("no NVML telemetry")
        assert summary["note"] == s.note


def test_summarize_handles_missing_values():
    s = summarize([{"sm_clock_mhz": None, "temperature_c": 50, "power_w": None, "throttle_reason_names": None,
                    "error": "gpu_lost"}])
    assert s["sm_clock_median_mhz"] is None and s["temperature_max_c"] == 50 and s["errors"] == ["gpu_lost"]


def test_burn_display_renders_rows():
    from gpucheck.render.burn_display import BurnDisplay

    buf = StringIO()
    d = BurnDisplay(file=buf)

    class _Check:
        id = "burn.gemm"

    d.started(_Check())
    d.progress("burn.gemm", "gpu1", {"dtype": "bf16", "tflops_median": 712.4, "temperature_c": 71,
                                      "sm_clock_mhz": 1980, "power_w": 690.2, "errors": 2, "time_left_s": 12.0})
    d.close()
    text = buf.getvalue()
    assert "TFLOP/s" in text and "712.4" in text and "bf16" in text and "1980" in text


def test_module_imports_no_torch_and_no_rich():
    import subprocess
    import sys

    code = ("import sys, gpucheck.workers, gpucheck.workers.sampler; "
            "assert 'torch' not in sys.modules and 'rich' not in sys.modules, sorted(sys.modules)")
    from pathlib import Path

    root = Path(pool_mod.__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
