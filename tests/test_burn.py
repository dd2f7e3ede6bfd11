"""burn.gemm on CPU workers standing in for GPUs: verification, injections, peers, SKU floors,
hang, SIGTERM, the CLI. No GPU needed; no timed assertions (throughput lives in benchmarks/)."""

from __future__ import annotations

import importlib.util

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.compute.gemm import (
    DTYPES,
    BurnConfig,
    Burner,
    DtypeError,
    parse_dtypes,
    reference_tolerance,
)
from gpucheck.core.config import Config
from gpucheck.data.sku import lookup
from gpucheck.core.inject import parse_injection
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.platform.telemetry.fake import FakeTelemetry
from gpucheck.tests_suite import burn_gemm as burn_mod
from gpucheck.tests_suite.burn_gemm import BurnOptions, burn_gemm
from gpucheck.workers.pool import CRASHED, HUNG, OK, LocalChannel, WorkerJob, WorkerOutcome, torch_device
from gpucheck.workers.sampler import summarize

ROOT = Path(__file__).resolve().parents[1]
# Small and quick: 1 s bursts of 64x64 fp32, windows of 0.2 s, short hang limits.
FAST_CFG = {"window_s": 0.2, "heartbeat_timeout_s": 1.5, "startup_timeout_s": 60.0, "sample_interval_s": 0.2}


def _ctx(workers=2, injections=(), duration=1.0, dtypes=("fp32",), size=64, telemetry=None):
    extra = {} if telemetry is None else {"telemetry": telemetry}
    return Context(level=Level.STANDARD, config=Config(checks={"burn.gemm": dict(FAST_CFG)}), device="cpu",
                   workers=workers, injections=[parse_injection(t) for t in injections],
                   check_options=[BurnOptions(duration_s=duration, dtypes=list(dtypes), size=size)], **extra)


def _by_gpu(results):
    return {r.gpu: r for r in results}


# -- pieces -----------------------------------------------------------------------------------------
def test_parse_dtypes():
    assert parse_dtypes("bf16, FP32,bfloat16,double") == ["bf16", "fp32", "fp64"]
    assert parse_dtypes(["fp8", "tf32"]) == ["fp8", "tf32"]
    for bad in ("fp7", "", "bf16,int8"):
        with pytest.raises(DtypeError):
            parse_dtypes(bad)


def test_sku_table_lookup():
    assert lookup("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert lookup("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert lookup("NVIDIA H200").name == "H200 SXM"
    assert lookup("NVIDIA A100-SXM4-80GB").name == "A100 SXM"
    assert lookup("NVIDIA A100 80GB PCIe").name == "A100 PCIe"
    assert lookup("NVIDIA B200").name == "B200"
    for unknown in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA GB200", "Tesla V100", None):
        assert lookup(unknown) is None
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert h100.peak("bf16") == 989.4 and h100.peak("fp8") == 1978.9
    assert lookup("NVIDIA A100-SXM4-40GB").peak("fp8") is None


def test_level_defaults_and_budget():
    ctx = Context(level=Level.EXTENDED)
    assert burn_mod.burn_duration(ctx) == 300.0
    assert burn_mod._params(ctx)["dtypes_level3"] == list(DTYPES)
    assert burn_mod.burn_duration(Context(level=Level.BURN_IN)) == 3600.0
    ctx2 = Context(level=Level.STANDARD, check_options=[BurnOptions(duration_s=42.0)])
    assert burn_mod.burn_duration(ctx2) == 42.0
    assert burn_gemm.spec.budget(ctx2) == 42.0 + 120.0 + 30.0
    over = Context(level=Level.STANDARD, config=Config(checks={"burn.gemm": {"duration_s_level2": 5.0}}))
    assert burn_mod.burn_duration(over) == 5.0
    assert burn_gemm.spec.injects == ("bitflip", "slow", "hang")


# -- the burn loop in this process ------------------------------------------------------------------
@pytest.fixture(autouse=True)
def fp8_on_the_cpu(monkeypatch):
    """Burns run fp8 on CUDA GPUs only (gemm.FP8_DEVICE_TYPES); the Burner tests in this process
    run its fp8 path through torch's CPU _scaled_mm (worker processes keep the product's table)."""
    from gpucheck.compute import gemm

    monkeypatch.setattr(gemm, "FP8_DEVICE_TYPES", gemm.FP8_DEVICE_TYPES | {"cpu"})


@pytest.fixture(scope="module")
def torch_cpu():
    torch = pytest.importorskip("torch")
    chan = LocalChannel(WorkerJob("local", gpu=0, device="cpu"))
    return torch, torch_device(chan), chan


@pytest.mark.slow
def test_healthy_gemms_pass_verification_in_every_dtype_and_distribution(torch_cpu):
    torch, dev, chan = torch_cpu
    # Every distribution must come round in every dtype: a fixed amount of work (two rounds of the
    # four distributions per dtype), not a time slice, which a loaded machine filled with one set
    # (CI saw bf16 with one); the duration is only a bound no healthy run comes near.
    cfg = BurnConfig(duration_s=600.0, dtypes=list(DTYPES), size=48, repeats=2, window_s=0.05, ref_every_s=0.0,
                     ref_rows=64, sets=8)
    out = Burner(torch, dev, chan, cfg).run()
    assert out["sdc_count"] == 0 and out["skipped"] == {}
    for dt in DTYPES:
        r = out["dtypes"][dt]
        assert r["sets"] == 8 and r["distributions"] == {"normal": 2, "wide": 2, "small": 2, "mixed": 2}, (dt, r)
        assert r["repeat_checks"] == r["sets"] and r["reference_checks"] == r["sets"]
        assert 0.0 <= r["reference_max_error"] <= r["reference_tolerance"], dt
        assert r["tflops"] > 0
    assert chan.progress_reports and chan.progress_reports[-1]["dtype"] == "fp8"


def test_fp8_is_skipped_on_cpu_and_says_why(torch_cpu, monkeypatch):
    from gpucheck.compute import gemm

    monkeypatch.setattr(gemm, "FP8_DEVICE_TYPES", frozenset({"cuda"}))  # the product's table
    torch, dev, chan = torch_cpu
    out = Burner(torch, dev, chan, BurnConfig(duration_s=0.2, dtypes=["fp8", "fp32"], size=32)).run()
    assert "fp8" not in out["dtypes"] and "fp32" in out["dtypes"]
    assert "compute capability >= 8.9" in out["skipped"]["fp8"]


@pytest.mark.slow
def test_fp8_operands_are_made_in_fp8_without_a_bf16_temporary(torch_cpu):
    """Each fp8 operand of each set is two passes over its own bytes (random bytes, one AND), never
    a bf16 temporary filled, clamped and cast (three passes of twice the bytes per operand, which
    cost fp8 its share of the verification budget: an fp8 GEMM is twice as fast as bf16)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch, dev, chan = torch_cpu
    n = 48

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor):
                    self.ops.append((func.overloadpacket.__name__, o.dtype, tuple(o.shape)))
            return out

    # Two sets of work, however long a loaded machine takes (a 2 s window once held none: issue 26);
    # the duration is only a bound no healthy run comes near.
    cfg = BurnConfig(duration_s=600.0, dtypes=["fp8"], size=n, repeats=2, ref_every_s=0.0, sets=2)
    with Record() as rec:
        out = Burner(torch, dev, chan, cfg).run()
    r = out["dtypes"]["fp8"]
    assert out["sdc_count"] == 0 and r["sets"] == 2 and r["reference_checks"] == r["sets"]
    square_bf16 = [name for name, dt, shape in rec.ops if dt == torch.bfloat16 and shape == (n, n)]
    assert sorted(set(square_bf16)) == ["_scaled_mm", "empty"] and square_bf16.count("empty") == 2  # C0, C1 only
    on_codes = [name for name, dt, shape in rec.ops
                if dt == torch.uint8 and shape == (n, n) and name not in ("view", "detach")]  # aliases
    assert on_codes == ["random_", "bitwise_and_"] * (2 * r["sets"])
    square = {name for name, dt, shape in rec.ops if dt in (torch.float8_e4m3fn, torch.bfloat16) and shape == (n, n)}
    assert not {"normal_", "clamp_", "clamp", "copy_", "_to_copy"} & square


def test_fp8_distributions_cover_their_documented_values_and_never_nan(torch_cpu):
    torch, dev, chan = torch_cpu
    b = Burner(torch, dev, chan, BurnConfig(size=64, dtypes=["fp8"]))
    X = torch.empty((256, 256), dtype=torch.float8_e4m3fn)
    gen = torch.Generator().manual_seed(7)
    seen = {}
    for dist in ("normal", "wide", "small", "mixed"):
        b._fill_fp8(X, dist, gen)
        v = X.to(torch.float64)
        assert not v.isnan().any() and (v > 0).any() and (v < 0).any(), dist
        seen[dist] = set(v.abs().flatten().tolist())
    tiny = 2.0 ** -9  # the smallest e4m3 subnormal
    assert max(seen["normal"]) == 1.875 and min(seen["normal"] - {0.0}) == tiny and len(seen["normal"]) > 60
    assert max(seen["wide"]) == 240.0 and min(seen["wide"] - {0.0}) == tiny
    assert seen["small"] == {k * tiny for k in range(8)}
    assert seen["mixed"] == {0.0} | {2.0 ** e for e in range(-6, 1)}


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp64", "fp8"])
def test_bitflip_is_caught_by_the_repeat_check(torch_cpu, dtype):
    torch, dev, chan = torch_cpu
    cfg = BurnConfig(duration_s=600.0, dtypes=[dtype], size=48, repeats=3, ref_every_s=60.0, sets=3,
                     bitflip={"set": 2, "bit": None, "row": 5, "col": 7})  # set 2 runs, however loaded the box
    out = Burner(torch, dev, chan, cfg).run()
    assert out["sdc_count"] == 1
    ev = out["sdc"][0]
    assert ev["kind"] == "repeat" and ev["dtype"] == dtype and ev["set"] == 2 and ev["iteration"] == 2 * 3 + 2
    assert ev["elements"] == 1 and ev["first"] == [5, 7] and ev["injected"] is True
    assert ev["odd_one_out"] == "repeat 2"  # the third run agrees with the first
    assert ev["max_abs_error"] > 0 and ev["max_rel_error"] > 0
    assert out["dtypes"][dtype]["repeat_mismatches"] == 1
    assert len(out["injected"]) == 1 and "bit" in out["injected"][0]


def test_reference_check_catches_a_result_that_is_wrong_every_time(torch_cpu):
    """Deterministic corruption (the same wrong answer on every run) passes the repeat check;
    the float64 reference must catch it."""
    torch, dev, chan = torch_cpu
    b = Burner(torch, dev, chan, BurnConfig(size=32, ref_rows=32, dtypes=["bf16"]))
    g = torch.Generator().manual_seed(3)
    A = torch.randn(32, 32, generator=g).to(torch.bfloat16)
    B = torch.randn(32, 32, generator=g).to(torch.bfloat16)
    C = A @ B
    res = {"reference_checks": 0, "reference_elements": 0, "reference_failures": 0, "reference_max_error": 0.0,
           "sdc_events": 0}
    b._reference_check(res, "bf16", "normal", 0, A, B, C, __import__("random").Random(1))
    assert res["reference_failures"] == 0 and b.event_count == 0
    C[9, 4] = C[9, 4] * 1.5 + 1.0
    b._reference_check(res, "bf16", "normal", 1, A, B, C, __import__("random").Random(1))
    assert res["reference_failures"] == 1 and b.event_count == 1
    ev = b.events[0]
    assert ev["kind"] == "reference" and ev["first"] == [9, 4] and ev["elements"] == 1
    assert ev["normalized_error"] > reference_tolerance("bf16", 32)


def test_mixed_integer_operands_must_match_exactly_in_fp32(torch_cpu):
    torch, dev, chan = torch_cpu
    b = Burner(torch, dev, chan, BurnConfig(size=16, ref_rows=16, dtypes=["fp32"]))
    A = torch.randint(-8, 9, (16, 16)).float()
    B = torch.randint(-8, 9, (16, 16)).float()
    C = A @ B
    C[3, 3] += 2.0**-10  # far inside the rounding tolerance, but integer sums are exact
    res = {"reference_checks": 0, "reference_elements": 0, "reference_failures": 0, "reference_max_error": 0.0,
           "sdc_events": 0}
    b._reference_check(res, "fp32", "mixed", 0, A, B, C, __import__("random").Random(0))
    assert res["reference_failures"] == 1 and b.events[0]["tolerance"] == 0.0


# -- the check, with worker processes ----------------------------------------------------------------
def _fake_sample(gpu):
    if gpu == 2:  # a GPU in thermal slowdown
        return {"sm_clock_mhz": 1005, "temperature_c": 92, "power_w": 410.0, "throttle_reasons": 0x44,
                "throttle_reason_names": ["sw_power_cap", "hw_thermal_slowdown"]}
    return {"sm_clock_mhz": 1980, "temperature_c": 70, "power_w": 690.0, "throttle_reasons": 0x4,
            "throttle_reason_names": ["sw_power_cap"]}


@pytest.mark.slow
def test_injections_turn_exactly_their_gpu_into_the_right_verdict():
    ctx = _ctx(workers=3, injections=["bitflip:gpu=1", "slow:gpu=2,factor=0.2"],
               telemetry=FakeTelemetry(samples=_fake_sample))
    progress = []
    ctx.progress = lambda check, subject, info: progress.append((subject, info))
    res = _by_gpu(run_checks([burn_gemm], ctx, install_signal_handlers=False).results)
    assert set(res) == {0, 1, 2}

    ok = res[0]
    assert ok.status == Status.PASS and ok.injected == [] and ok.action == Action.NONE
    assert ok.metrics["sdc_events"] == 0 and ok.metrics["tflops_fp32"] > 0
    assert ok.metrics["repeat_checks_fp32"] > 0 and ok.metrics["reference_checks_fp32"] > 0
    assert ok.metrics["sm_clock_median_mhz"] == 1980

    sdc = res[1]
    assert sdc.status == Status.FAIL and sdc.action == Action.DRAIN
    assert sdc.summary.startswith("silent data corruption: fp32 set 1 iteration")
    assert "differ bitwise" in sdc.summary and "max error" in sdc.summary
    assert sdc.injected == ["bitflip:gpu=1"] and sdc.metrics["sdc_events"] == 1

    slow = res[2]
    assert slow.status == Status.FAIL and slow.injected == ["slow:gpu=2,factor=0.2"]
    assert slow.summary.startswith("slow GPU: fp32")
    assert "below the node median" in slow.summary
    # the power cap every GPU shows is no cause; the thermal slowdown only this one shows is
    assert "likely cause: hw_thermal_slowdown" in slow.summary and "sw_power_cap" not in slow.summary
    assert slow.metrics["peer_deficit_fp32"] > 25.0 and slow.metrics["sdc_events"] == 0
    assert any(t.metric == "peer_deficit_fp32" and t.status == Status.FAIL for t in slow.thresholds)

    assert {s for s, _ in progress} == {"gpu0", "gpu1", "gpu2"}
    assert all("tflops" in info and "time_left_s" in info for _, info in progress)
    assert any(info.get("temperature_c") == 92 for s, info in progress if s == "gpu2")


@pytest.mark.slow
def test_a_hanging_worker_fails_its_gpu_and_the_others_finish():
    ctx = _ctx(workers=2, injections=["hang:gpu=0,after=0.3"])
    res = _by_gpu(run_checks([burn_gemm], ctx, install_signal_handlers=False).results)
    hung = res[0]
    assert hung.status == Status.FAIL and hung.action == Action.RESET_GPU
    assert hung.summary.startswith("hang: the burn worker stopped answering")
    assert "no heartbeat" in hung.summary
    assert hung.injected == ["hang:gpu=0,after=0.3"]
    assert hung.metrics["tflops_fp32"] > 0  # partial data from its last progress report
    other = res[1]
    assert other.status == Status.PASS and other.injected == []
    assert "no peer result to compare with" in other.summary


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_keeps_a_partial_verdict():
    ctx = _ctx(workers=2, duration=120.0)
    # Interrupted in its first windows, two CPU workers' throughput can differ a lot: this test
    # is about the stop, not about peers.
    ctx.config.checks["burn.gemm"].update(peer_warn_fraction=0.9, peer_fail_fraction=0.95)
    armed = threading.Event()
    reporting = set()

    def on_progress(check, subject, info):
        reporting.add(subject)
        if len(reporting) == 2:  # both workers are burning
            armed.set()

    ctx.progress = on_progress

    def send_sigterm():
        armed.wait(60)
        os.kill(os.getpid(), signal.SIGTERM)

    th = threading.Thread(target=send_sigterm, daemon=True)
    th.start()
    out = run_checks([burn_gemm], ctx)  # the runner's own signal handlers
    th.join(5)
    assert out.interrupted == "SIGTERM" and out.partial
    res = _by_gpu(out.results)
    assert set(res) == {0, 1}
    for r in res.values():
        # Stopped after a few of its 120 s: partial data kept, but never a pass (or a warn).
        assert r.status == Status.ERROR, r.summary
        assert r.summary.startswith("cut short: 120 s of burn (--duration) promised, stopped (cancelled) after ")
        assert r.metrics["promised_s"] == 120.0 and 0 < r.metrics["ran_s"] < 120
        assert any(e.startswith("before the stop: ") for e in r.evidence)
        assert any("stopped early (cancelled)" in e for e in r.evidence)
        assert any("interrupted by SIGTERM" in e for e in r.evidence)
        assert r.metrics["tflops_fp32"] > 0


@pytest.mark.slow
def test_cuda_without_cuda_is_could_not_judge_not_a_hardware_fail(monkeypatch):
    from gpucheck.core import check as check_mod

    snapshot = {"gpus": [{"index": 0, "uuid": "GPU-00000000-fake", "name": "NVIDIA H100 80GB HBM3", "state": "ok"},
                         {"index": 1, "uuid": "GPU-11111111-fake", "name": "NVIDIA H100 80GB HBM3", "state": "lost"}]}
    ctx = Context(level=Level.STANDARD, config=Config(checks={"burn.gemm": dict(FAST_CFG)}), device="cuda",
                  snapshot=snapshot, check_options=[BurnOptions(duration_s=1.0, dtypes=["bf16"], size=64)],
                  telemetry=FakeTelemetry(snapshot))  # no job on the GPUs
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    if not check_mod._torch_has_cuda(importlib.util.find_spec("torch")):
        # A CPU-only torch build is caught before any worker starts ...
        (r,) = run_checks([burn_gemm], ctx, install_signal_handlers=False).results
        assert r.status == Status.SKIP and "CPU-only build" in r.summary
        # ... a CUDA build whose CUDA does not work (broken driver) is caught in the worker.
        monkeypatch.setattr(check_mod, "_torch_has_cuda", lambda spec: True)
    res = _by_gpu(run_checks([burn_gemm], ctx, install_signal_handlers=False).results)
    assert res[0].status == Status.ERROR
    assert res[0].summary.startswith("could not burn:") and "no CUDA device" in res[0].summary
    assert res[1].status == Status.SKIP and "lost" in res[1].summary


class _Tel:
    """Telemetry fixture for _judge: a Sampler's summary() per GPU."""

    xid_note = None

    def __init__(self, per_gpu):
        self.per_gpu = per_gpu

    def summary(self, gpu):
        return summarize(self.per_gpu.get(gpu, []))


def _data(name, tflops, size=8192, dtype="bf16"):
    return {"device": {"name": name}, "config": {"size": size}, "sdc": [], "sdc_count": 0, "skipped": {},
            "dtypes": {dtype: {"tflops": tflops, "iterations": 100, "repeat_checks": 6, "reference_checks": 2,
                               "reference_max_error": 0.001, "reference_tolerance": 0.008, "sets": 6,
                               "repeats": 16, "seconds": 10.0, "reference_elements": 100}}}


def _judge(results_by_gpu, sampler=None, device="cuda"):
    jobs = [WorkerJob(f"gpu{g}", gpu=g, device=device) for g in results_by_gpu]
    outcomes = {}
    for j in jobs:
        v = results_by_gpu[j.gpu]
        outcomes[j.worker_id] = v if isinstance(v, WorkerOutcome) else WorkerOutcome(job=j, kind=OK, result=v)
    p = burn_mod._params(Context())
    return _by_gpu(burn_mod._judge(Context(), p, device, 10.0, jobs, outcomes, sampler,
                                   {j.gpu: None for j in jobs}, {}, [], 10.0))


def test_sku_floor_warns_and_fails_and_unknown_skus_are_judged_by_peers_only():
    h100 = "NVIDIA H100 80GB HBM3"
    res = _judge({0: _data(h100, 760.0)})
    assert res[0].status == Status.PASS
    assert "0.77 of the H100 SXM dense peak" in res[0].summary and "no peers to compare" in res[0].summary
    res = _judge({0: _data(h100, 400.0)})
    assert res[0].status == Status.WARN and res[0].action == Action.INVESTIGATE
    assert res[0].summary.startswith("slow GPU: bf16 below the H100 SXM floor")
    res = _judge({0: _data(h100, 250.0)})
    assert res[0].status == Status.FAIL
    # small operands never reach the dense rate: no floor, and the evidence says so
    res = _judge({0: _data(h100, 250.0, size=1024)})
    assert res[0].status == Status.PASS and any("no SKU floor at size 1024" in e for e in res[0].evidence)
    res = _judge({0: _data("NVIDIA H100 NVL", 100.0)})
    assert res[0].status == Status.PASS and "judged by peers only" in res[0].summary


def test_peer_deviation_warn_fail_and_throttling_named():
    hot = [{"sm_clock_mhz": 1400, "temperature_c": 89, "power_w": 500.0,
            "throttle_reason_names": ["sw_power_cap", "hw_slowdown"]}]
    cool = [{"sm_clock_mhz": 1980, "temperature_c": 66, "power_w": 690.0, "throttle_reason_names": ["sw_power_cap"]}]
    name = "NVIDIA Unlisted GPU"
    res = _judge({0: _data(name, 700.0), 1: _data(name, 710.0), 2: _data(name, 690.0), 3: _data(name, 600.0),
                  4: _data(name, 450.0)},
                 sampler=_Tel({0: cool, 1: cool, 2: cool, 3: cool, 4: hot}))
    assert [res[g].status for g in range(3)] == [Status.PASS] * 3
    assert res[3].status == Status.WARN and "13% below the node median of 690" in res[3].summary
    assert "no clock throttling seen" in res[3].summary or "as on the other GPUs" in res[3].summary
    assert res[4].status == Status.FAIL and res[4].action == Action.DRAIN
    assert ("likely cause: hw_slowdown during the burn (max 89 C), SM clock median 1400 MHz vs 1980 MHz"
            in res[4].summary)


def test_crashed_workers_fail_with_the_error_text():
    crashed = WorkerOutcome(job=WorkerJob("gpu1", gpu=1), kind=CRASHED,
                            error="RuntimeError: CUDA error: an illegal memory access was encountered",
                            traceback="Traceback...\nRuntimeError: CUDA error",
                            progress={"dtype": "bf16", "tflops": 700.0})
    oom = WorkerOutcome(job=WorkerJob("gpu2", gpu=2), kind=CRASHED, error="worker killed by SIGKILL (out of memory?)",
                        signal="SIGKILL")
    hung = WorkerOutcome(job=WorkerJob("gpu3", gpu=3), kind=HUNG, error="hang: no heartbeat for 31.0 s (limit 30 s)")
    res = _judge({0: _data("NVIDIA H100 80GB HBM3", 760.0), 1: crashed, 2: oom, 3: hung})
    assert res[0].status == Status.PASS and "no peer result to compare with" in res[0].summary
    assert res[1].status == Status.FAIL and res[1].action == Action.RESET_GPU
    assert res[1].summary == "burn worker crashed: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert res[1].metrics["tflops_bf16"] == 700.0
    assert res[2].status == Status.FAIL and "SIGKILL" in res[2].summary and res[2].action == Action.INVESTIGATE
    assert res[3].status == Status.FAIL and res[3].summary.startswith("hang:")


def test_gpucheck_modules_do_not_import_torch():
    code = ("import sys, gpucheck.tests_suite.burn_gemm, gpucheck.cli.burn, gpucheck.compute.gemm, gpucheck.data.sku, "
            "gpucheck.workers.pool; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- the command ------------------------------------------------------------------------------------
@pytest.fixture
def burn_cli(monkeypatch, tmp_path):
    from gpucheck import app
    from gpucheck.tests_suite import registry
    from gpucheck.cli.main import main

    # Only the burn module: keeps this test about the burn command.
    monkeypatch.setattr(app, "all_checks", lambda **kw: registry.all_checks(("gpucheck.tests_suite.burn_gemm",)))

    def run(*args):
        return main(["burn", "--device", "cpu", "--state-dir", str(tmp_path), *args])

    return run


def test_cli_usage_errors_exit_2(burn_cli, capsys):
    assert burn_cli("--duration", "5x") == 2
    assert "bad duration" in capsys.readouterr().err
    assert burn_cli("--dtype", "fp7") == 2
    assert "unknown dtype" in capsys.readouterr().err
    assert burn_cli("--workers", "2", "--gpus", "7") == 2
    assert burn_cli("--inject", "nosuchfault:gpu=1") == 2
    assert burn_cli("--size", "8") == 2


@pytest.mark.slow
def test_cli_json_verdict_and_exit_codes(burn_cli, capsys, tmp_path):
    rc = burn_cli("--workers", "1", "--duration", "0.5s", "--size", "32", "--dtype", "fp32", "--json")
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 0 and verdict["exit_code"] == 0 and verdict["status"] == "pass"
    (r,) = verdict["results"]
    assert r["check"] == "burn.gemm" and r["subject"] == "gpu0" and "no peers to compare" in r["summary"]
    assert r["metrics"]["tflops_fp32"]["unit"] == "TFLOP/s"

    out_file = tmp_path / "verdict.json"
    rc = burn_cli("--workers", "2", "--duration", "0.5s", "--size", "32", "--dtype", "fp32", "--json",
                  "--inject", "bitflip:gpu=1", "--output", str(out_file))
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 1 and verdict["status"] == "fail" and verdict["injected"] == ["bitflip:gpu=1"]
    by = {r["gpu"]: r for r in verdict["results"]}
    assert by[1]["status"] == "fail" and by[1]["injected"] == ["bitflip:gpu=1"]
    assert by[1]["summary"].startswith("silent data corruption")
    assert by[0]["injected"] == [] and by[0]["metrics"]["sdc_events"]["value"] == 0
    assert json.loads(out_file.read_text())["exit_code"] == 1
