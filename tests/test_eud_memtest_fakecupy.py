"""eud.memtest's CuPy backend on the CPU: gpucheck.eud.memtest_worker.CupyBackend and
gpucheck.kernels.cupy_module run unchanged against a stub `cupy` (tests/fakecupy.py) whose
launches execute gpucheck/kernels/memtest.cu under the CPU emulator, with every launch argument
checked against the kernel's parameter list. So the GPU path's sizing, allocation, step buffers,
launch geometry and arguments, copy baseline, error read-back, release of memory and the check
around it are exercised without a GPU; only CuPy and the hardware themselves are not."""

from __future__ import annotations

import sys
import types

import pytest

np = pytest.importorskip("numpy")

import cudaemu  # noqa: E402
import fakecupy  # noqa: E402
from gpucheck.core.check import Context
from gpucheck.core.levels import Level  # noqa: E402
from gpucheck.core.config import Config  # noqa: E402
from gpucheck.tests_suite import eud_memtest as mt  # noqa: E402
from gpucheck.eud import memtest_cupy  # noqa: E402
from gpucheck.eud import memtest_worker as mw  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.core.inject import parse_injection  # noqa: E402
from gpucheck.kernels import cupy_module, source  # noqa: E402
from gpucheck.core.result import Action, Status  # noqa: E402
from gpucheck.core.runner import run_checks  # noqa: E402
from gpucheck.workers import pool  # noqa: E402
from gpucheck.workers.pool import CRASHED, OK, LocalChannel, WorkerJob, WorkerOutcome  # noqa: E402

L2 = 4 << 10  # the stub's L2 size: the scrub buffer is twice that
STEP_BYTES = 8 * (P.STATS_WORDS + 3 * 8) + 2 * L2  # stats + errs (max_errors=8) + scrub: CupyBackend's own
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
    return fakecupy.install(monkeypatch, free=(24 << 10) + STEP_BYTES, sms=2, l2=L2)


def _chan():
    return LocalChannel(WorkerJob("gpu0", gpu=0, device="cuda", visible_device="GPU-fake"))


class FakeEccReader:
    """gpucheck.eud.memtest_ecc.NvmlEccReader's stand-in: the counters of one GPU, each growing by
    `grow[counter]` per reading after the first (a flag: set from the second reading on); the
    counters in `unread` fail to read (no permission)."""

    source = "fake NVML"

    def __init__(self, index, uuid=None, grow=None, unread=()):
        self.index, self.uuid, self.grow, self.unread, self.reads = index, uuid, dict(grow or {}), tuple(unread), 0

    def read(self, label):
        from gpucheck.eud.memtest_ecc import COUNTERS, FLAGS, empty_reading

        r = empty_reading(label)
        for c in COUNTERS:
            if c in self.unread:
                r["errors"][c] = "no_permission"
            elif c in FLAGS:
                r["counters"][c] = bool(self.grow.get(c)) and self.reads > 0
            else:
                r["counters"][c] = 10 + self.reads * int(self.grow.get(c, 0))
        self.reads += 1
        return r

    def close(self):
        pass


@pytest.fixture
def ecc_readers(monkeypatch):
    """Every NvmlEccReader the workers make: FakeEccReaders of healthy GPUs (the test may set
    `grow` / `unread` per GPU index in the returned namespace before the run)."""
    made = types.SimpleNamespace(readers=[], grow={}, unread={})

    def make(index, uuid=None):
        made.readers.append(FakeEccReader(index, uuid, made.grow.get(index), made.unread.get(index, ())))
        return made.readers[-1]

    monkeypatch.setattr(mw, "NvmlEccReader", make)
    return made


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

    # the launch sequence: each step over the 3 chunks (descending steps from the top), in the run
    # and its confirmation run, plus the one flip, and an L2 scrub before each moving-inversions
    # turnaround; one kernel per pattern family; all on the current (null) stream
    family = P.kernel_pattern(P.BY_NAME[pattern].kind, 0).family
    steps = P.steps_for(pattern)
    per_run = [k for s in steps for k in (["memtest_scrub"] if s.scrub_before else [])
               + [f"memtest_{'fill' if s.op == 'fill' else 'check'}_{family}"] * 3]
    kernels = [ln.kernel for ln in fake.launches]
    assert kernels == per_run[:3] + ["memtest_flip"] + per_run[3:] + per_run
    bases = [int(ln.args[2]) for ln in fake.launches if ln.kernel not in ("memtest_flip", "memtest_scrub")]
    order = [list(reversed(range(3))) if s.descending else list(range(3)) for s in steps]
    assert bases == [1024 * c for o in order for c in o] * 2
    for ln in fake.launches:
        assert ln.stream == 0 and ln.device == 0
        if ln.kernel == "memtest_flip":
            assert (ln.grid, ln.block) == ((1, 1, 1), (1, 1, 1)) and int(ln.args[1]) == offset // 8 - 1024
        elif ln.kernel == "memtest_scrub":
            assert ln.block == (64, 1, 1) and ln.grid == (2, 1, 1) and int(ln.args[1]) == L2 // 8
        else:  # 512 16-byte units a chunk, 4 per thread: 2 blocks of 64, and one wave: 2 SMs x 1 block
            assert ln.block == (64, 1, 1) and ln.grid == (2, 1, 1) and int(ln.args[1]) == 512
    check = next(ln for ln in fake.launches if ln.kernel.startswith("memtest_check"))
    assert check.args[9] == be.stats.data.ptr and check.args[10] == be.errs.data.ptr and int(check.args[11]) == 8
    assert fake.syncs.count(0) >= 1  # the flip is synchronised (sync=True)
    assert fake.event_polls >= len(steps) * 2  # every step's end was polled, not waited for blocking

    # the chunks are freed as soon as run_memtest releases them; the step buffers with the backend
    assert fake.live_bytes() == STEP_BYTES
    del be
    assert fake.live == {} and fake.free == (24 << 10) + STEP_BYTES


def test_the_stub_reads_memtest_cu_and_refuses_arguments_cupy_would_misread(fake):
    params = fakecupy.kernel_params(source("memtest"))
    assert [t for t, _ in params["memtest_check_random"]] == [
        "mt_u128*", "gc_u32", "gc_u64", "gc_u64", "gc_u64", "gc_u64", "int", "gc_u64", "int", "gc_u64*", "gc_u64*",
        "gc_u32"]
    cfg = mw.MemtestConfig.from_args(SMALL)
    be = mw.CupyBackend.create(_chan(), cfg)
    buf = be.alloc(256)
    kp = P.kernel_pattern(P.KIND_ADDRESS, 0)
    good = memtest_cupy.fill_args(np, buf, 128, 0, kp, 0)
    cupy_module.launch("memtest", "memtest_fill_address", (1, 1, 1), (64, 1, 1), good)
    assert np.array_equal(buf.get(), P.word_values(P.KIND_ADDRESS, 0, 0, 256))
    # a Python int for `gc_u32 n16` goes as 8 bytes; a uint64 for it too: both refused
    for bad in ((buf, 128) + good[2:], (buf, np.uint64(128)) + good[2:], good[:-1]):
        with pytest.raises(fakecupy.LaunchArgumentError):
            cupy_module.launch("memtest", "memtest_fill_address", (1, 1, 1), (64, 1, 1), bad)
    # a geometry the driver refuses is a KernelError naming the kernel, not a verdict on memory
    with pytest.raises(cupy_module.KernelError,
                       match=r"memtest:memtest_fill_address grid=\(1, 1, 1\) block=\(2048, 1, 1\)"):
        cupy_module.launch("memtest", "memtest_fill_address", (1, 1, 1), (2048, 1, 1), good)
    assert len(fake.modules) == 1 and fake.modules[0].options == cupy_module.OPTIONS  # compiled once


def test_grids_are_one_wave_from_the_occupancy_api(monkeypatch):
    """The grid never exceeds SMs x the blocks an SM holds (the occupancy API's answer for that
    kernel and block size, capped by blocks_per_sm): every block resident, one sweep in order."""
    fake = fakecupy.install(monkeypatch, free=(256 << 10) + STEP_BYTES, sms=2, l2=L2,
                            occupancy={"memtest_fill_random": 5, "memtest_check_random": 3, "memtest_scrub": 2})
    # 64 KiB chunks: 4096 units, 4 per thread of 64: 16 blocks would cover one once, more than a wave
    out, _ = _run(patterns=["moving-inversions"], chunk_bytes=64 << 10, blocks_per_sm=32)
    assert out["errors"]["errors"] == 0 and out["memory"]["chunk_count"] == 4
    grids = {(ln.kernel, ln.grid) for ln in fake.launches}
    assert grids == {("memtest_fill_random", (10, 1, 1)), ("memtest_check_random", (6, 1, 1)),
                     ("memtest_scrub", (4, 1, 1))}
    assert {(k, b) for k, b, _ in fake.occupancy_queries} == {(k, 64) for k in memtest_cupy.KERNELS
                                                                if k != "memtest_flip"}
    fake.launches.clear()
    _run(patterns=["moving-inversions"], chunk_bytes=64 << 10, blocks_per_sm=2)  # the cap applies below it
    assert {ln.grid for ln in fake.launches} == {(4, 1, 1)}


@pytest.mark.slow
def test_steps_are_waited_for_by_polling_an_event_with_heartbeats(fake):
    """A step's end is an event that is polled with a heartbeat per poll, not a blocking wait: a
    long step (a chunk full of errors) keeps the worker alive."""
    def run(busy_polls):
        cfg = mw.MemtestConfig.from_args({**SMALL, "patterns": ["zeros"]})
        chan = _chan()
        be = mw.CupyBackend.create(chan, cfg)
        fake.not_done(busy_polls)
        polls = fake.event_polls
        out = mw.run_memtest(be, cfg, chan)
        assert out["errors"]["errors"] == 0 and out["passes"] == 1
        return chan.heartbeats, fake.event_polls - polls

    beats, polls = run(0)
    beats_busy, polls_busy = run(60)
    assert polls_busy == polls + 60 and beats_busy >= beats + 60


def test_a_step_still_running_past_the_stall_timeout_is_reported_then_waited_for_without_heartbeats(fake):
    """A kernel that never returns must still read as a hang: past stall_timeout_s the worker says
    which step stalled and stops heartbeating (the supervisor then kills it as hung)."""
    log = []
    cfg = mw.MemtestConfig.from_args({**SMALL, "patterns": ["zeros"], "stall_timeout_s": 0.05})
    chan = _chan()
    chan.heartbeat = lambda force=False: log.append("heartbeat")
    chan.progress = lambda info: log.append(info)
    be = mw.CupyBackend.create(chan, cfg)
    sync = fake.module.cuda.Event.synchronize
    fake.module.cuda.Event.synchronize = lambda ev: (log.append("blocking wait"), sync(ev))[1]
    try:
        fake.not_done(10 ** 9)  # nothing ever finishes
        mw.run_memtest(be, cfg, chan)
    finally:
        fake.not_done(0)
        fake.module.cuda.Event.synchronize = sync
    stalls = [i for i, x in enumerate(log) if isinstance(x, dict) and "stalled" in x]
    assert [log[i]["stalled"] for i in stalls][:4] == ["the last kernels", "the copy baseline", "the copy baseline",
                                                       "zeros: fill"]
    assert all(log[i - 1] == "heartbeat" and log[i + 1] == "blocking wait" for i in stalls)
    assert all(log[i]["waited_s"] >= 0.05 for i in stalls)


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


def test_out_of_memory_at_setup_is_a_setup_error(monkeypatch):
    if cudaemu.usable():
        pytest.skip(cudaemu.usable())
    fake = fakecupy.install(monkeypatch, free=STEP_BYTES - 8)  # cupy.cuda.Memory: cudaErrorMemoryAllocation
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
    from gpucheck.platform.telemetry.fake import FakeTelemetry

    snapshot = {"gpus": [{"index": i, "uuid": f"GPU-0000000{i}-fake", "name": "Fake GPU", "state": "ok"}
                         for i in range(2)]}
    # the check's own launch geometry (256 threads, 8 blocks per SM), small memory
    params = {k: v for k, v in SMALL.items() if k not in ("fraction", "block", "blocks_per_sm")}
    return Context(level=Level.STANDARD, device="cuda", snapshot=snapshot,
                   config=Config(checks={"eud.memtest": {**params, "fraction_level2": 0.5}}),
                   injections=[parse_injection(t) for t in injections],
                   telemetry=FakeTelemetry(samples=lambda gpu: {"temperature_c": 40.0}))  # and no job on the GPUs


@pytest.mark.slow
def test_the_whole_check_on_cuda_fails_exactly_the_gpu_with_the_flip(monkeypatch, fake, ecc_readers):
    monkeypatch.setattr(pool, "run_workers", _in_process_workers)
    fake.free = (48 << 10) + STEP_BYTES  # fraction 0.5 of the free memory: 24 KiB per GPU
    ctx = _cuda_ctx(["bitflip:gpu=1,offset=12000,bit=5"])
    res = {r.gpu: r for r in run_checks([mt.memtest], ctx, install_signal_handlers=False).results}
    assert set(res) == {0, 1}
    ok = res[0]
    assert ok.status == Status.PASS and ok.metrics["errors"] == 0 and ok.metrics["bytes_tested"] == 24 << 10
    assert ok.metrics["patterns"] == len(P.NAMES) and ok.summary.startswith("no memory errors in 24.0 KiB tested")
    assert any("device 'Fake GPU': tested 24.0 KiB in 3 chunk(s)" in x for x in ok.evidence)
    assert ("kernels: blocks per SM from the occupancy API: check 8, fill 8, scrub 8 (one wave on 2 SMs); L2 4.0 KiB, "
            "scrub buffer 8.0 KiB") in ok.evidence
    bad = res[1]
    assert bad.status == Status.FAIL and bad.action == Action.DRAIN
    assert bad.injected == ["bitflip:gpu=1,offset=12000,bit=5"]
    assert bad.metrics["first_error_offset"] == 12000 and bad.metrics["flipped_bits"] == {"5": 1}
    assert "memory errors: 1 in 24.0 KiB tested" in bad.summary and "offset 0x2ee0" in bad.summary
    # each worker read the ECC counters of its own GPU (NVML index, checked against its UUID)
    # before and after its pass; they did not grow
    assert [(r.index, r.uuid, r.reads) for r in ecc_readers.readers] == [(0, "GPU-00000000-fake", 2),
                                                                          (1, "GPU-00000001-fake", 2)]
    assert ok.metrics["ecc_corrected_growth"] == 0 and "ECC counters did not grow" in ok.summary
    assert any(x == "ECC counters (fake NVML) read 2 times: before pass 0, after pass 0" for x in ok.evidence)
    assert fake.live == {}  # every GPU's memory given back
    # the check's default geometry: 512 16-byte units a chunk, 4 per thread of 256: one block for
    # fill and check; the scrub (1 unit per thread, 8 KiB) two; the occupancy API asked with 256
    geometry = {(ln.kernel.rsplit("_", 1)[0] if ln.kernel.startswith(("memtest_fill", "memtest_check"))
                 else ln.kernel, ln.grid, ln.block) for ln in fake.launches}
    assert geometry == {("memtest_fill", (1, 1, 1), (256, 1, 1)), ("memtest_check", (1, 1, 1), (256, 1, 1)),
                        ("memtest_scrub", (2, 1, 1), (256, 1, 1)), ("memtest_flip", (1, 1, 1), (1, 1, 1))}
    assert {b for _, b, _ in fake.occupancy_queries} == {256}


def test_a_kernel_fault_crashes_the_worker_and_fails_its_gpu(monkeypatch, fake, ecc_readers):
    monkeypatch.setattr(pool, "run_workers", _in_process_workers)
    fake.free = (48 << 10) + STEP_BYTES
    fake.fail_next("memtest_check_pair")  # surfaces at the next synchronising call: the poll of the step's end
    ctx = _cuda_ctx()
    ctx.gpus = [0]
    (r,) = run_checks([mt.memtest], ctx, install_signal_handlers=False).results
    assert r.status == Status.FAIL and r.action == Action.RESET_GPU
    assert "pattern-test worker crashed: CUDARuntimeError: cudaErrorIllegalAddress" in r.summary


def test_the_stub_does_not_outlive_its_tests():
    assert not isinstance(sys.modules.get("cupy"), fakecupy.FakeCupyModule)
    assert not any(type(m).__module__ == "fakecupy" for m in cupy_module._modules.values())
