"""gpucheck's own limits are `error`, never `fail` (issue 26): a worker that cannot allocate what
its size asks for has not examined the GPU. `burn --size 10000000000` and `poet --rows 100000000`
on CPU workers used to FAIL, exit 1 (a drain), on "Storage size calculation overflowed" and
"can't allocate memory"."""

from __future__ import annotations

import json

import pytest

from gpucheck.workers.alloc import allocation_failure, allocating
from gpucheck.workers.pool import CRASHED, OK, WorkerJob, WorkerSetupError, run_workers

FAST = dict(heartbeat_timeout_s=5.0, startup_timeout_s=30.0, stop_grace_s=1.0, term_grace_s=0.5,
            kill_wait_s=2.0, poll_s=0.05)

# The allocators' own messages, copied from torch 2.13 on this machine (CPU) and torch's CUDA
# caching allocator's text.
TORCH_OVERFLOW = "Storage size calculation overflowed with sizes=[10000000000, 10000000000]"
TORCH_CPU_ALLOC = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                   "tried to allocate 25600000000 bytes. Error code 12 (Cannot allocate memory)")
CUDA_OOM = "CUDA out of memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


def test_allocation_failures_are_recognised_and_other_errors_are_not():
    for exc in (RuntimeError(TORCH_OVERFLOW), RuntimeError(TORCH_CPU_ALLOC), RuntimeError(CUDA_OOM),
                MemoryError(), OverflowError("cannot fit 'int' into an index-sized integer")):
        assert allocation_failure(exc) is not None, exc
    assert allocation_failure(RuntimeError(TORCH_OVERFLOW)) == f"RuntimeError: {TORCH_OVERFLOW}"
    for exc in (RuntimeError("CUDA error: an illegal memory access was encountered"),
                RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED"), ValueError("out of memory")):
        assert allocation_failure(exc) is None, exc


def test_allocating_names_what_it_allocated_and_lets_other_errors_through():
    with pytest.raises(WorkerSetupError, match=r"^could not allocate the 10x10 operands: RuntimeError: Storage size"):
        with allocating("the 10x10 operands"):
            raise RuntimeError(TORCH_OVERFLOW)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with allocating("the 10x10 operands"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


# -- targets (module level: spawned workers import them by name) ------------------------------------
def overflow_target(args, chan):
    import torch

    torch.empty((10_000_000_000, 10_000_000_000))  # the byte count overflows int64
    return {}


def sized_target(args, chan):
    with allocating("the 10000000000x10000000000 operands"):
        raise RuntimeError(TORCH_CPU_ALLOC)


def illegal_address_target(args, chan):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.slow
def test_the_pool_returns_an_allocation_failure_as_the_targets_setup_error_not_a_crash():
    out = run_workers(overflow_target, [WorkerJob("gpu0", gpu=0, device="cpu")], budget_s=60, **FAST)
    oc = out["gpu0"]
    assert oc.kind == OK and oc.result is not None, (oc.kind, oc.error)
    assert oc.result["setup_error"].startswith("could not allocate memory: RuntimeError: Storage size calculation")
    oc = run_workers(sized_target, [WorkerJob("gpu0", gpu=0, device="cpu")], budget_s=60, **FAST)["gpu0"]
    assert oc.kind == OK and oc.result == {
        "setup_error": f"could not allocate the 10000000000x10000000000 operands: RuntimeError: {TORCH_CPU_ALLOC}"}
    oc = run_workers(illegal_address_target, [WorkerJob("gpu0", gpu=0, device="cpu")], budget_s=60, **FAST)["gpu0"]
    assert oc.kind == CRASHED and "illegal memory access" in (oc.error or "")  # a finding stays a crash


def test_a_burn_whose_operands_do_not_fit_is_could_not_judge():
    torch = pytest.importorskip("torch")
    from gpucheck.compute.gemm import BurnConfig, Burner
    from gpucheck.workers.pool import LocalChannel

    chan = LocalChannel(WorkerJob("local", gpu=0, device="cpu"))
    out = Burner(torch, torch.device("cpu"), chan, BurnConfig(duration_s=1.0, dtypes=["bf16"],
                                                            size=10_000_000_000)).run()
    assert out["allocation_errors"] == ["bf16"] and out["dtypes"] == {}
    assert out["skipped"]["bf16"].startswith("could not allocate the 10000000000x10000000000 operands")
    assert "Storage size calculation overflowed" in out["skipped"]["bf16"]


@pytest.mark.slow
@pytest.mark.parametrize("command", [["burn", "--size", "10000000000"], ["poet", "--rows", "100000000"]])
def test_a_size_gpucheck_cannot_allocate_is_error_exit_3_never_a_fail(command, tmp_path, capsys):
    from gpucheck.cli.main import main

    rc = main([*command, "--device", "cpu", "--workers", "1", "--duration", "2s", "--state-dir", str(tmp_path),
               "--json"])
    verdict = json.loads(capsys.readouterr().out)
    (r,) = verdict["results"]
    assert (rc, verdict["status"], r["status"]) == (3, "error", "error"), r["summary"]
    assert "allocate" in r["summary"] and ("10000000000x10000000000" in r["summary"] or "m=100000000" in r["summary"])


def test_a_burn_with_one_dtype_not_allocated_is_never_a_pass():
    """bf16 burned, fp64's operands did not fit: the GPU was not examined in fp64 (it used to pass
    on bf16 alone); a fault found in what did burn still fails."""
    from gpucheck.core.check import Context
    from gpucheck.core.result import Status
    from gpucheck.tests_suite import burn_gemm as burn_mod
    from gpucheck.workers.pool import OK, WorkerOutcome

    def data(sdc: int = 0) -> dict:
        return {"device": {"name": "cpu"}, "config": {"size": 256}, "sdc": [], "sdc_count": sdc,
                "skipped": {"fp64": "could not allocate the 256x256 operands (...): MemoryError"},
                "allocation_errors": ["fp64"],
                "dtypes": {"bf16": {"tflops": 0.0003, "iterations": 100, "repeat_checks": 6, "reference_checks": 2,
                                    "reference_max_error": 0.0, "reference_tolerance": 0.008, "sets": 6,
                                    "repeats": 16, "seconds": 10.0, "reference_elements": 100}}}

    def judge(d: dict):
        job = WorkerJob("gpu0", gpu=0, device="cpu")
        (r,) = burn_mod._judge(Context(), burn_mod._params(Context()), "cpu", 10.0, [job],
                               {"gpu0": WorkerOutcome(job=job, kind=OK, result=d)}, None, {0: None}, {}, [], 10.0)
        return r

    r = judge(data())
    assert r.status is Status.ERROR and r.summary.startswith("not every dtype burned: fp64: could not allocate")
    assert any(e.startswith("pass for the dtypes burned: ") for e in r.evidence)
    assert judge(data(sdc=2)).status is Status.FAIL  # a fault seen stands
