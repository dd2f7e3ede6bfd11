"""The load-test guard (gpucheck.workers.busy): a GPU that a job is using is not loaded.

The reader (gpucheck.platform.telemetry.nvml.read_gpu_processes) runs against the real pynvml module with
its functions monkeypatched (test_telemetry.FakeNode); every load check runs on "GPUs" with the
worker pool (or the ranks, or dcgmi) replaced by a recorder, so the tests see which GPUs would
have been loaded, on a machine without GPUs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from test_telemetry import FakeNode, _clean_nvml_state, h100  # noqa: F401 - the fixture is autouse

from gpucheck.workers import busy
from gpucheck.core.check import Context
from gpucheck.core.levels import Level
from gpucheck.cli.main import main
from gpucheck.core.config import Config
from gpucheck.core.result import Status
from gpucheck.platform.telemetry import nvml as N
from gpucheck.platform.telemetry.fake import FakeTelemetry
from gpucheck.platform.telemetry.nvml import GpuProcess, GpuProcesses, NvmlFailure
from gpucheck.core.verdict import exit_code_for
from gpucheck.tests_suite.burn_gemm import BurnOptions
from gpucheck.tests_suite.eud_memtest import MemtestOptions
from gpucheck.tests_suite.eud_power import PowerOptions
from gpucheck.tests_suite.poet_ortho import PoetOptions

GIB = 1 << 30
JOB_PID = 4711  # a job's process in the fakes: never this test's own PID
SUMMARY_1 = "GPU 1 is in use by PID 4711 (python), 5 GiB: not loaded; --force to load it anyway"
FIX = Path(__file__).resolve().parent / "fixtures" / "dcgm"


def proc(pid, mem=None):
    return SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def reader(busy_gpus=(1,), unreadable=()):
    """A fake source's process reader (FakeTelemetry(processes=...)): a python job on `busy_gpus`."""
    def read(gpus):
        out = {}
        for g in gpus:
            if g in unreadable:
                out[g] = GpuProcesses(g, None, NvmlFailure(N.NO_PERMISSION, "Insufficient Permissions", 4))
            elif g in busy_gpus:
                out[g] = GpuProcesses(g, (GpuProcess(JOB_PID, 5 * GIB, ("compute",), "python"),))
            else:
                out[g] = GpuProcesses(g, ())
        return out
    return read


# -- the reader: NVML -> plain data -----------------------------------------------------------------
def test_reader_merges_compute_graphics_and_mps_lists_by_pid_with_names(monkeypatch, tmp_path):
    (tmp_path / "4711").mkdir()
    (tmp_path / "4711" / "comm").write_text("python\n")
    gpu = h100(0, nvmlDeviceGetComputeRunningProcesses_v3=[proc(4711, 5 * GIB), proc(4800, None)],
               nvmlDeviceGetGraphicsRunningProcesses_v3=[proc(4711, 6 * GIB)],
               nvmlDeviceGetMPSComputeRunningProcesses_v3=[proc(4900, (1 << 64) - 1)])
    FakeNode([gpu]).install(monkeypatch)
    with N.NvmlSession() as s:
        got = N.read_gpu_processes(s, 0, proc_root=str(tmp_path))
    assert got.readable and got.failure is None and got.notes == ()
    assert [p.to_dict() for p in got.processes] == [
        {"pid": 4711, "used_memory_bytes": 6 * GIB, "kinds": ["compute", "graphics"], "name": "python"},
        {"pid": 4800, "used_memory_bytes": None, "kinds": ["compute"], "name": None},  # no /proc entry
        {"pid": 4900, "used_memory_bytes": None, "kinds": ["mps"], "name": None},  # NVML_VALUE_NOT_AVAILABLE
    ]


def test_reader_uses_v2_where_the_driver_lacks_v3_and_notes_lists_the_gpu_does_not_have(monkeypatch):
    gpu = h100(0, nvmlDeviceGetComputeRunningProcesses_v3=pynvml.NVMLError_FunctionNotFound(),
               nvmlDeviceGetComputeRunningProcesses_v2=[proc(4711, GIB)])
    FakeNode([gpu]).install(monkeypatch)  # graphics and MPS lists: NOT_SUPPORTED
    with N.NvmlSession() as s:
        got = N.read_gpu_processes(s, 0)
    assert [(p.pid, p.used_memory_bytes) for p in got.processes] == [(4711, GIB)]
    assert len(got.notes) == 2 and got.notes[0].startswith("graphics process list not supported here")


@pytest.mark.parametrize("where, exc, kind", [
    ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVMLError_NotSupported, N.NOT_SUPPORTED),
    ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVMLError_GpuIsLost, N.GPU_LOST),
    ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVMLError_NoPermission, N.NO_PERMISSION),
    ("nvmlDeviceGetGraphicsRunningProcesses_v3", pynvml.NVMLError_NoPermission, N.NO_PERMISSION),
    ("nvmlDeviceGetMPSComputeRunningProcesses_v3", pynvml.NVMLError_Unknown, N.OTHER),
    ("handle", pynvml.NVMLError_GpuIsLost, N.GPU_LOST),
])
def test_nvml_errors_are_explicit_states_never_no_processes(monkeypatch, where, exc, kind):
    gpu = h100(0, nvmlDeviceGetComputeRunningProcesses_v3=[], nvmlDeviceGetGraphicsRunningProcesses_v3=[],
               nvmlDeviceGetMPSComputeRunningProcesses_v3=[])
    gpu[where] = exc()
    FakeNode([gpu]).install(monkeypatch)
    with N.NvmlSession() as s:
        got = N.read_gpu_processes(s, 0)
    assert got.processes is None and not got.readable and got.failure.kind == kind
    st = busy.gpu_state(0, got, set())
    assert st.in_use and kind in st.unreadable


def test_nvml_that_does_not_start_or_does_not_answer_is_unreadable(monkeypatch):
    FakeNode([h100(0)], init_error=pynvml.NVMLError_LibraryNotFound()).install(monkeypatch)
    got = busy.read_processes([0, 1])
    assert {g: r.failure.kind for g, r in got.items()} == {0: N.LIBRARY_NOT_FOUND, 1: N.LIBRARY_NOT_FOUND}
    N._LIB._shutdown_at_exit()
    release = threading.Event()
    FakeNode([h100(0, nvmlDeviceGetComputeRunningProcesses_v3=lambda: release.wait(10) and [])]).install(monkeypatch)
    try:
        (got,) = busy.read_processes([0], timeout_s=0.3).values()
        assert got.processes is None and "NVML did not answer within 0.3 s (driver hang?)" in got.failure.message
    finally:
        release.set()
        for th in threading.enumerate():
            if th.name == "gpucheck-nvml-processes":
                th.join(5)


# -- the guard ------------------------------------------------------------------------------------------
def test_busy_gpu_is_skipped_naming_the_pid_and_force_loads_it():
    g = busy.guard_gpus([0, 1, 2], check_id="burn.gemm", force=False,
                        telemetry=FakeTelemetry(processes=reader()))
    assert g.loaded == [0, 2]
    (r,) = g.skipped
    assert (r.gpu, r.status, r.unexamined, r.summary) == (1, Status.SKIP, True, SUMMARY_1)
    assert r.metrics == {"processes": 1, "process_memory_bytes": 5 * GIB}
    assert r.evidence == ["PID 4711 (python): compute context, 5 GiB"]
    assert exit_code_for(g.skipped) == 3
    forced = busy.guard_gpus([0, 1, 2], check_id="burn.gemm", force=True,
                             telemetry=FakeTelemetry(processes=reader()))
    assert forced.loaded == [0, 1, 2] and forced.skipped == []
    assert forced.notes[1][0] == "--force: loaded although GPU 1 is in use by PID 4711 (python), 5 GiB"


def test_unreadable_process_list_is_not_loaded():
    g = busy.guard_gpus([0, 1], check_id="eud.memtest", force=False,
                        telemetry=FakeTelemetry(processes=reader(busy_gpus=(), unreadable=(0,))))
    assert g.loaded == [1]
    (r,) = g.skipped
    assert r.unexamined and r.gpu == 0 and r.summary == (
        "GPU 0: its running processes could not be read (no_permission: Insufficient Permissions), so a job "
        "may be using it: not loaded; --force to load it anyway")
    nothing = busy.guard_gpus([3], check_id="x", force=False,
                              telemetry=FakeTelemetry(processes=lambda gpus: {}))  # the reader left it out
    assert nothing.loaded == [] and "no answer for this GPU" in nothing.skipped[0].summary


def test_gpuchecks_own_processes_are_not_a_job():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = (GpuProcess(os.getpid(), GIB, ("compute",), "gpucheck"), GpuProcess(child.pid, GIB, ("compute",), "python"))
        g = busy.guard_gpus([0], check_id="burn.gemm", force=False,
                            telemetry=FakeTelemetry(processes=lambda gpus: {0: GpuProcesses(0, mine)}))
        assert g.loaded == [0] and g.skipped == []
        also_job = mine + (GpuProcess(JOB_PID, 2 * GIB, ("compute",), "python"),)
        (r,) = busy.guard_gpus([0], check_id="burn.gemm", force=False,
                               telemetry=FakeTelemetry(processes=lambda gpus: {0: GpuProcesses(0, also_job)})).skipped
        assert r.summary.startswith("GPU 0 is in use by PID 4711 (python), 2 GiB:") and r.metrics["processes"] == 1
        assert sum(e.startswith("not counted (gpucheck's own process)") for e in r.evidence) == 2
    finally:
        child.kill()
        child.wait()


def test_many_processes_are_summarized_and_all_listed_in_the_evidence():
    procs = tuple(GpuProcess(100 + i, 512 << 20, ("compute",), f"rank{i}") for i in range(5))
    (r,) = busy.guard_gpus([2], check_id="x", force=False,
                           telemetry=FakeTelemetry(processes=lambda gpus: {2: GpuProcesses(2, procs)})).skipped
    assert r.summary == ("GPU 2 is in use by PID 100 (rank0), 512 MiB; PID 101 (rank1), 512 MiB; PID 102 (rank2), "
                         "512 MiB and 2 more process(es): not loaded; --force to load it anyway")
    assert len(r.evidence) == 5


def test_cpu_workers_have_no_gpu_to_protect():
    def never(gpus):
        raise AssertionError("read on CPU workers")
    ctx = Context(device="cpu", workers=2, telemetry=FakeTelemetry(processes=never))
    g = busy.guard_context(ctx, "cpu", "burn.gemm", [0, 1])
    assert g.loaded == [0, 1] and g.skipped == [] and g.notes == {}


# -- every load check: the busy GPU gets no worker -----------------------------------------------------
def _cuda_ctx(force=False, gpus=3, refs=None, processes=None):
    snap = {"gpus": [{"index": i, "uuid": f"GPU-{i:08d}-fake", "name": "NVIDIA H100 80GB HBM3", "state": "ok",
                      "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0"} for i in range(gpus)]}
    config = Config(checks={"repro.bitwise": {"reference": str(refs)}} if refs else {})  # none yet: peers judge
    return Context(level=Level.EXTENDED, config=config, device="cuda", snapshot=snap, force=force,
                   telemetry=FakeTelemetry(processes=processes or reader(), samples=lambda gpu: {"temperature_c": 40}),
                   check_options=[BurnOptions(duration_s=1.0), PoetOptions(duration_s=1.0),
                                  MemtestOptions(duration_s=1.0), PowerOptions(duration_s=1.0)])


@pytest.fixture
def started(monkeypatch):
    """Replace the worker pool: record the GPUs whose workers would have started (no outcome)."""
    from gpucheck.workers import pool

    seen: list[int] = []

    def run_workers(worker_ref, jobs, **kw):
        for j in jobs:
            seen.extend([j.gpu] if j.gpu is not None else [g["gpu"] for g in j.args["gpus"]])
        return {}

    monkeypatch.setattr(pool, "run_workers", run_workers)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: SimpleNamespace(name="cupy") if name == "cupy" else real(name, *a))
    return seen


def _load_checks():
    from gpucheck.tests_suite.eud_bandwidth import bandwidth
    from gpucheck.tests_suite.eud_memtest import memtest
    from gpucheck.tests_suite.eud_power import power_check
    from gpucheck.tests_suite.burn_gemm import burn_gemm
    from gpucheck.tests_suite.poet_ortho import poet_ortho
    from gpucheck.tests_suite.repro_bitwise import repro_bitwise

    return {c.id: c for c in (burn_gemm, poet_ortho, repro_bitwise, memtest, bandwidth, power_check)}


@pytest.mark.parametrize("check_id", ["burn.gemm", "poet.ortho", "repro.bitwise", "eud.memtest", "eud.bandwidth",
                                      "eud.power"])
def test_load_check_starts_no_worker_on_the_busy_gpu(started, tmp_path, check_id):
    check = _load_checks()[check_id]
    results = check.run(_cuda_ctx(refs=tmp_path / "refs.json"))
    assert sorted(started) == [0, 2]
    (skip,) = [r for r in results if r.gpu == 1]
    assert skip.status == Status.SKIP and skip.unexamined and skip.summary == SUMMARY_1 and skip.check == check_id
    assert exit_code_for(results) == 3


@pytest.mark.parametrize("check_id", ["burn.gemm", "poet.ortho", "repro.bitwise", "eud.memtest", "eud.bandwidth",
                                      "eud.power"])
def test_force_loads_the_busy_gpu_and_says_so(started, tmp_path, check_id):
    check = _load_checks()[check_id]
    results = check.run(_cuda_ctx(force=True, refs=tmp_path / "refs.json"))
    assert sorted(started) == [0, 1, 2]
    assert not any(r.unexamined for r in results)
    note = "--force: loaded although GPU 1 is in use by PID 4711 (python), 5 GiB"
    mine = [r for r in results if r.gpu == 1] or [r for r in results if r.gpu is None]
    assert mine and all(note in r.evidence for r in mine)
    assert not any(note in r.evidence for r in results if r.gpu in (0, 2))


def test_every_gpu_busy_starts_nothing(started):
    from gpucheck.tests_suite.burn_gemm import burn_gemm

    results = burn_gemm.run(_cuda_ctx(processes=reader(busy_gpus=(0, 1), unreadable=(2,))))
    assert started == [] and [r.gpu for r in results] == [0, 1, 2] and all(r.unexamined for r in results)


def test_nccl_intra_gives_no_rank_to_the_busy_gpu(monkeypatch):
    from gpucheck.tests_suite import nccl_intra as nccl_checks

    seen = []

    def run_local(**kw):
        seen.append(kw["devices"])
        return {"status": "error", "summary": "recorded only", "results": []}

    monkeypatch.setattr(nccl_checks, "run_local", run_local)
    results = nccl_checks.intra_check.run(_cuda_ctx())
    assert seen == [[0, 2]] and [r.summary for r in results if r.gpu == 1] == [SUMMARY_1]
    assert exit_code_for(results) == 3
    # two of three in use: nothing left to run a collective on
    seen.clear()
    results = nccl_checks.intra_check.run(_cuda_ctx(processes=reader(busy_gpus=(0, 1))))
    assert seen == [] and results[-1].summary == "needs at least 2 GPUs, 1 selected and not in use"
    assert exit_code_for(results) == 3
    seen.clear()
    results = nccl_checks.intra_check.run(_cuda_ctx(force=True))
    assert seen == [[0, 1, 2]]
    assert any("--force: loaded although GPU 1" in e for r in results for e in r.evidence)


# -- DCGM: busy GPUs are left out of `dcgmi diag -i` --------------------------------------------------
@pytest.fixture
def dcgmi(tmp_path):
    log = tmp_path / "dcgmi.log"
    script = tmp_path / "dcgmi"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in discovery) echo "2 GPUs found."; exit 0;; '
                      f'diag) cat {FIX / "v3_r3_all_pass.json"}; exit 0;; esac\nexit 2\n')
    script.chmod(0o755)
    log.write_text("")
    return SimpleNamespace(path=str(script), calls=lambda: [ln.split() for ln in log.read_text().splitlines()])


def _dcgm_ctx(dcgmi, gpus=2, **kw):
    ctx = _cuda_ctx(gpus=gpus, **kw)
    ctx.config = Config(checks={"eud.dcgm": {"dcgmi_path": dcgmi.path}})
    return ctx


def test_dcgm_runs_only_on_the_gpus_not_in_use(dcgmi):
    from gpucheck.tests_suite.eud_dcgm import dcgm_check

    results = dcgm_check.run(_dcgm_ctx(dcgmi, gpus=3))
    assert dcgmi.calls()[-1] == ["diag", "-r", "3", "-j", "-i", "0,2"]
    assert [r.summary for r in results if r.gpu == 1 and r.unexamined] == [SUMMARY_1]
    assert exit_code_for(results) == 3
    # nothing busy: the command line is unchanged (every GPU, no -i)
    dcgm_check.run(_dcgm_ctx(dcgmi, gpus=3, processes=reader(busy_gpus=())))
    assert dcgmi.calls()[-1] == ["diag", "-r", "3", "-j"]


def test_dcgm_with_every_gpu_busy_or_no_gpu_known_does_not_start(dcgmi):
    from gpucheck.tests_suite.eud_dcgm import dcgm_check

    results = dcgm_check.run(_dcgm_ctx(dcgmi, gpus=2, processes=reader(busy_gpus=(0, 1))))
    assert [c[0] for c in dcgmi.calls()] == ["discovery"] and all(r.unexamined for r in results)
    ctx = _dcgm_ctx(dcgmi)
    ctx.snapshot = {"nvml": {"ok": False, "error": {"kind": "driver_not_loaded", "message": "Driver Not Loaded"}},
                    "gpus": []}
    (r,) = dcgm_check.run(ctx)
    assert r.unexamined and r.gpu is None and r.summary == (
        "cannot tell whether the GPUs are in use: NVML lists no GPU (driver_not_loaded: Driver Not Loaded): "
        "not loaded; --force to load it anyway")
    assert [c[0] for c in dcgmi.calls()] == ["discovery", "discovery"]
    ctx.force = True
    results = dcgm_check.run(ctx)
    assert dcgmi.calls()[-1] == ["diag", "-r", "3", "-j"]
    assert all(any(e.startswith("--force: loaded although cannot tell") for e in r.evidence) for r in results)


# -- through the command line, with NVML's answers faked ---------------------------------------------
def _busy_node(monkeypatch):
    """Two H100s on NVML; a job (PID 4711, 5 GiB) on GPU 1."""
    idle = {"nvmlDeviceGetComputeRunningProcesses_v3": [], "nvmlDeviceGetGraphicsRunningProcesses_v3": [],
            "nvmlDeviceGetMPSComputeRunningProcesses_v3": []}
    busy_gpu = {**idle, "nvmlDeviceGetComputeRunningProcesses_v3": [proc(JOB_PID, 5 * GIB)]}
    monkeypatch.setattr(N, "process_name", lambda pid, proc_root="/proc": "python" if pid == JOB_PID else None)
    return FakeNode([h100(0, **idle), h100(1, **busy_gpu)]).install(monkeypatch)


def test_burn_command_exits_3_naming_the_pid_and_force_loads(monkeypatch, started, tmp_path, capsys):
    from gpucheck.core import check as check_mod

    _busy_node(monkeypatch)
    monkeypatch.setattr(check_mod, "_torch_has_cuda", lambda spec: True)  # a CUDA build of torch, as on a GPU node
    argv = ["burn", "--device", "cuda", "--duration", "1s", "--json", "--no-history", "--state-dir", str(tmp_path)]
    rc = main(argv)
    v = json.loads(capsys.readouterr().out)
    assert rc == 3 and v["status"] == "error" and started == [0]
    (r,) = [r for r in v["results"] if r["gpu"] == 1]
    assert r["status"] == "skip" and r["unexamined"] is True and r["summary"] == SUMMARY_1
    started.clear()
    main(argv + ["--force"])
    v = json.loads(capsys.readouterr().out)
    assert started == [0, 1]
    (r,) = [r for r in v["results"] if r["gpu"] == 1]
    assert "--force: loaded although GPU 1 is in use by PID 4711 (python), 5 GiB" in r["evidence"]


def test_nccl_run_refuses_a_busy_gpu_and_blames_no_host(monkeypatch, capsys):
    from gpucheck.nccl import procs, report

    _busy_node(monkeypatch)
    ran = []
    monkeypatch.setattr(procs, "run_ranks", lambda specs, **kw: ran.append([s.local_rank for s in specs]) or [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    def argv(local_rank, *extra):
        return ["nccl", "run", "--rank", "1", "--world-size", "2", "--local-rank", str(local_rank),
                "--master-port", "29500", "--backend", "nccl", *extra]

    rc = main(argv(1))
    out = capsys.readouterr()
    (ev,) = [json.loads(line) for line in out.out.splitlines()]
    assert rc == 3 and ran == []
    assert ev["event"] == "result" and ev["status"] == "error" and ev["failure"]["kind"] == "busy"
    assert ev["summary"] == f"not started: {SUMMARY_1}" and SUMMARY_1 in out.err
    # the peer timed out waiting for the rank that refused: the group could not judge, no host is blamed
    peer = {"event": "result", "rank": 0, "world": 2, "host": "a", "status": "fail",
            "failure": {"kind": "timeout", "rank": 1, "host": "b"}, "results": []}
    merged = report.merge([peer, ev], 2)
    assert merged["status"] == "error" and merged["summary"].startswith("rank 1 on host")
    main(argv(0))
    assert ran == [[0]]  # GPU 0 is free
    capsys.readouterr()
    main(argv(1, "--force"))
    assert ran[-1] == [1] and "--force: loaded although GPU 1 is in use by PID 4711" in capsys.readouterr().err


def test_a_pair_with_a_busy_host_is_an_error_not_a_bad_node():
    """`nccl pairs`: host b refused (its GPU is in use), host a timed out waiting for b's rank:
    the pair could not be judged, and b is not blamed (old: "timeout waiting for rank 1", b bad)."""
    from gpucheck.nccl.pairs_run import pair_outcome
    from gpucheck.nccl.report import merge

    refused = {"event": "result", "rank": 1, "world": 2, "host": "b", "status": "error",
               "summary": f"not started: {SUMMARY_1}", "results": [],
               "failure": {"kind": "busy", "rank": 1, "host": "b", "detail": SUMMARY_1}}
    waited = {"event": "result", "rank": 0, "world": 2, "host": "a", "status": "fail", "results": [],
              "failure": {"kind": "timeout", "rank": 1, "host": "b", "what": "rendezvous"}}
    group = {**merge([waited, refused], 2), "launch_errors": {}}
    assert group["status"] == "error" and group["summary"] == f"rank 1 on host b did not start: {SUMMARY_1}"
    out = pair_outcome(1, ("a", "b"), group, "all_reduce")
    assert out.status == "error" and out.blamed == []


def test_cuda_devices_map_to_nvml_indices():
    same = [{"index": i, "uuid": f"GPU-{i}aaa", "name": "H100"} for i in range(4)]
    assert busy.cuda_to_nvml([0, 1], {}, same) == ({0: 0, 1: 1}, None)
    assert busy.cuda_to_nvml([0, 1], {"CUDA_VISIBLE_DEVICES": "2,3"}, same) == ({0: 2, 1: 3}, None)
    assert busy.cuda_to_nvml([0, 1, 2], {"CUDA_VISIBLE_DEVICES": "GPU-3,1,9,0"}, same) == ({0: 3, 1: 1}, None)
    assert busy.cuda_to_nvml([0], {"CUDA_VISIBLE_DEVICES": ""}, same) == ({}, None)
    mapping, problem = busy.cuda_to_nvml([0], {"CUDA_VISIBLE_DEVICES": "MIG-1234"}, same)
    assert mapping == {} and "MIG instance" in problem
    mixed = same[:2] + [{"index": 2, "uuid": "GPU-2aaa", "name": "A100"}]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in busy.cuda_to_nvml([0], {}, mixed)[1]
    assert busy.cuda_to_nvml([0], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, mixed) == ({0: 0}, None)
    assert busy.cuda_to_nvml([0], {"CUDA_VISIBLE_DEVICES": "GPU-2a"}, mixed) == ({0: 2}, None)  # a UUID is exact


def test_nccl_run_that_cannot_tell_its_gpu_refuses():
    refusals, notes = busy.guard_ranks([0], force=False, environ={}, devices_fn=lambda: (None, "driver_not_loaded"))
    assert refusals == ["cannot tell whether the GPUs are in use: driver_not_loaded: not loaded; "
                        "--force to load it anyway"] and notes == []
    refusals, notes = busy.guard_ranks([0], force=True, environ={}, devices_fn=lambda: (None, "driver_not_loaded"))
    assert refusals == [] and notes[0].startswith("--force: cannot tell")


# -- pass-through: hooks, sweep, verdict cause ---------------------------------------------------------
def test_force_passes_through_the_hooks_and_the_sweep(tmp_path):
    from gpucheck.cli.sweep import build_plan
    from gpucheck.fleet import hook

    seen = []

    def execute(req, on_verdict=None, on_warning=None):
        seen.append(req)
        return 0

    env = {"SLURMD_NODENAME": "gpu7", "SLURM_JOB_ID": "1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    for force in (False, True):
        hook.run_hook(hook.HookOptions("prolog", state_dir=str(tmp_path), force=force), env,
                      runner=lambda argv: (0, "", ""), log=lambda p, m: None, execute=execute)
    assert [r.force for r in seen] == [False, True]
    kw = dict(level=None, checks=(), skips=(), snapshot_path=None, injections=(), device=None, strict=False,
              run_args=(), node_args=(), remote_cmd="gpucheck", fanout=None, timeout_text="10m", use_srun=False)
    assert "--force" not in build_plan(["n1"], **kw).run_args
    assert build_plan(["n1"], force=True, **kw).run_args[-1] == "--force"


def test_verdict_cause_names_the_busy_gpu():
    from gpucheck.core.result import Result
    from gpucheck.core.verdict import RunFacts, build_verdict
    from gpucheck.fleet.sweep import verdict_cause

    v = build_verdict([Result("ecc", Status.PASS, "ok", gpu=0),
                       Result("burn.gemm", Status.SKIP, SUMMARY_1, gpu=1, unexamined=True)],
                      RunFacts(level=Level.STANDARD, started_at=0.0, duration_s=1.0, checks=(), software={}, host="n1"))
    assert v.status is Status.ERROR and verdict_cause(v) == f"burn.gemm gpu1: {SUMMARY_1}"


def test_force_is_documented_in_every_command_that_loads(capsys):
    for argv in (["run"], ["burn"], ["poet"], ["eud"], ["repro", "check"], ["repro", "record"], ["nccl", "run"],
                 ["sweep"], ["slurm", "prolog"], ["slurm", "epilog"]):
        assert main([*argv, "--help"]) == 0
        assert "--force" in capsys.readouterr().out, argv
