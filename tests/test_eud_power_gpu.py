"""eud.power on the GPU machine, with real NVML telemetry (run: python3 -m pytest -m gpu tests/test_eud_power_gpu.py -s).

A healthy GPU under burn's bf16 GEMM must reach its power cap without hardware slowdowns; the
same run with `throttle:gpu=0` injected into the real telemetry must fail GPU 0. The measured
numbers are printed (-s) for benchmarks/RESULTS.md."""

from __future__ import annotations

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.tests_suite.eud_power import PowerOptions, power_check
from gpucheck.core.inject import parse_injection
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks

pytestmark = pytest.mark.gpu

DURATION_S = 20.0


def _live_ctx(injections=()):
    pytest.importorskip("torch")
    from gpucheck.platform.telemetry.snapshot import collect_snapshot

    snap = collect_snapshot(timeout_s=60.0)
    if not snap["nvml"]["ok"] or not snap["gpus"]:
        pytest.skip(f"no NVML GPU: {snap['nvml']}")
    return Context(level=Level.EXTENDED, config=Config(checks={"eud.power": {"warmup_s": 5.0}}), snapshot=snap,
                   device="cuda", injections=[parse_injection(t) for t in injections],
                   check_options=[PowerOptions(duration_s=DURATION_S)])


def test_real_gpus_reach_their_power_cap_without_hardware_slowdown():
    ctx = _live_ctx()
    results = run_checks([power_check], ctx, install_signal_handlers=False).results
    assert results
    for r in results:
        print(f"\n{r.subject}: {r.status.value} {r.summary}\n  metrics: {r.metrics}\n  evidence: {r.evidence}")
        assert r.status in (Status.PASS, Status.WARN), r.summary
        assert r.metrics["load_samples"] >= 10
        assert r.metrics["power_limit_w"] > 0  # nvmlDeviceGetEnforcedPowerLimit via the snapshot
        assert r.metrics["power_fraction_of_limit"] >= 0.6
        assert r.metrics["hw_slowdown_samples"] == 0
        assert r.metrics["sm_clock_median_mhz"] > 0


def test_throttle_injected_into_real_telemetry_fails_gpu0():
    ctx = _live_ctx(["throttle:gpu=0,reason=hw_thermal_slowdown"])
    res = {r.gpu: r for r in run_checks([power_check], ctx, install_signal_handlers=False).results}
    r = res[0]
    print(f"\n{r.subject}: {r.status.value} {r.summary}")
    assert r.status == Status.FAIL and r.action == Action.DRAIN
    assert r.injected == ["throttle:gpu=0,reason=hw_thermal_slowdown"]
    assert r.summary.startswith("clock cut by hardware under load: hw_thermal_slowdown")
    for g, other in res.items():
        if g != 0:
            assert other.injected == [] and other.metrics.get("hw_slowdown_samples") == 0
