"""eud.memtest and eud.bandwidth on a real GPU (run on the GPU machine):

    python3 -m pytest -m gpu tests/test_eud_gpu.py -s

The CuPy kernels must write every pattern exactly as gpucheck.eud.patterns defines it, count and
record injected errors exactly as the NumPy reference does, and the checks must run end to end
on the live GPUs (an injected bit flip fails GPU 0 with its offset; copy bandwidths are measured
and printed). Deselected by default (pyproject: -m 'not gpu')."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.gpu

np = pytest.importorskip("numpy")

from gpucheck.check import Context, Level  # noqa: E402
from gpucheck.config import Config  # noqa: E402
from gpucheck.eud import bandwidth as bw  # noqa: E402
from gpucheck.eud import memtest as mt  # noqa: E402
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


def test_cupy_fill_writes_every_pattern_as_defined(cupy):
    cfg = MemtestConfig(max_errors=8)
    be = CupyBackend.create(_chan(), cfg)
    n, base, seed = (64 << 20) // 8 + 3, (1 << 33) + 11, 0xABCDEF
    buf = be.alloc(n)
    for kind in range(8):
        be.fill(buf, base, kind, seed, 0)
        assert np.array_equal(buf.get(), P.word_values(kind, seed, base, n)), kind
    be.fill(buf, base, P.KIND_RANDOM, seed, P.MASK64)
    assert np.array_equal(buf.get(), ~P.word_values(P.KIND_RANDOM, seed, base, n))


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
