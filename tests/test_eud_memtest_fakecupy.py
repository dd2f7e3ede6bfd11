"""eud.memtest's CuPy backend on the CPU: gpucheck.eud.memtest_worker.CupyBackend and
gpucheck.kernels.cupy_module run unchanged against a stub `cupy` (tests/fakecupy.py) whose
launches execute gpucheck/kernels/memtest.cu under the CPU emulator, with every launch argument
checked against the kernel's parameter list. So the GPU path's sizing, allocation, step buffers,
launch geometry and arguments, copy baseline, error read-back, release of memory and the check
around it are exercised without a GPU; only CuPy and the hardware themselves are not."""

from __future__ import annotations

import sys

import pytest

np = pytest.importorskip("numpy")

import cudaemu  # noqa: E402
import fakecupy  # noqa: E402
from gpucheck.check import Context, Level  # noqa: E402
from gpucheck.config import Config  # noqa: E402
from gpucheck.eud import memtest as mt  # noqa: E402
from gpucheck.eud import memtest_worker as mw  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.inject import parse_injection  # noqa: E402
from gpucheck.kernels import cupy_module, source  # noqa: E402
from gpucheck.result import Action, Status  # noqa: E402
from gpucheck.runner import run_checks  # noqa: E402
from gpucheck.workers import pool  # noqa: E402
from gpucheck.workers.pool import CRASHED, OK, LocalChannel, WorkerJob, WorkerOutcome  # noqa: E402

STEP_BYTES = 8 * (P.STATS_WORDS + 3 * 8)  # stats + errs (max_errors=8): CupyBackend's own buffers
CHUNK = 8 << 10
# Small grids with the production code's own geometry: 2 SMs x 1 block of 64 threads, so every
# grid-stride loop goes round several times (1024 words per chunk).
SMALL = dict(fraction=1.0, headroom_fraction=0.0, headroom_min_bytes=0, chunk_bytes=CHUNK, copy_bytes=4 << 10,
             copy_repeats=2, max_errors=8, block=64, blocks_per_sm=1)


@pytest.fixture
def fake(monkeypatch):
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    return fakecupy.install(monkeypatch, free=(24 << 10) + STEP_BYTES, sms=2)


def _chan():
    return LocalChannel(WorkerJob("gpu0", gpu=0, device="cuda", visible_device="GPU-fake"))


def _run(**kw):
    cfg = mw.MemtestConfig.from_args({**SMALL, **kw})
    be = mw.CupyBackend.create(_chan(), cfg)
    return mw.run_memtest(be, cfg, _chan()), be


@pytest.mark.parametrize("pattern", P.NAMES)
def test_every_pattern_finds_the_injected_flip_through_the_cupy_backend(fake, pattern):
    offset, bit = 8 * 1500 + 16, 62  # word 1502: chunk 1 (1024 words per chunk)
    out, be = _run(patterns=[pattern], inject={"offset": offset, "bit": bit})
    assert out["backend"] == "cupy" and out["device"]["name"] == "Fake GPU" and out["device"]["sms"] == 2
    assert out["region_bytes"] == 24 << 10 and out["memory"]["chunk_count"] == 3
    assert out["memory"]["allocation_note"] is None and out["copy"]["bytes"] == 4 << 10
    e = out["errors"]
    assert e["errors"] == 1 and e["first_offset"] == offset and e["last_offset"] == offset
    (r,) = e["records"]
    want = P.word_value(P.BY_NAME[pattern].kind, P.pattern_seed(pattern, 0, 0), offset // 8)
    got = (r["offset"], r["expected"], r["actual"], r["bits"], r["chunk"])
    assert got == (offset, want, want ^ (1 << bit), [bit], 1)
    assert r["pattern"] == pattern and r["pass"] == 0
    assert r["address"] == out["chunks"][1]["address"] + offset - CHUNK  # the device address of the word
    assert (e["down"] if want >> bit & 1 else e["up"])[bit] == 1 and sum(e["up"]) + sum(e["down"]) == 1
    assert e["confirmations"] == [{"pattern": pattern, "pass": 0, "errors": 1, "errors_again": 0, "same_words": 0,
                                   "reproduced": False}]

    # the launch sequence: each step over the 3 chunks (descending steps from the top), in the
    # run and its confirmation run, plus the one flip; all on the current (null) stream
    steps = P.steps_for(pattern)
    per_run = [("memtest_fill" if s.op == "fill" else "memtest_check") for s in steps for _ in range(3)]
    kernels = [ln.kernel for ln in fake.launches]
    assert kernels == per_run[:3] + ["memtest_flip"] + per_run[3:] + per_run
    bases = [int(ln.args[2]) for ln in fake.launches if ln.kernel != "memtest_flip"]
    order = [list(reversed(range(3))) if s.descending else list(range(3)) for s in steps]
    assert bases == [1024 * c for o in order for c in o] * 2
    for ln in fake.launches:
        assert ln.stream == 0 and ln.device == 0
        if ln.kernel == "memtest_flip":
            assert (ln.grid, ln.block) == ((1, 1, 1), (1, 1, 1)) and int(ln.args[1]) == offset // 8 - 1024
        else:
            assert ln.block == (64, 1, 1) and ln.grid == (2, 1, 1)  # min(ceil(1024/64/per_thread), 2 SMs x 1)
    check = next(ln for ln in fake.launches if ln.kernel == "memtest_check")
    assert check.args[9] == be.stats.data.ptr and check.args[10] == be.errs.data.ptr and int(check.args[11]) == 8
    assert fake.syncs.count(0) >= 1  # the flip is synchronised (sync=True)

    # the chunks are freed as soon as run_memtest releases them; the step buffers with the backend
    assert fake.live_bytes() == STEP_BYTES
    del be
    assert fake.live == {} and fake.free == (24 << 10) + STEP_BYTES


def test_the_stub_reads_memtest_cu_and_refuses_arguments_cupy_would_misread(fake):
    params = fakecupy.kernel_params(source("memtest"))
    assert [t for t, _ in params["memtest_check"]] == ["gc_u64*", "gc_u64", "gc_u64", "int", "gc_u64", "gc_u64", "int",
                                                       "gc_u64", "int", "gc_u64*", "gc_u64*", "gc_u64"]
    cfg = mw.MemtestConfig.from_args(SMALL)
    be = mw.CupyBackend.create(_chan(), cfg)
    buf = be.alloc(256)
    good = mw.fill_args(np, buf, 256, 0, P.KIND_ADDRESS, 0, 0)
    cupy_module.launch("memtest", "memtest_fill", (1, 1, 1), (64, 1, 1), good)
    assert np.array_equal(buf.get(), P.word_values(P.KIND_ADDRESS, 0, 0, 256))
    # a Python int for `int kind` goes as 8 bytes; an int32 for `gc_u64 n` as 4: both refused
    for bad in (good[:3] + (P.KIND_ADDRESS,) + good[4:], (buf, np.int32(256)) + good[2:], good[:-1]):
        with pytest.raises(fakecupy.LaunchArgumentError):
            cupy_module.launch("memtest", "memtest_fill", (1, 1, 1), (64, 1, 1), bad)
    # a geometry the driver refuses is a KernelError naming the kernel, not a verdict on memory
    with pytest.raises(cupy_module.KernelError, match=r"memtest:memtest_fill grid=\(1, 1, 1\) block=\(2048, 1, 1\)"):
        cupy_module.launch("memtest", "memtest_fill", (1, 1, 1), (2048, 1, 1), good)
    assert len(fake.modules) == 1 and fake.modules[0].options == cupy_module.OPTIONS  # compiled once


def test_running_out_of_memory_part_way_tests_fewer_chunks_and_says_so(fake):
    # another process takes 6 KiB between the sizing (memGetInfo) and the allocation
    cfg = mw.MemtestConfig.from_args({**SMALL, "patterns": ["random"], "inject": {"offset": 8 * 1100, "bit": 3}})
    be = mw.CupyBackend.create(_chan(), cfg)
    fake.take_after_meminfo(6 << 10)
    out = mw.run_memtest(be, cfg, _chan())
    m = out["memory"]
    assert m["target_bytes"] == 24 << 10 and m["chunk_count"] == 2 and out["region_bytes"] == 16 << 10
    assert m["allocation_note"].startswith("allocated 16384 of 24576 bytes: out of memory at chunk 2")
    assert "cudaErrorMemoryAllocation" in m["allocation_note"] and out["notes"] == [m["allocation_note"]]
    assert out["errors"]["errors"] == 1 and out["errors"]["first_offset"] == 8 * 1100  # the smaller region is tested
    assert fake.live_bytes() == STEP_BYTES


@pytest.mark.parametrize("oom", ["runtime", "pool"])
def test_out_of_memory_at_setup_is_a_setup_error(monkeypatch, oom):
    if cudaemu.usable():
        pytest.skip(cudaemu.usable())
    fake = fakecupy.install(monkeypatch, free=STEP_BYTES - 8, oom=oom)
    out = mw.memtest_worker(dict(SMALL), _chan())
    assert out["setup_error"].startswith("out of GPU memory before the test could start")
    assert fake.launches == [] and fake.live == {}


def test_no_chunk_that_fits_is_a_setup_error_not_a_pass(fake):
    # all the free memory is headroom: nothing to test
    out = mw.memtest_worker({**SMALL, "headroom_min_bytes": 1 << 20}, _chan())
    assert out["setup_error"] == "could not allocate memory to test (target 0 bytes)" and "errors" not in out
    # the first chunk does not fit (another process took the memory after the sizing)
    cfg = mw.MemtestConfig.from_args(SMALL)
    be = mw.CupyBackend.create(_chan(), cfg)
    fake.take_after_meminfo(fake.free)
    out = mw.run_memtest(be, cfg, _chan())
    assert out["setup_error"].startswith("could not allocate memory to test (target 24576 bytes; allocated 0 of "
                                         "24576 bytes: out of memory at chunk 0")
    assert [ln.kernel for ln in fake.launches] == []
    del be
    assert fake.live == {}


def test_no_device_and_bad_device_are_setup_errors(monkeypatch):
    fake = fakecupy.install(monkeypatch, count=0)
    assert mw.memtest_worker(dict(SMALL), _chan())["setup_error"].startswith("cuda:0 does not exist (CuPy sees 0")
    fake.count = 1
    chan = LocalChannel(WorkerJob("gpu3", gpu=3, device="cuda"))  # not narrowed by CUDA_VISIBLE_DEVICES
    assert mw.memtest_worker(dict(SMALL), chan)["setup_error"] == "cuda:3 does not exist (CuPy sees 1 GPU(s))"


# -- the whole check: eud.memtest on "cuda", its workers run in this process ---------------------
def _in_process_workers(target, jobs, *, sampler=None, **_):
    """run_workers without processes (a stub cupy in sys.modules reaches no spawned worker):
    each job's target on a LocalChannel, its exception a crash, as _child_main reports it."""
    out = {}
    if sampler is not None:
        sampler.start()
    try:
        for job in jobs:
            try:
                res = pool.resolve_target(target)(dict(job.args), LocalChannel(job))
                out[job.worker_id] = WorkerOutcome(job, OK, result=res)
            except Exception as e:  # noqa: BLE001
                out[job.worker_id] = WorkerOutcome(job, CRASHED, error=f"{type(e).__name__}: {e}")
    finally:
        if sampler is not None:
            sampler.stop()
    return out


def _cuda_ctx(injections=()):
    from gpucheck.telemetry.nvml import GpuProcesses

    snapshot = {"gpus": [{"index": i, "uuid": f"GPU-0000000{i}-fake", "name": "Fake GPU", "state": "ok"}
                         for i in range(2)]}
    # the check's own launch geometry (256 threads, 8 blocks per SM), small memory
    params = {k: v for k, v in SMALL.items() if k not in ("fraction", "block", "blocks_per_sm")}
    return Context(level=Level.STANDARD, device="cuda", snapshot=snapshot,
                   config=Config(checks={"eud.memtest": {**params, "fraction_level2": 0.5}}),
                   injections=[parse_injection(t) for t in injections],
                   options={"sample_fn": lambda gpu: {"temperature_c": 40.0},
                            "gpu_processes_fn": lambda gpus: {g: GpuProcesses(g, ()) for g in gpus}})  # no job


def test_the_whole_check_on_cuda_fails_exactly_the_gpu_with_the_flip(monkeypatch, fake):
    monkeypatch.setattr(pool, "run_workers", _in_process_workers)
    fake.free = (48 << 10) + STEP_BYTES  # fraction 0.5 of the free memory: 24 KiB per GPU
    ctx = _cuda_ctx(["bitflip:gpu=1,offset=12000,bit=5"])
    res = {r.gpu: r for r in run_checks([mt.memtest], ctx, install_signal_handlers=False).results}
    assert set(res) == {0, 1}
    ok = res[0]
    assert ok.status == Status.PASS and ok.metrics["errors"] == 0 and ok.metrics["bytes_tested"] == 24 << 10
    assert ok.metrics["patterns"] == len(P.NAMES) and ok.summary.startswith("no memory errors in 24.0 KiB tested")
    assert any("device 'Fake GPU': tested 24.0 KiB in 3 chunk(s)" in x for x in ok.evidence)
    bad = res[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN
    assert bad.injected == ["bitflip:gpu=1,offset=12000,bit=5"]
    assert bad.metrics["first_error_offset"] == 12000 and bad.metrics["flipped_bits"] == {"5": 1}
    assert "memory errors: 1 in 24.0 KiB tested" in bad.summary and "offset 0x2ee0" in bad.summary
    assert fake.live == {}  # every GPU's memory given back
    # the check's default geometry: fill 1024 words in 4 blocks of 256 threads, check (4 words per
    # thread) in 1; capped at 2 SMs x 8 blocks per SM
    geometry = {(ln.kernel, ln.grid, ln.block) for ln in fake.launches}
    assert geometry == {("memtest_fill", (4, 1, 1), (256, 1, 1)), ("memtest_check", (1, 1, 1), (256, 1, 1)),
                        ("memtest_flip", (1, 1, 1), (1, 1, 1))}


def test_a_kernel_fault_crashes_the_worker_and_fails_its_gpu(monkeypatch, fake):
    monkeypatch.setattr(pool, "run_workers", _in_process_workers)
    fake.free = (48 << 10) + STEP_BYTES
    fake.fail_next("memtest_check")  # surfaces at the next synchronising call (the step's end event)
    ctx = _cuda_ctx()
    ctx.gpus = [0]
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU
    assert "pattern-test worker crashed: CUDARuntimeError: cudaErrorIllegalAddress" in r.summary


def test_the_stub_does_not_outlive_its_tests():
    assert not isinstance(sys.modules.get("cupy"), fakecupy.FakeCupy)
    assert not any(type(m).__module__ == "fakecupy" for m in cupy_module._modules.values())
