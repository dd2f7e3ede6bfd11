"""eud.memtest and eud.bandwidth on a real GPU (run on the GPU machine):

    python3 -m pytest -m gpu tests/test_eud_gpu.py -s

The CuPy kernels must write every pattern exactly as gpucheck.eud.patterns defines it, count and
record injected errors exactly as the NumPy reference does, and the checks must run end to end
on the live GPUs (an injected bit flip fails GPU 0 with its offset; copy bandwidths are measured
and printed). The tests marked gpu are deselected by default (pyproject: -m 'not gpu').

Unmarked, so in the CPU suite: the kernel launch arguments the CuPy backend builds, checked against
the parameter lists in gpucheck/kernels/memtest.cu (CuPy passes a Python int as 8 bytes, a NumPy
scalar as its own type: an `int` parameter needs np.int32, a gc_u64 np.uint64), and the grids
against CUDA's limits."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

needs_gpu = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]

np = pytest.importorskip("numpy")

from gpucheck.check import Context, Level  # noqa: E402
from gpucheck.config import Config  # noqa: E402
from gpucheck.eud import bandwidth as bw  # noqa: E402
from gpucheck.eud import copybw  # noqa: E402
from gpucheck.eud import memtest as mt  # noqa: E402
from gpucheck.eud import memtest_worker as mw  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.eud.memtest_worker import CupyBackend, MemtestConfig, run_memtest  # noqa: E402
from gpucheck.inject import parse_injection  # noqa: E402
from gpucheck.result import Status  # noqa: E402
from gpucheck.runner import run_checks  # noqa: E402
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
    from gpucheck.telemetry.snapshot import collect_snapshot

    snap = collect_snapshot(timeout_s=60)
    if not snap["gpus"]:
        pytest.skip("NVML sees no GPU")
    return snap


def _chan():
    return LocalChannel(WorkerJob("gpu0", gpu=0, device="cuda"))


# -- the launch arguments against memtest.cu (CPU) ---------------------------------------------------
def _kernel_params() -> dict[str, list[str]]:
    """Kernel name -> the C types of its parameters ("ptr" for a pointer), from memtest.cu."""
    text = (ROOT / "gpucheck" / "kernels" / "memtest.cu").read_text()
    out = {}
    for m in re.finditer(r'extern "C" __global__ void (\w+)\(([^)]*)\)', text):
        out[m.group(1)] = ["ptr" if "*" in p else p.split()[0] for p in m.group(2).split(",")]
    return out


class _Buf:  # stands in for a cupy.ndarray (a pointer argument)
    pass


def test_launch_arguments_have_the_kernel_parameters_c_types():
    params = _kernel_params()
    assert set(params) == {"memtest_fill", "memtest_check", "memtest_flip"}
    numpy_for = {"gc_u64": np.uint64, "int": np.int32}
    buf, stats, errs = _Buf(), _Buf(), _Buf()
    big = (1 << 64) - 1
    built = {
        "memtest_fill": mw.fill_args(np, buf, (1 << 40) + 3, (1 << 37) + 5, 7, big, big),
        "memtest_check": mw.check_args(np, buf, (1 << 40) + 3, 11, 6, big, big, True, P.MASK64, True, stats, errs, 32),
        "memtest_flip": mw.flip_args(np, buf, (1 << 38) + 1, 1 << 63),
    }
    for kernel, args in built.items():
        assert len(args) == len(params[kernel]), kernel
        for ctype, a in zip(params[kernel], args):
            if ctype == "ptr":
                assert isinstance(a, _Buf), (kernel, ctype, a)
            else:  # exactly the parameter's type: CuPy passes a NumPy scalar as its own C type
                assert type(a) is numpy_for[ctype], (kernel, ctype, type(a))
    fill, check, flip = built["memtest_fill"], built["memtest_check"], built["memtest_flip"]
    assert [int(x) for x in fill[1:]] == [(1 << 40) + 3, (1 << 37) + 5, 7, big, big]  # 64-bit values intact
    assert check[0] is buf and check[9] is stats and check[10] is errs
    assert [int(check[i]) for i in (5, 6, 7, 8, 11)] == [big, 1, P.MASK64, 1, 32]
    assert int(mw.check_args(np, buf, 8, 0, 0, -1, 0, False, 0, False, stats, errs, 1)[4]) == big  # masked to 64 bits
    assert [int(x) for x in flip[1:]] == [(1 << 38) + 1, 1 << 63]


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
    # enough blocks to cover the words once, capped at SMs x blocks_per_sm and gridDim.x's limit
    assert mw.launch_grid(0, 1, 256, 132, 8) == (1, 1, 1)
    assert mw.launch_grid(1000, 4, 256, 132, 8) == (1, 1, 1)
    assert mw.launch_grid(256 * 4 * 10, 4, 256, 132, 8) == (10, 1, 1)
    assert mw.launch_grid(140 << 30, 1, 256, 132, 8) == (132 * 8, 1, 1)
    assert mw.launch_grid(1 << 62, 1, 1, 1 << 30, 1 << 10) == ((1 << 31) - 1, 1, 1)
    for bad in ({"block": 0}, {"block": 2048}, {"blocks_per_sm": 0}):
        with pytest.raises(ValueError):
            MemtestConfig.from_args(bad)


# -- the GPU ------------------------------------------------------------------------------------


@needs_gpu
def test_cupy_fill_writes_every_pattern_as_defined(cupy):
    cfg = MemtestConfig(max_errors=8)
    be = CupyBackend.create(_chan(), cfg)
    n, base, seed = (64 << 20) // 8 + 3, (1 << 33) + 11, 0xABCDEF
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
    out = run_memtest(CupyBackend.create(_chan(), cfg), cfg, _chan())
    e = out["errors"]
    assert e["errors"] == 1 and e["first_offset"] == (700 << 20) + 8 * 12345 and e["bits"] == [33]
    rec = e["records"][0]
    assert rec["actual"] == rec["expected"] ^ (1 << 33) and rec["pattern"] == "random" and rec["chunk"] == 1
    ratio = out["gbps"] / out["copy"]["gbps"]
    print(f"\n{out['device']['name']}: {P.human_bytes(out['region_bytes'])} tested, memtest {out['gbps']:.0f} GB/s "
          f"(written + read), D2D copy {out['copy']['gbps']:.0f} GB/s (read + written), ratio {ratio:.2f}")
    for name, v in out["per_pattern"].items():
        print(f"  {name:18s} {v['gbps']:8.0f} GB/s")
    assert ratio > 0.3  # the kernels run at memory speed (goal >= 0.8: benchmarks/bench_memtest.py)


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
