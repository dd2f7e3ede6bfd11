"""poet.ortho as a check and as `gpucheck poet`: CPU workers standing in for GPUs, injected faults
attributed to the right GPU, hangs, could-not-judge cases, the verdict's wording, usage errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.core.config import Config
from gpucheck.core.inject import parse_injection
from gpucheck.core.result import Action, Status
from gpucheck.core.runner import run_checks
from gpucheck.tests_suite import poet_ortho as poet_mod
from gpucheck.tests_suite.poet_ortho import PoetOptions, describe_violation, judge_data, judge_outcomes, poet_ortho
from gpucheck.workers.pool import CRASHED, HUNG, OK, WorkerJob, WorkerOutcome

ROOT = Path(__file__).resolve().parents[1]
FAST_CFG = {"heartbeat_timeout_s": 1.5, "startup_timeout_s": 60.0, "window_s": 0.2, "chain_steps": 2,
            "cpu_rows": 32}


def _ctx(workers=2, injections=(), duration=1.5, **options):
    opts = PoetOptions(**{"duration_s": duration, "blocks": [32, 64], "dtypes": ["fp32", "bf16"], **options})
    return Context(level=Level.STANDARD, config=Config(checks={"poet.ortho": dict(FAST_CFG)}), device="cpu",
                   workers=workers, injections=[parse_injection(t) for t in injections], check_options=[opts])


def _by_gpu(results):
    return {r.gpu: r for r in results}


def test_spec_levels_and_budget():
    assert poet_ortho.id == "poet.ortho" and poet_ortho.spec.level == Level.STANDARD
    assert poet_ortho.spec.injects == ("bitflip", "hang")
    assert poet_mod.poet_duration(Context(level=Level.STANDARD)) == 30.0
    assert poet_mod.poet_duration(Context(level=Level.EXTENDED)) == 300.0
    assert poet_mod.poet_duration(Context(level=Level.BURN_IN)) == 1800.0
    ctx = Context(level=Level.STANDARD, check_options=[PoetOptions(duration_s=12.0)])
    assert poet_ortho.spec.budget(ctx) == 12.0 + 120.0 + 30.0


@pytest.mark.slow
def test_injected_bitflip_and_hang_fail_exactly_their_gpus():
    ctx = _ctx(workers=3, injections=["bitflip:gpu=1", "hang:gpu=2,after=0.2"])
    progress = []
    ctx.progress = lambda check, subject, info: progress.append((subject, info))
    res = _by_gpu(run_checks([poet_ortho], ctx, install_signal_handlers=False).results)
    assert set(res) == {0, 1, 2}

    ok = res[0]
    assert ok.status == Status.PASS and ok.injected == [] and ok.action == Action.NONE
    assert "POET problems verified (bf16, fp32; blocks 32, 64)" in ok.summary
    assert "on the torch path: 9 invariants clean, worst error/bound" in ok.summary
    assert ok.metrics["problems"] >= 4 and ok.metrics["violations"] == 0 and ok.metrics["cuda_kernels"] == 0
    assert 0 < ok.metrics["max_ratio_kernel_reference"] <= 1.0
    assert any(t.metric == "violations" and t.status == Status.FAIL for t in ok.thresholds)

    sdc = res[1]
    assert sdc.status == Status.FAIL and sdc.action == Action.DRAIN and sdc.injected == ["bitflip:gpu=1"]
    assert sdc.summary.startswith("silent data corruption: kernel_reference (fp32, block 32): error ")
    assert " > bound " in sdc.summary and sdc.metrics["violations"] >= 1
    assert any(e.startswith("SDC kernel_reference (fp32, block 32)") and "row 16, col 21" in e for e in sdc.evidence)
    assert any(e.startswith("injected bitflip: forward output of problem 0") for e in sdc.evidence)

    hung = res[2]
    assert hung.status == Status.FAIL and hung.action == Action.RESET_GPU
    assert hung.summary.startswith("hang: the poet worker stopped answering") and hung.injected == ["hang:gpu=2,after=0.2"]
    assert {s for s, _ in progress} >= {"gpu0", "gpu1"}
    assert all("errors" in info and "time_left_s" in info for _, info in progress)


def test_bad_options_and_injection_parameters_are_errors_not_hardware_verdicts():
    (r,) = run_checks([poet_ortho], _ctx(blocks=[48]), install_signal_handlers=False).results
    assert r.status == Status.ERROR and r.summary.startswith("bad option: block size 48 not supported")
    (r,) = run_checks([poet_ortho], _ctx(size=96), install_signal_handlers=False).results
    assert r.status == Status.ERROR and "not a multiple of block size(s) 64" in r.summary
    args, texts, problem = poet_mod._injection_args(_ctx(injections=["bitflip:gpu=0,op=dense"]), 0)
    assert "op must be one of forward, output, merge, roundtrip, cnp" in problem and texts == ["bitflip:gpu=0,op=dense"]
    args, _, problem = poet_mod._injection_args(_ctx(injections=["bitflip:gpu=0,op=cnp,bit=14", "hang:gpu=1"]), 0)
    assert problem is None and args == {"bitflip": {"op": "cnp", "bit": 14, "row": None, "col": None, "problem": None}}


def _data(**kw):
    d = {"device": {"name": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cupy": "14.0"}, "backend": "cupy",
         "cuda_kernels": True, "backend_note": None, "problems": 40, "violation_count": 0, "violations": [],
         "injected": [], "tflops": 3.2, "invariants": ["a"] * 8, "stopped": None,
         "combos": {"bf16/64": {"dtype": "bf16", "block": 64, "size": 4096, "rows": 4096, "problems": 40,
                                "launches": 760, "violations": 0, "seconds": 9.0,
                                "max_ratio": {"kernel_reference": 0.99, "round_trip": 0.2}}}}
    d.update(kw)
    return d


def test_judge_pass_fail_and_could_not_judge():
    r = judge_data(0, _data(), [])
    assert r.status == Status.PASS and r.summary.startswith("40 POET problems verified (bf16; blocks 64) on the CUDA "
                                                            "kernels: 8 invariants clean, worst error/bound 0.99")
    assert r.metrics["cuda_kernels"] == 1 and r.metrics["launches"] == 760 and r.units["max_ratio_round_trip"] == "of bound"
    assert "CuPy 14.0" in r.evidence[0]
    note = "CuPy not installed (No module named 'cupy'): the CUDA kernels were not exercised (torch path)"
    r = judge_data(0, _data(cuda_kernels=False, backend="torch", backend_note=note), [])
    assert r.status == Status.PASS and r.summary.endswith("; " + note) and r.metrics["cuda_kernels"] == 0
    v = {"invariant": "cnp_orthogonality", "dtype": "fp16", "block": 128, "problem": 7, "op": "cnp G_in",
         "error": 0.25, "bound": 0.001, "where": "block 3", "measured": 0.37, "theory": 0.12, "rho": 0.5,
         "distribution": "wide", "size": 4096, "rows": 4096, "injected": False}
    r = judge_data(3, _data(violation_count=2, violations=[v]), [])
    assert r.status == Status.FAIL and r.action == Action.DRAIN and r.gpu == 3
    assert r.summary.startswith("silent data corruption: cnp_orthogonality (fp16, block 128): error 0.25 > bound 0.001"
                                "; 1 more violation(s)")
    assert describe_violation(v) in r.summary
    assert any("vs theory 2ρ⁴−ρ⁸ = 0.12" in e for e in r.evidence)
    r = judge_data(0, _data(problems=0, combos={}, stopped="SIGTERM"), [])
    assert r.status == Status.ERROR and r.summary == "no POET problem finished: stopped (SIGTERM)"


def test_the_judge_is_its_rule_table_and_its_summary_wording_is_kept():
    """poet.ortho on the rule engine (issue 18): the thresholds a result lists are poet.RULES, the
    status and action follow from them, the wording of the summary is the one it always had
    (before: a threshold list and causes built by hand and folded by result.judge)."""
    from gpucheck.tests_suite.poet_ortho import RULES

    assert [(r.metric, r.op, r.limit, r.status, r.action) for r in RULES] == [
        ("violations", ">", 0, Status.FAIL, Action.DRAIN)]
    listed = [rule.resolve({}) for rule in RULES]
    clean = judge_data(0, _data(), [])
    assert clean.thresholds == listed and (clean.status, clean.action) == (Status.PASS, Action.NONE)
    r = judge_data(1, _data(violation_count=3, violations=[]), [])  # counted, details not kept
    assert r.thresholds == listed and (r.status, r.action) == (Status.FAIL, Action.DRAIN)
    assert r.summary == "silent data corruption: 3 violation(s) (details not kept) (violations=3 > 0)"
    v = {"invariant": "round_trip", "dtype": "bf16", "block": 64, "problem": 2, "op": "x", "error": 0.5, "bound": 0.1}
    r = judge_data(1, _data(violation_count=1, violations=[v]), [])
    assert r.summary == "silent data corruption: round_trip (bf16, block 64): error 0.5 > bound 0.1 (violations=1 > 0)"


def test_judge_crashes_hangs_and_setup_errors():
    jobs = [WorkerJob(f"gpu{g}", gpu=g, device="cuda") for g in range(4)]
    outcomes = {
        "gpu0": WorkerOutcome(job=jobs[0], kind=OK, result=_data()),
        "gpu1": WorkerOutcome(job=jobs[1], kind=CRASHED, error="KernelError: CUDA kernel poet:poet_bd_apply_bf16 "
                              "grid=(128, 32, 1) block=(256, 1, 1): an illegal memory access was encountered"),
        "gpu2": WorkerOutcome(job=jobs[2], kind=HUNG, error="hang: no heartbeat for 31.0 s (limit 30 s)",
                              progress={"problems": 12, "dtype": "fp32 b256"}),
        "gpu3": WorkerOutcome(job=jobs[3], kind=OK, result={"setup_error": "KernelError: CUDA kernel poet:*: compile failed"}),
    }
    res = _by_gpu(judge_outcomes("cuda", 10.0, jobs, outcomes, None, {}, [], 10.0))
    assert res[0].status == Status.PASS
    assert res[1].status == Status.FAIL and res[1].action == Action.RESET_GPU
    assert res[1].summary.startswith("poet worker crashed: KernelError: CUDA kernel poet:poet_bd_apply_bf16")
    assert res[2].status == Status.FAIL and res[2].summary.startswith("hang:") and res[2].metrics["problems"] == 12
    assert res[3].status == Status.ERROR and res[3].summary == "could not run POET: KernelError: CUDA kernel poet:*: compile failed"


def test_backend_selection_without_cupy(monkeypatch):
    torch = pytest.importorskip("torch")
    from gpucheck.poet.worker import select_backend

    # CuPy is a test dependency (the conformance tests read the real one): make it absent here,
    # as on a node without it (a None entry: `import cupy` raises ImportError, find_spec is None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert importlib.util.find_spec("cupy") is None
    fake_cuda = SimpleNamespace(type="cuda", index=0)
    ops, note = select_backend(torch, fake_cuda, "auto")
    assert ops.name == "torch" and not ops.cuda_kernels and "CUDA kernels were not exercised" in note
    with pytest.raises(ImportError):
        select_backend(torch, fake_cuda, "cupy")
    ops, note = select_backend(torch, torch.device("cpu"), "auto")
    assert ops.name == "torch" and note is None
    with pytest.raises(ValueError):
        select_backend(torch, torch.device("cpu"), "cupy")


@pytest.mark.slow
def test_cuda_without_cuda_is_could_not_judge(monkeypatch):
    from gpucheck.core import check as check_mod

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    from gpucheck.platform.telemetry.fake import FakeTelemetry

    snapshot = {"gpus": [{"index": 0, "uuid": "GPU-00000000-fake", "name": "NVIDIA H100 80GB HBM3", "state": "ok"}]}
    ctx = Context(level=Level.STANDARD, config=Config(checks={"poet.ortho": dict(FAST_CFG)}), device="cuda",
                  snapshot=snapshot, check_options=[PoetOptions(duration_s=1.0)],
                  telemetry=FakeTelemetry(snapshot))  # no job on it
    if not check_mod._torch_has_cuda(importlib.util.find_spec("torch")):
        (r,) = run_checks([poet_ortho], ctx, install_signal_handlers=False).results
        assert r.status == Status.SKIP and "CPU-only build" in r.summary
        monkeypatch.setattr(check_mod, "_torch_has_cuda", lambda spec: True)
    (r,) = run_checks([poet_ortho], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and r.summary.startswith("could not run POET:") and "no CUDA device" in r.summary


def test_poet_modules_do_not_import_heavy_packages():
    code = ("import sys, gpucheck.tests_suite.poet_ortho, gpucheck.cli.poet, gpucheck.poet.bounds, gpucheck.poet.invariants, "
            "gpucheck.poet.worker, gpucheck.poet.ortho, gpucheck.poet.cupy_ops; "
            "assert not {'torch', 'cupy', 'numpy'} & set(sys.modules), sorted({'torch', 'cupy', 'numpy'} & set(sys.modules))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- the command ------------------------------------------------------------------------------------
@pytest.fixture
def poet_cli(monkeypatch, tmp_path):
    from gpucheck import app
    from gpucheck.tests_suite import registry
    from gpucheck.cli.main import main

    monkeypatch.setattr(app, "all_checks", lambda **kw: registry.all_checks(("gpucheck.tests_suite.poet_ortho",)))

    def run(*args):
        return main(["poet", "--device", "cpu", "--state-dir", str(tmp_path), *args])

    return run


@pytest.mark.parametrize("args,message", [
    (("--block", "48"), "block size 48 not supported"),
    (("--block", "0"), "block size 0 not supported"),
    (("--block", "32,x"), "bad block size 'x'"),
    (("--dtype", "fp64"), "unknown dtype 'fp64'"),
    (("--size", "96", "--block", "64"), "96 is not a multiple of block size(s) 64"),
    (("--duration", "5x"), "bad duration"),
    (("--inject", "nosuchfault:gpu=1"), "no selected check honours 'nosuchfault'"),
    (("--backend", "cupy"), "cupy runs the CUDA kernels on GPUs, not on CPU workers"),
    (("--rows", "0"), "0 is not in the range 1<=x<=1099511627776"),
    (("--size", "16"), "16 is not in the range 32<=x<=1099511627776"),
    (("--backend", "tpu"), "'tpu' is not one of 'auto', 'cupy', 'torch'"),
])
def test_cli_usage_errors_exit_2_with_one_line(poet_cli, capsys, args, message):
    assert poet_cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("gpucheck poet: error: ")


@pytest.mark.slow
def test_cli_json_verdict_exit_codes_and_attribution(poet_cli, capsys, tmp_path):
    rc = poet_cli("--workers", "2", "--duration", "2s", "--json")
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 0 and verdict["status"] == "pass" and verdict["exit_code"] == 0
    assert [r["gpu"] for r in verdict["results"]] == [0, 1]
    for r in verdict["results"]:
        assert r["check"] == "poet.ortho" and r["status"] == "pass" and r["metrics"]["violations"]["value"] == 0

    rc = poet_cli("--workers", "2", "--duration", "2s", "--json", "--block", "64", "--dtype", "bf16",
                  "--inject", "bitflip:gpu=1,op=cnp")
    verdict = json.loads(capsys.readouterr().out)
    assert rc == 1 and verdict["status"] == "fail" and verdict["injected"] == ["bitflip:gpu=1,op=cnp"]
    by = {r["gpu"]: r for r in verdict["results"]}
    assert by[0]["status"] == "pass" and by[0]["injected"] == []
    assert by[1]["status"] == "fail" and by[1]["action"] == "drain" and by[1]["injected"] == ["bitflip:gpu=1,op=cnp"]
    assert by[1]["summary"].startswith("silent data corruption: cnp_reference (bf16, block 64): error ")


def test_a_stop_request_ends_the_loop_inside_a_problem():
    """The worker polls for a stop after every operation (not only between problems), so a
    cancelled run returns within the pool's grace period even on large problems."""
    torch = pytest.importorskip("torch")
    from gpucheck.poet.ortho import TorchOps
    from gpucheck.poet.worker import PoetConfig, PoetRunner
    from gpucheck.workers.pool import LocalChannel

    class StopAfter(LocalChannel):
        def heartbeat(self, force=False):
            super().heartbeat(force)
            if self.heartbeats == 25:  # in the middle of the second problem
                self.stop_event.set()

    chan = StopAfter()
    cfg = PoetConfig(duration_s=60.0, dtypes=["fp32"], blocks=[32], cpu_rows=16, chain_steps=2, window_s=0.0)
    out = PoetRunner(torch, torch.device("cpu"), chan, cfg, TorchOps(torch, torch.device("cpu"))).run()
    assert out["stopped"] == "stop" and out["seconds"] < 30
    assert out["combos"]["fp32/32"]["problems"] == out["problems"] >= 1
    assert out["violation_count"] == 0 and chan.progress_reports


# -- review additions: bad configuration is "bad option", never a hardware verdict -------------------
@pytest.mark.parametrize("cfg,message", [
    ({"rho_max": 1.5}, "need 0 <= rho_min <= rho_max < 1"),
    ({"backend": "cuda"}, "backend must be one of auto, cupy, torch, not 'cuda'"),
    ({"max_events": 0}, "max_events must be at least 1"),
    ({"chain_steps": 0}, "chain_steps must be at least 1"),
])
def test_bad_configuration_is_a_bad_option_error_before_any_worker(cfg, message):
    ctx = _ctx()
    ctx.config = Config(checks={"poet.ortho": {**FAST_CFG, **cfg}})
    (r,) = run_checks([poet_ortho], ctx, install_signal_handlers=False).results
    assert r.status == Status.ERROR and r.summary.startswith("bad option: ") and message in r.summary, r.summary
    assert r.gpu is None  # judged before any worker started: no GPU was blamed


def test_a_bit_the_flipped_dtype_does_not_have_is_a_usage_error_for_that_gpu():
    settings = poet_mod.RunSettings(dtypes=["bf16", "fp32"], blocks=[32, 64], size=None, rows=None, backend="auto")
    ctx = _ctx(injections=["bitflip:gpu=1,bit=20"])
    _, texts, problem = poet_mod._injection_args(ctx, 1, settings)
    assert texts == ["bitflip:gpu=1,bit=20"] and "bit must be in 0..15 for problem 0 (bf16), not 20" in problem
    # problem 2 of the plan bf16/32, bf16/64, fp32/32, ... is fp32: bit 20 exists there
    ctx = _ctx(injections=["bitflip:gpu=1,bit=20,problem=2"])
    assert poet_mod._injection_args(ctx, 1, settings)[2] is None
    assert poet_mod._injection_args(_ctx(injections=["bitflip:gpu=1,problem=-1"]), 1, settings)[2]


def test_the_worker_answers_a_bad_option_with_a_setup_error_not_a_crash():
    from gpucheck.poet.worker import poet_worker
    from gpucheck.workers.pool import LocalChannel

    out = poet_worker({"duration_s": 1.0, "rho_max": 2.0}, LocalChannel())
    assert out == {"setup_error": "bad option: need 0 <= rho_min <= rho_max < 1, not 0.1, 2.0"}
    out = poet_worker({"duration_s": 1.0, "dtypes": "fp16", "bitflip": {"op": "forward", "bit": 31}}, LocalChannel())
    assert out["setup_error"].startswith("bad option: bitflip bit must be in 0..15")


def test_a_partial_run_names_the_pairs_it_did_not_reach():
    combos = {
        "fp32/32": {"dtype": "fp32", "block": 32, "size": 64, "rows": 32, "problems": 3, "launches": 57,
                    "violations": 0, "seconds": 0.5, "max_ratio": {"kernel_reference": 0.2}},
        "fp32/256": {"dtype": "fp32", "block": 256, "size": 512, "rows": 32, "problems": 0, "launches": 0,
                     "violations": 0, "seconds": 0.0, "max_ratio": {}},
        "bf16/32": {"dtype": "bf16", "block": 32, "size": 64, "rows": 32, "problems": 0, "launches": 0,
                    "violations": 0, "seconds": 0.0, "max_ratio": {}},
    }
    r = judge_data(0, _data(problems=3, combos=combos), [])
    assert r.status == Status.PASS and "(fp32; blocks 32)" in r.summary
    assert "; not reached: fp32/256, bf16/32 (of 3 dtype/block pairs" in r.summary
    r = judge_data(0, _data(), [])
    assert "not reached" not in r.summary


def test_zero_problems_is_could_not_judge_never_a_pass():
    r = judge_data(2, _data(problems=0, combos={}, stopped=None), ["bitflip:gpu=2"])
    assert r.status == Status.ERROR and r.gpu == 2
    assert r.summary == "no POET problem finished: the duration was too short for one problem"
    assert "the bitflip injection did not fire: the run ended before its problem" in r.evidence


def test_out_of_memory_is_could_not_judge_unless_corruption_was_already_seen():
    """A too large --size/--rows (or memory held by another process) raises OutOfMemoryError in
    the middle of a problem: that is not a GPU fault (it used to crash the worker: a FAIL with
    reset-gpu). The loop stops; with no violation so far the GPU gets an error, with one a fail."""
    torch = pytest.importorskip("torch")
    from gpucheck.poet.ortho import TorchOps
    from gpucheck.poet.worker import PoetConfig, PoetRunner
    from gpucheck.workers.pool import LocalChannel

    class OomAt(TorchOps):
        def __init__(self, at):
            super().__init__(torch, torch.device("cpu"))
            self.at, self.calls = at, 0

        def dense(self, A, B):
            self.calls += 1
            if self.calls >= self.at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB")
            return super().dense(A, B)

    def run(at, bitflip=None):
        cfg = PoetConfig(duration_s=60.0, dtypes=["fp32"], blocks=[32], cpu_rows=16, chain_steps=1, bitflip=bitflip)
        return PoetRunner(torch, torch.device("cpu"), LocalChannel(), cfg, OomAt(at)).run()

    out = run(at=5)  # two dense GEMMs per problem: the third problem runs out of memory
    assert out["problems"] == 2 and out["out_of_memory"].startswith("out of memory in problem 2 (fp32, block 32")
    r = judge_data(0, out, [])
    assert r.status == Status.ERROR and r.summary.startswith("could not run POET: out of memory in problem 2")
    assert "2 problem(s) verified clean before that" in r.summary
    out = run(at=5, bitflip={"op": "forward"})
    r = judge_data(0, out, ["bitflip:gpu=0"])
    assert r.status == Status.FAIL and r.summary.startswith("silent data corruption: kernel_reference (fp32, block 32)")
    assert any(e.startswith("out of memory in problem 2") for e in r.evidence)
    # any other exception is still a crash (re-raised to the pool), not swallowed
    class Broken(OomAt):
        def dense(self, A, B):
            raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")
    with pytest.raises(RuntimeError, match="CUBLAS"):
        PoetRunner(torch, torch.device("cpu"), LocalChannel(), PoetConfig(duration_s=5.0, dtypes=["fp32"], blocks=[32]),
                   Broken(1)).run()


def test_the_summary_names_sdc_even_when_no_event_details_were_kept():
    r = judge_data(0, _data(violation_count=3, violations=[]), [])
    assert r.status == Status.FAIL and r.summary.startswith("silent data corruption: 3 violation(s)")
