"""eud.memtest and eud.bandwidth on a real GPU (run on the GPU machine):

    python3 -m pytest -m gpu tests/test_eud_gpu.py -s

The CuPy kernels must write every pattern exactly as gpucheck.eud.patterns defines it, count and
record injected errors exactly as the NumPy reference does, and the checks must run end to end
on the live GPUs (an injected bit flip fails GPU 0 with its offset; copy bandwidths are measured
and printed). The tests marked gpu are deselected by default (pyproject: -m 'not gpu').

Unmarked, so in the CPU suite: the stats layout against memtest.cu, and the grids against CUDA's
limits (the launch arguments against the kernels' parameter lists: tests/test_eud_memtest_kernels.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

needs_gpu = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]

np = pytest.importorskip("numpy")

from gpucheck.core.check import Context
from gpucheck.core.levels import Level  # noqa: E402
from gpucheck.core.config import Config  # noqa: E402
from gpucheck.tests_suite import eud_bandwidth as bw  # noqa: E402
from gpucheck.eud import copybw  # noqa: E402
from gpucheck.tests_suite import eud_memtest as mt  # noqa: E402
from gpucheck.eud import memtest_cupy  # noqa: E402
from gpucheck.eud import memtest_worker as mw  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.eud.memtest_worker import CupyBackend, MemtestConfig, run_memtest  # noqa: E402
from gpucheck.core.inject import parse_injection  # noqa: E402
from gpucheck.core.result import Status  # noqa: E402
from gpucheck.core.runner import run_checks  # noqa: E402
from gpucheck.workers.pool import LocalChannel, WorkerJob  # noqa: E402


@pytest.fixture(scope="module")
def cupy():
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy not installed")
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device")
    return cupy


@pytest.fixture(scope="module")
def snapshot():
    from gpucheck.platform.telemetry.snapshot import collect_snapshot

    snap = collect_snapshot(timeout_s=60)
    if not snap["gpus"]:
        pytest.skip("NVML sees no GPU")
    return snap


def _chan():
    return LocalChannel(WorkerJob("gpu0", gpu=0, device="cuda"))


# -- the kernels' layout and grids (CPU) ---------------------------------------------------------------
# (the launch arguments against memtest.cu's parameter lists: tests/test_eud_memtest_kernels.py)


def test_stats_layout_is_memtest_cu_s():
    """The stats vector copied back from the device is decoded with patterns.STATS_*: the same
    indices as memtest.cu's MT_* (and the buffer is STATS_WORDS uint64 long)."""
    text = (ROOT / "gpucheck" / "kernels" / "memtest.cu").read_text()
    mt_defs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define MT_(\w+) (\d+)$", text, re.M)}
    assert {k: mt_defs[k] for k in ("COUNT", "SLOTS", "OR", "MIN", "MAX", "UP", "DOWN", "STATS_WORDS")} == {
        "COUNT": P.STATS_COUNT, "SLOTS": P.STATS_SLOTS, "OR": P.STATS_OR, "MIN": P.STATS_MIN, "MAX": P.STATS_MAX,
        "UP": P.STATS_UP, "DOWN": P.STATS_DOWN, "STATS_WORDS": P.STATS_WORDS}
    assert P.STATS_DOWN == P.STATS_UP + 64 and P.STATS_WORDS == P.STATS_DOWN + 64
    assert P.new_stats().dtype == np.uint64 and P.new_stats().size == P.STATS_WORDS


def test_launch_grids_stay_within_cuda_limits():
    # enough blocks to cover the units once, never more than one wave (SMs x blocks an SM holds,
    # capped by blocks_per_sm), within gridDim.x's limit and the kernels' 2^28-thread bound
    assert memtest_cupy.launch_grid(0, 4, 256, 132, 4, 32) == (1, 1, 1)
    assert memtest_cupy.launch_grid(1000, 4, 256, 132, 4, 32) == (1, 1, 1)
    assert memtest_cupy.launch_grid(256 * 4 * 10, 4, 256, 132, 4, 32) == (10, 1, 1)
    assert memtest_cupy.launch_grid(70 << 30, 4, 256, 132, 4, 32) == (132 * 4, 1, 1)  # one wave of 4 blocks per SM
    assert memtest_cupy.launch_grid(70 << 30, 4, 256, 132, 8, 2) == (132 * 2, 1, 1)  # the cap
    assert memtest_cupy.launch_grid(1 << 62, 1, 1, 1 << 30, 1 << 10, 1 << 10) == ((1 << 28), 1, 1)
    for bad in ({"block": 0}, {"block": 2048}, {"blocks_per_sm": 0}, {"chunk_bytes": (16 << 30) + 16}):
        with pytest.raises(ValueError):
            MemtestConfig.from_args(bad)


# -- the GPU ------------------------------------------------------------------------------------


@needs_gpu
def test_cupy_fill_writes_every_pattern_as_defined(cupy):
    cfg = MemtestConfig(max_errors=8)
    be = CupyBackend.create(_chan(), cfg)
    n, base, seed = (64 << 20) // 8 + 4, (1 << 33) + 10, 0xABCDEF
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    buf = be.alloc(n)
    assert pool.used_bytes() == used  # plain cudaMalloc, not CuPy's pool
    for kind in range(8):
        be.fill(buf, base, kind, seed, 0)
        assert np.array_equal(buf.get(), P.word_values(kind, seed, base, n)), kind
    be.fill(buf, base, P.KIND_RANDOM, seed, P.MASK64)
    assert np.array_equal(buf.get(), ~P.word_values(P.KIND_RANDOM, seed, base, n))


@needs_gpu
def test_cupy_out_of_memory_is_a_memory_error_and_memory_is_given_back(cupy):
    be = CupyBackend.create(_chan(), MemtestConfig())
    free0, total = cupy.cuda.runtime.memGetInfo()
    with pytest.raises(MemoryError):  # cudaMalloc's cudaErrorMemoryAllocation, as _allocate expects it
        be.alloc(2 * total // 8)
    buf = be.alloc((256 << 20) // 8)
    assert cupy.cuda.runtime.memGetInfo()[0] <= free0 - (256 << 20)
    del buf
    assert cupy.cuda.runtime.memGetInfo()[0] >= free0 - (16 << 20)  # freed at once (no pool keeps it)
    # the whole test gives back what it took
    cfg = MemtestConfig(fraction=0.02, chunk_bytes=256 << 20, copy_bytes=64 << 20, patterns=["zeros"])
    free1 = cupy.cuda.runtime.memGetInfo()[0]
    out = run_memtest(CupyBackend.create(_chan(), cfg), cfg, _chan())
    assert out["region_bytes"] > 0 and out["errors"]["errors"] == 0
    assert cupy.cuda.runtime.memGetInfo()[0] >= free1 - (16 << 20)


@needs_gpu
@pytest.mark.parametrize("descending", [0, 1])
def test_cupy_verify_matches_the_numpy_reference(cupy, descending):
    cfg = MemtestConfig(max_errors=16)
    be = CupyBackend.create(_chan(), cfg)
    n, base, seed = (32 << 20) // 8, 4096, 5
    for kind in range(8):
        host = P.word_values(kind, seed, base, n).copy()
        idx = np.array([0, 1, n // 2, n // 2 + 1, n - 1], np.int64)
        host[idx] ^= np.array([1, 1 << 63, 0xFF00, P.MASK64, 1 << 31], np.uint64)
        buf = be.alloc(n)
        buf.set(host)
        be.new_step()
        be.check(buf, base, kind, seed, 0, False, 0, bool(descending))
        stats, errs = be.read_step()
        ref_s, ref_e = P.new_stats(), np.zeros(3 * 16, np.uint64)
        exp = P.word_values(kind, seed, base, n)
        P.accumulate_errors(ref_s, ref_e, 16, (idx + base).astype(np.uint64), exp[idx], host[idx])
        for k in (P.STATS_COUNT, P.STATS_OR, P.STATS_MIN, P.STATS_MAX):
            assert int(stats[k]) == int(ref_s[k]), (kind, k)
        assert np.array_equal(stats[P.STATS_UP:], ref_s[P.STATS_UP:]), kind
        assert P.decode_step(stats, errs, 16)["records"] == P.decode_step(ref_s, ref_e, 16)["records"]


@needs_gpu
def test_run_memtest_on_the_gpu_finds_an_injected_flip_and_reports_bandwidth(cupy):
    cfg = MemtestConfig(fraction=0.05, chunk_bytes=512 << 20, copy_bytes=256 << 20,
                        inject={"offset": (700 << 20) + 8 * 12345, "bit": 33, "pattern": "random"})
    ecc = mw.ecc_monitor(_chan(), cfg)  # NVML's counters of GPU 0, read around the pass
    out = run_memtest(CupyBackend.create(_chan(), cfg), cfg, _chan(), ecc=ecc)
    ecc.close()
    e = out["errors"]
    assert e["errors"] == 1 and e["first_offset"] == (700 << 20) + 8 * 12345 and e["bits"] == [33]
    rec = e["records"][0]
    assert rec["actual"] == rec["expected"] ^ (1 << 33) and rec["pattern"] == "random" and rec["chunk"] == 1
    ratio = out["gbps"] / out["copy"]["gbps"]
    print(f"\n{out['device']['name']}: {P.human_bytes(out['region_bytes'])} tested, memtest {out['gbps']:.0f} GB/s "
          f"(written + read), D2D copy {out['copy']['gbps']:.0f} GB/s (read + written), ratio {ratio:.2f}")
    for name, v in out["per_pattern"].items():
        print(f"  {name:18s} {v['gbps']:8.0f} GB/s")
    assert ratio > 0.3  # the kernels run at memory speed (goal >= 0.9: benchmarks/bench_memtest.py)
    dev = out["device"]
    print(f"  L2 {dev['l2_bytes']} B, scrub {dev['scrub_bytes']} B, blocks per SM {dev['blocks_per_sm']}")
    assert all(v >= 1 for v in dev["blocks_per_sm"].values()) and dev["scrub_bytes"] >= 2 * (dev["l2_bytes"] or 0)
    assert [r["label"] for r in out["ecc"]["reads"]] == ["before pass 0", "after pass 0"], out["ecc"]


@needs_gpu
def test_a_chunk_full_of_errors_does_not_stall_the_check_kernel(cupy):
    """Every bit of every word of 1 GiB wrong: the verify step finishes in well under the stall
    timeout (a bound that catches a hang, not a timing goal) and counts every error."""
    import time

    cfg = MemtestConfig(max_errors=32)
    be = CupyBackend.create(_chan(), cfg)
    n = (1 << 30) // 8
    buf = be.alloc(n)
    be.fill(buf, 0, P.KIND_ONES, 0, 0)
    be.new_step()
    t0 = be.timer()
    be.check(buf, 0, P.KIND_ZEROS, 0, 0, False, 0, False)
    t = time.monotonic()
    secs = be.elapsed(t0)
    wall = time.monotonic() - t
    stats, errs = be.read_step()
    d = P.decode_step(stats, errs, 32)
    print(f"\n1 GiB, every bit wrong: verify took {secs * 1e3:.1f} ms on the GPU")
    assert d["errors"] == n and d["up"] == [0] * 64 and d["down"] == [n] * 64 and wall < cfg.stall_timeout_s


@needs_gpu
def test_memtest_check_on_live_gpus(cupy, snapshot):
    ctx = Context(level=Level.STANDARD, device="cuda", snapshot=snapshot,
                  config=Config(checks={"eud.memtest": {"fraction_level2": 0.05}}),
                  injections=[parse_injection("bitflip:gpu=0,offset=4096,bit=5")])
    res = {r.gpu: r for r in run_checks([mt.memtest], ctx, install_signal_handlers=False).results}
    r0 = res[0]
    assert r0.status == Status.FAIL and r0.metrics["first_error_offset"] == 4096 and r0.metrics["errors"] == 1
    print("\n" + r0.summary)
    for g, r in res.items():
        if g != 0:
            assert r.status == Status.PASS, r.summary
        print(f"gpu{g}: {r.metrics.get('bandwidth_gbps')} GB/s memtest, {r.metrics.get('copy_gbps')} GB/s copy")


@needs_gpu
def test_bandwidth_check_on_live_gpus(snapshot):
    pytest.importorskip("torch")
    ctx = Context(level=Level.STANDARD, device="cuda", snapshot=snapshot)
    res = {r.gpu: r for r in run_checks([bw.bandwidth], ctx, install_signal_handlers=False).results}
    for g, r in sorted(res.items()):
        print(f"\ngpu{g} {r.status.value}: {r.summary}")
        for e in r.evidence:
            print("   ", e)
        assert r.status in (Status.PASS, Status.WARN), r.summary
        assert r.metrics["h2d_gbps"] > 1.0 and r.metrics["d2h_gbps"] > 1.0 and r.metrics["d2d_gbps"] > 100.0
    # slowed to a tenth, GPU 0 falls below its SKU floor (or its peers)
    ctx = Context(level=Level.STANDARD, device="cuda", snapshot=snapshot,
                  injections=[parse_injection("slow:gpu=0,factor=0.1")])
    res = {r.gpu: r for r in run_checks([bw.bandwidth], ctx, install_signal_handlers=False).results}
    from gpucheck.data.bandwidth import lookup

    if lookup(snapshot["gpus"][0].get("name")) is not None or len(res) > 1:
        assert res[0].status == Status.FAIL, res[0].summary


@needs_gpu
def test_copy_measurement_pins_host_memory_and_reads_the_link_under_load(snapshot):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    e = snapshot["gpus"][0]
    g = {"gpu": e["index"], "uuid": e.get("uuid"), "bus_id": e.get("pci_bus_id"), "name": e.get("name")}
    args = {"gpus": [g], "h2d_bytes": 64 << 20, "d2d_bytes": 256 << 20, "repeats": 5, "warmup": 1, "p2p": False}
    out = copybw.measure(torch, "cuda", args, LocalChannel(WorkerJob("node", device="cuda")))
    rec = out["gpus"][e["index"]]
    print(f"\n{rec}")
    assert not rec.get("error"), rec.get("error")
    assert rec["numa"]["pinned"] == "cudaHostRegister"  # the NUMA-placed buffer, not the fallback
    for k in ("h2d", "d2h", "d2d"):
        assert rec[k]["gbps"] > 1.0 and rec[k]["repeats"] == 5
    link = rec["link_under_load"]
    assert isinstance(link.get("gen"), int) and isinstance(link.get("width"), int), link


@needs_gpu
def test_a_failed_cudart_call_does_not_poison_the_next_kernel():
    """cudaHostRegister through torch's bindings leaves CUDA's last error set when it fails; after
    _clear_cuda_error torch's next kernel launch check must not report it as its own."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    assert int(torch.cuda.cudart().cudaHostRegister(0, 4096, 1)) != 0  # a null pointer: refused
    copybw._clear_cuda_error()
    assert float((torch.ones(8, device="cuda") * 2).sum()) == 16.0
