"""eud.power end to end with CPU workers standing in for GPUs and a SYNTHETIC telemetry feed
(a FakeTelemetry source of hand-made NvmlSession.sample dicts): the real worker pool and sampler run, and
injected faults on one GPU's telemetry turn exactly that GPU from pass into the right verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.tests_suite import eud_power as power_mod
from gpucheck.tests_suite.eud_power import PowerOptions, power_check
from gpucheck.core.inject import parse_injection
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.platform.telemetry.fake import FakeTelemetry

ROOT = Path(__file__).resolve().parents[1]
# Short and quick: 2 s of 64x64 GEMMs, sampled at 10 Hz, 0.3 s warm-up.
FAST = {"warmup_s": 0.3, "sample_interval_s": 0.1, "window_s": 0.2, "min_load_samples": 5,
        "heartbeat_timeout_s": 5.0, "startup_timeout_s": 60.0}


def healthy_sample(gpu):
    """Synthetic: a GPU at its 700 W power cap (sw_power_cap, the normal state under a GEMM)."""
    return {"sm_clock_mhz": 1755, "temperature_c": 65 + gpu % 3, "power_w": 688.0 + gpu, "power_limit_w": 700.0,
            "throttle_reasons": 0x4, "throttle_reason_names": ["sw_power_cap"], "error": None}


def _ctx(workers, injections=(), samples=healthy_sample):
    return Context(level=Level.EXTENDED, config=Config(checks={"eud.power": dict(FAST)}), device="cpu",
                   workers=workers, injections=[parse_injection(t) for t in injections],
                   check_options=[PowerOptions(duration_s=2.0, size=64)],
                   telemetry=FakeTelemetry(samples=samples))


def _by_gpu(results):
    return {r.gpu: r for r in results}


@pytest.mark.slow
def test_healthy_node_passes_then_injected_faults_fail_exactly_their_gpu():
    base = _by_gpu(run_checks([power_check], _ctx(2), install_signal_handlers=False).results)
    assert set(base) == {0, 1}
    for r in base.values():
        assert r.status == Status.PASS, r.summary
        assert r.injected == [] and r.metrics["hw_slowdown_samples"] == 0
        assert r.metrics["load_samples"] >= FAST["min_load_samples"]
        assert r.metrics["power_limit_w"] == 700.0
        assert any("CPU worker" in e and "a fake telemetry source" in e for e in r.evidence)

    progress = []
    ctx = _ctx(4, injections=["throttle:gpu=1", "hot:gpu=2", "lowpower:gpu=3,factor=0.4"])
    ctx.progress = lambda check, subject, info: progress.append((check, subject, info))
    res = _by_gpu(run_checks([power_check], ctx, install_signal_handlers=False).results)
    assert set(res) == {0, 1, 2, 3}

    assert res[0].status == Status.PASS and res[0].injected == []

    thr = res[1]
    assert thr.status == Status.FAIL and thr.action == Action.DRAIN
    assert thr.injected == ["throttle:gpu=1"]
    assert thr.summary.startswith("clock cut by hardware under load: hw_slowdown in ")
    assert thr.metrics["hw_slowdown_samples"] == thr.metrics["load_samples"]
    assert thr.metrics["sm_clock_median_mhz"] == 878  # 1755 halved, as NVML's HW slowdown does
    assert any("altered by injection: throttle:gpu=1" in e for e in thr.evidence)

    hot = res[2]
    assert hot.status == Status.WARN and hot.action == Action.INVESTIGATE and hot.injected == ["hot:gpu=2"]
    assert hot.summary.startswith("hotter than its peers under the same load")
    assert hot.metrics["temperature_over_peers_c"] > 10.0

    low = res[3]
    assert low.status == Status.FAIL and low.injected == ["lowpower:gpu=3,factor=0.4"]
    assert low.summary.startswith("cannot reach its power limit under load")
    assert low.metrics["power_fraction_of_limit"] < 0.6

    assert {s for c, s, _ in progress if c == "eud.power"} == {"gpu0", "gpu1", "gpu2", "gpu3"}
    assert any(info.get("power_w") is not None for _, _, info in progress)


@pytest.mark.slow
def test_a_load_that_never_started_is_could_not_judge_not_a_verdict():
    """The workers run but no GEMM window ever finishes (fp8 is refused on CPU workers): there is no
    load window, so no power, clock or temperature verdict; each GPU is an error that says why."""
    ctx = _ctx(2)
    ctx.config = Config(checks={"eud.power": {**FAST, "dtype": "fp8"}})
    res = _by_gpu(run_checks([power_check], ctx, install_signal_handlers=False).results)
    assert set(res) == {0, 1}
    for r in res.values():
        assert r.status == Status.ERROR and r.action == Action.NONE
        assert r.summary.startswith("could not load the GPU: fp8: fp8 runs only on CUDA GPUs"), r.summary


def test_cpu_workers_without_telemetry_skip_and_say_why():
    ctx = Context(level=Level.EXTENDED, device="cpu", workers=2, check_options=[PowerOptions(duration_s=1.0)])
    (r,) = run_checks([power_check], ctx, install_signal_handlers=False).results
    assert r.status == Status.SKIP
    assert r.summary.startswith("no power telemetry: CPU workers stand in for GPUs")


def test_gpus_whose_nvml_does_not_work_are_could_not_judge():
    snap = {"nvml": {"ok": False, "error": {"kind": "driver_not_loaded", "message": "Driver Not Loaded"}}, "gpus": []}
    (r,) = power_check.run(Context(level=Level.EXTENDED, device="cuda", snapshot=snap))
    assert r.status == Status.ERROR
    assert "NVML is not working (driver_not_loaded: Driver Not Loaded)" in r.summary


def test_a_bad_injection_is_an_error_of_its_gpu_not_a_verdict():
    ctx = _ctx(1, injections=["throttle:gpu=0,reason=sw_power_cap"])
    (r,) = run_checks([power_check], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and r.gpu == 0
    assert "reason must be one of hw_slowdown" in r.summary and r.injected == ["throttle:gpu=0,reason=sw_power_cap"]


def test_power_limit_comes_from_the_snapshot_first():
    snap = {"gpus": [{"index": 0, "power": {"limit_w": 650.0}}, {"index": 1, "power": {"limit_w": None}}]}
    ctx = Context(snapshot=snap)
    assert power_mod.power_limit(ctx, 0, [{"power_limit_w": 700.0}]) == (
        650.0, "nvmlDeviceGetEnforcedPowerLimit, telemetry snapshot")
    assert power_mod.power_limit(ctx, 1, [{"power_limit_w": 700.0}, {"power_limit_w": 700.0}])[0] == 700.0
    assert power_mod.power_limit(ctx, 1, [{}]) == (None, "not in the telemetry snapshot")


def test_modules_do_not_import_heavy_libraries():
    code = ("import sys, gpucheck.tests_suite.eud_power, gpucheck.eud.power_judge; "
            "assert not {'torch', 'numpy', 'cupy'} & set(sys.modules), sorted({'torch', 'numpy', 'cupy'} & set(sys.modules))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_run_on_cpu_workers_is_a_skip_that_did_not_do_what_was_asked(tmp_path, capsys):
    """Named alone with --device cpu: a skip that says why, and, as nothing the run was asked to
    examine was examined, unexamined (exit 3). Next to other checks that ran it is a plain skip."""
    from gpucheck.cli.main import main

    rc = main(["run", "--check", "eud.power", "--device", "cpu", "--json", "--state-dir", str(tmp_path)])
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 3
    (r,) = [r for r in verdict["results"] if r["check"] == "eud.power"]
    assert r["status"] == "skip" and "no power telemetry" in r["summary"] and r["unexamined"] is True


def test_sdc_detail_names_the_first_event():
    d = {"sdc": [{"kind": "repeat", "dtype": "bf16", "set": 4, "elements": 2}]}
    assert power_mod._sdc_detail(d) == "bf16 set 4: 2 element(s) differ between two runs of the same operands"
    assert power_mod._sdc_detail({"sdc": []}) == ""
