"""The CUDA kernels of gpucheck/kernels/memtest.cu on the CPU (tests/cudaemu.py) against the NumPy
reference (gpucheck.eud.patterns), through the same launch-argument builders the GPU backend uses
(gpucheck.eud.memtest_cupy), and what NVRTC makes of them for sm_80 and sm_90: 16-byte accesses,
no 64-bit shared-memory atomics (they compile to compare-and-swap loops), one kernel pair per
pattern family. Every detector is shown to fire: injected flips come back at the right word with
the right expected and actual values and bits, a chunk full of errors is counted exactly."""

from __future__ import annotations

import ctypes
import os
import re

import pytest

np = pytest.importorskip("numpy")

import cudaemu  # noqa: E402
import fakecupy  # noqa: E402
import nvrtc  # noqa: E402
from gpucheck.eud import memtest_cupy as mc  # noqa: E402
from gpucheck.eud import patterns as P  # noqa: E402
from gpucheck.eud.memtest_worker import MemtestConfig, NumpyBackend, run_memtest  # noqa: E402
from gpucheck.kernels import source  # noqa: E402
from gpucheck.kernels.cupy_module import OPTIONS  # noqa: E402
from gpucheck.workers.pool import LocalChannel  # noqa: E402

_CTYPES = {"gc_u64": ctypes.c_uint64, "gc_u32": ctypes.c_uint32, "int": ctypes.c_int32}
FAMILIES = ("pair", "walk", "address", "random")


@pytest.fixture(scope="module")
def emu():
    """The emulated kernels, one launcher `emu_<kernel>` per entry point of memtest.cu."""
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    params = fakecupy.kernel_params(source("memtest"))
    driver = "".join(
        f'extern "C" void emu_{k}(EMU_LAUNCH_PARAMS, {", ".join(f"{t} {n}" for t, n in ps)}) '
        f'{{ EMU_LAUNCH({k}({", ".join(n for _, n in ps)})); }}\n' for k, ps in params.items())
    lib = cudaemu.build("memtest", driver)
    for k, ps in params.items():
        getattr(lib, f"emu_{k}").argtypes = [ctypes.c_uint] * 6 + [
            ctypes.c_void_p if t.endswith("*") else _CTYPES[t] for t, _ in ps]
    return lib


def _launch(lib, kernel, args, grid=3, block=32):
    vals = [cudaemu.ptr(a) if isinstance(a, np.ndarray) else int(a) for a in args]
    getattr(lib, f"emu_{kernel}")(grid, 1, 1, block, 1, 1, *vals)


def fill(lib, buf, base, kind, seed, xw=0, **geometry):
    kp = P.kernel_pattern(kind, seed)
    _launch(lib, f"memtest_fill_{kp.family}", mc.fill_args(np, buf, buf.size // 2, base, kp, xw), **geometry)


def check(lib, buf, base, kind, seed, stats, errs, max_errs, xe=0, write=False, xw=0, desc=False, **geometry):
    kp = P.kernel_pattern(kind, seed)
    _launch(lib, f"memtest_check_{kp.family}",
            mc.check_args(np, buf, buf.size // 2, base, kp, xe, write, xw, desc, stats, errs, max_errs), **geometry)


def _step():
    return P.new_stats(), np.zeros(3 * 8, np.uint64)


# -- the kernels' shape ------------------------------------------------------------------------------
def test_one_fill_and_one_check_kernel_per_pattern_family_over_16_byte_units():
    params = fakecupy.kernel_params(source("memtest"))
    assert set(params) == {f"memtest_{op}_{f}" for op in ("fill", "check") for f in FAMILIES} | {
        "memtest_scrub", "memtest_flip"} == set(mc.KERNELS)
    for f in FAMILIES:
        assert [t for t, _ in params[f"memtest_fill_{f}"]] == ["mt_u128*", "gc_u32", "gc_u64", "gc_u64", "gc_u64",
                                                                "gc_u64"]
        assert [t for t, _ in params[f"memtest_check_{f}"]] == [
            "mt_u128*", "gc_u32", "gc_u64", "gc_u64", "gc_u64", "gc_u64", "int", "gc_u64", "int", "gc_u64*", "gc_u64*",
            "gc_u32"]
    # every pattern maps to one of the families, and the backend's argument builders have the
    # kernels' exact C types (fakecupy.check_args refuses what CuPy would pass otherwise)
    assert {P.kernel_pattern(k, 1).family for k in range(8)} == set(FAMILIES)
    buf = type("Buf", (), {"data": type("D", (), {"ptr": 64})()})()  # an array as CuPy passes it: its data.ptr
    for kind in range(8):
        kp = P.kernel_pattern(kind, (1 << 64) - 1)
        fakecupy.check_args("fill", params[f"memtest_fill_{kp.family}"],
                            mc.fill_args(np, buf, (1 << 30), (1 << 40) + 2, kp, P.MASK64))
        fakecupy.check_args("check", params[f"memtest_check_{kp.family}"],
                            mc.check_args(np, buf, 7, 2, kp, P.MASK64, True, 0, True, buf, buf, 32))
    fakecupy.check_args("scrub", params["memtest_scrub"], mc.scrub_args(np, buf, 5))
    fakecupy.check_args("flip", params["memtest_flip"], mc.flip_args(np, buf, (1 << 38) + 1, 1 << 63))


def _require_nvrtc() -> None:
    if nvrtc.find_library() is None:
        if os.environ.get("GPUCHECK_REQUIRE_NVRTC"):
            pytest.fail("GPUCHECK_REQUIRE_NVRTC is set but libnvrtc was not found (pip install nvidia-cuda-nvrtc)")
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")


def _bodies(ptx: str) -> dict[str, str]:
    """PTX text of each .entry / .func, by name."""
    out = {}
    for m in re.finditer(r"\.(?:visible\s+)?(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", ptx):
        end = ptx.find("\n}", m.end())
        out[m.group(1)] = ptx[m.end():end]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_code_moves_16_bytes_and_has_no_64_bit_shared_atomics(arch):
    """What the GPU runs: the sweeps load and store 16 bytes at a time (ld/st.global.v2.u64) and
    never 8, and no 64-bit atomic touches shared memory (atom.shared.*.64 is a compare-and-swap
    loop on the GPU: a chunk full of errors would serialise on it and stall past the heartbeat)."""
    _require_nvrtc()
    ptx = nvrtc.compile_ptx(source("memtest"), "memtest", arch, OPTIONS)
    assert not re.findall(r"atom\.shared\.[\w.]*(?:64|cas)", ptx)
    bodies = _bodies(ptx)
    for f in FAMILIES:
        chk, fl = bodies[f"memtest_check_{f}"], bodies[f"memtest_fill_{f}"]
        assert "ld.global.v2.u64" in chk and "st.global.v2.u64" in chk and "st.global.v2.u64" in fl, f
        assert not re.search(r"ld\.global\.u64|st\.global\.u64", chk + fl), f  # no 8-byte accesses in a sweep
    assert "ld.global.v2.u64" in bodies["memtest_scrub"]


# -- fill, check, scrub against the reference ---------------------------------------------------------
@pytest.mark.slow
def test_kernels_fill_every_pattern_as_defined(emu):
    n, seed = 3000, 0xC0FFEE
    for base in (123456, (1 << 33) + 6):  # region words past 2^32: the values use 64-bit word indices
        for kind in range(8):
            buf = np.zeros(n, np.uint64)
            fill(emu, buf, base, kind, seed)
            assert np.array_equal(buf, P.word_values(kind, seed, base, n)), (base, kind)
            fill(emu, buf, base, kind, seed, xw=P.MASK64)
            assert np.array_equal(buf, ~P.word_values(kind, seed, base, n)), (base, kind)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("kind", range(8))
def test_kernel_verify_matches_the_numpy_reference_on_injected_errors(emu, kind, descending):
    """Flips 0->1 and 1->0, single and multi-bit, in both words of a 16-byte unit, at both ends and
    in the middle: counts, bit histograms, span and records equal the NumPy path's, bit for bit."""
    n, base, seed, max_errs = 4096, 1 << 20, 77, 8
    buf = P.word_values(kind, seed, base, n).copy()
    rng = np.random.default_rng(kind)
    idx = np.array([0, n - 1, 1000, 1001, 2222], np.int64)
    masks = np.array([1 << 0, 1 << 63, (1 << 5) | (1 << 6), int(rng.integers(1, 1 << 62)), P.MASK64], np.uint64)
    buf[idx] ^= masks
    stats, errs = P.new_stats(), np.zeros(3 * max_errs, np.uint64)
    check(emu, buf, base, kind, seed, stats, errs, max_errs, desc=descending)
    ref_s, ref_e = P.new_stats(), np.zeros(3 * max_errs, np.uint64)
    exp = P.word_values(kind, seed, base, n)
    P.accumulate_errors(ref_s, ref_e, max_errs, (idx + base).astype(np.uint64), exp[idx], buf[idx])
    for k in (P.STATS_COUNT, P.STATS_OR, P.STATS_MIN, P.STATS_MAX):
        assert int(stats[k]) == int(ref_s[k]), k
    assert np.array_equal(stats[P.STATS_UP:], ref_s[P.STATS_UP:])
    got, want = P.decode_step(stats, errs, max_errs), P.decode_step(ref_s, ref_e, max_errs)
    assert got["records"] == want["records"] and len(got["records"]) == 5
    assert got["records"][0] == {"word": base, "offset": 8 * base, "expected": int(exp[0]),
                                 "actual": int(exp[0]) ^ 1, "bits": [0]}


def test_a_chunk_full_of_errors_is_counted_exactly(emu):
    """Every bit of every word wrong: the 32-bit block totals add up to the exact count and
    histogram, the records stop at max_errs, the span is the whole chunk."""
    n, base, seed, max_errs = 8192, 4096, 3, 4
    buf = ~P.word_values(P.KIND_RANDOM, seed, base, n)
    exp = P.word_values(P.KIND_RANDOM, seed, base, n)
    stats, errs = P.new_stats(), np.zeros(3 * max_errs, np.uint64)
    check(emu, buf, base, P.KIND_RANDOM, seed, stats, errs, max_errs, grid=4, block=64)
    d = P.decode_step(stats, errs, max_errs)
    ones = [int(((exp >> np.uint64(b)) & np.uint64(1)).sum()) for b in range(64)]
    assert d["errors"] == n and d["or_bits"] == P.MASK64
    assert d["down"] == ones and d["up"] == [n - c for c in ones]  # each bit: 1->0 where it was 1, else 0->1
    assert d["first_word"] == base and d["last_word"] == base + n - 1
    assert len(d["records"]) == max_errs and int(stats[P.STATS_SLOTS]) >= max_errs
    assert all(r["actual"] == P.MASK64 ^ r["expected"] for r in d["records"])


def test_write_back_steps_write_the_inverse_in_both_directions(emu):
    """Moving inversions (ascending, then descending) and the address complement: each verify
    writes the pattern XOR xwrite back over every word, and finds nothing while doing it."""
    n, seed = 1500, 5
    for kind, steps in ((P.KIND_RANDOM, ((0, P.MASK64, False), (P.MASK64, 0, True))),
                        (P.KIND_ADDRESS, ((0, P.MASK64, False),))):
        buf = np.zeros(n, np.uint64)
        fill(emu, buf, 0, kind, seed)
        pat = P.word_values(kind, seed, 0, n)
        for xe, xw, desc in steps:
            stats, errs = _step()
            check(emu, buf, 0, kind, seed, stats, errs, 8, xe=xe, write=True, xw=xw, desc=desc)
            assert int(stats[P.STATS_COUNT]) == 0
            assert np.array_equal(buf, pat ^ np.uint64(xw))
    _launch(emu, "memtest_flip", mc.flip_args(np, buf, 77, 1 << 9), grid=1, block=1)
    assert int(buf[77]) == int(~pat[77]) ^ (1 << 9)


def test_a_chunk_off_its_16_byte_alignment_faults_as_on_the_gpu(emu):
    """The kernels move 16-byte units (mt_u128, alignas(16): ld/st.global.v2.u64): a chunk 8 bytes
    off a 16-byte boundary is a "misaligned address" fault on the GPU, and in the emulation, whose
    typed-access check names the unit's type, for the fill's stores and the check's and scrub's
    loads alike."""
    raw = np.zeros(2 * 256 + 2, np.uint64)
    start = 1 if raw.ctypes.data % 16 == 0 else 0
    buf = raw[start:start + 512]
    assert buf.ctypes.data % 16 == 8
    access = r"misaligned address 0x[0-9a-f]+ for type '(const )?struct mt_u128', which requires 16-byte alignment"
    with pytest.raises(cudaemu.KernelFault, match=r"memtest_fill_pair: store to " + access):
        fill(emu, buf, 0, 0, 1)
    stats, errs = _step()
    with pytest.raises(cudaemu.KernelFault, match=r"memtest_check_pair: (load of|reference binding to) " + access):
        check(emu, buf, 0, 0, 1, stats, errs, 8)
    with pytest.raises(cudaemu.KernelFault, match=r"memtest_scrub: (load of|reference binding to) " + access):
        _launch(emu, "memtest_scrub", mc.scrub_args(np, buf, buf.size // 2), grid=2, block=32)


def test_the_scrub_reads_and_rewrites_every_word(emu):
    buf = np.arange(2048, dtype=np.uint64)
    _launch(emu, "memtest_scrub", mc.scrub_args(np, buf, buf.size // 2), grid=2, block=32)
    assert np.array_equal(buf, ~np.arange(2048, dtype=np.uint64))


# -- the whole loop on the emulated kernels ------------------------------------------------------------
class EmuBackend(NumpyBackend):
    """run_memtest's backend with the .cu kernels executed by tests/cudaemu.py (small grids)."""

    name = "emulated"

    def __init__(self, cfg, lib, grid=3, block=32):
        super().__init__(cfg)
        self.lib, self.geometry = lib, {"grid": grid, "block": block}
        self.scrub_buf = np.zeros(512, np.uint64)
        self.scrubs = 0

    def fill(self, buf, base, kind, seed, xor_write):
        fill(self.lib, buf, base, kind, seed, xor_write, **self.geometry)

    def check(self, buf, base, kind, seed, xor_expect, write, xor_write, descending):
        check(self.lib, buf, base, kind, seed, self.stats, self.errs, self.cfg.max_errors, xe=xor_expect,
              write=write, xw=xor_write, desc=descending, **self.geometry)

    def scrub(self):
        _launch(self.lib, "memtest_scrub", mc.scrub_args(np, self.scrub_buf, self.scrub_buf.size // 2), **self.geometry)
        self.scrubs += 1

    def flip(self, buf, index, mask):
        _launch(self.lib, "memtest_flip", mc.flip_args(np, buf, index, mask), grid=1, block=1)


@pytest.mark.parametrize("pattern", P.NAMES)
def test_the_whole_loop_on_emulated_kernels_agrees_with_the_numpy_path(emu, pattern):
    """run_memtest on the .cu kernels: the flip comes back at the same offset, with the same
    words and bits, as in the NumPy path; moving inversions' descending sweep and its L2 scrubs,
    and the address complement, included."""
    outs, backends = [], []
    for make in (lambda c: NumpyBackend(c), lambda c: EmuBackend(c, emu)):
        cfg = MemtestConfig(cpu_bytes=24 << 10, cpu_chunk_bytes=8 << 10, copy_bytes=8 << 10, copy_repeats=2,
                            patterns=[pattern], inject={"offset": 8 * 1500 + 16, "bit": 62})
        backends.append(make(cfg))
        outs.append(run_memtest(backends[-1], cfg, LocalChannel()))
    (a, b) = outs
    assert b["backend"] == "emulated" and b["memory"]["chunk_count"] == 3
    for key in ("errors", "first_offset", "up", "down", "bits", "confirmations"):
        assert a["errors"][key] == b["errors"][key], key
    keys = ("offset", "expected", "actual", "bits", "chunk", "step")
    strip = [{k: r[k] for k in keys} for r in b["errors"]["records"]]
    assert strip == [{k: r[k] for k in keys} for r in a["errors"]["records"]]
    assert b["errors"]["errors"] == 1 and strip[0]["offset"] == 8 * 1500 + 16 and strip[0]["chunk"] == 1
    want = P.word_value(P.BY_NAME[pattern].kind, P.pattern_seed(pattern, 0, 0), 1502)
    assert (strip[0]["expected"], strip[0]["actual"], strip[0]["bits"]) == (want, want ^ (1 << 62), [62])
    # two scrubs per moving-inversions run (before the descending sweep and the last verify), in
    # the run and its confirmation run; none for the other patterns
    assert backends[1].scrubs == (4 if pattern == "moving-inversions" else 0)
