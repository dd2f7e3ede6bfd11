"""ldmatrix and the shared-memory traffic of POET's tensor-core kernel, on the CPU.

(1) The emulator's ldmatrix (tests/cudaemu.h, "---- ldmatrix ----"; the prelude's gc_ldmatrix_x4 and
    gc_ldmatrix_x4_trans) against a NumPy model written from the PTX ISA's description of
    ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16, and against the mma.m16n8k16 fragment
    tables it feeds; a misaligned row address is a fault of the launch (KernelFault).
(2) Bank conflicts: every shared-memory access of poet_bd_mma (stripe stores, G chunk stores,
    ldmatrix rows, index reads), recorded lane by lane from the kernel's own index functions
    (poet_mma_geometry, poet_mma_tile_slot, poet_mma_lane_rows) by an emulated test kernel, then
    counted in wavefronts with a model of the banks: one wavefront per phase, for every b that is a
    multiple of 32 up to 256, both layouts of G.
(3) poet_bd_mma for b = 160 and 224 (the block sizes whose last pass leaves two warps idle) within
    the tensor-core bound of the float64 reference.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict

import numpy as np
import pytest

import cudaemu
from gpucheck import kernels

THREADS = 128  # POET_MMA_THREADS

# ---- (1) ldmatrix --------------------------------------------------------------------------------
LDSM_KERNEL = r"""
// Warp w loads from its own 512 16-bit values; lane l supplies row address sh[w] + rows[tid].
struct alignas(16) ldsm_buf {
    gc_u16 v[2][512];
};
extern "C" __global__ void ldsm(const int* rows, const gc_u16* data, gc_u32* out, int num, int trans) {
    __shared__ ldsm_buf buf;
    gc_u16 (&sh)[2][512] = buf.v;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = lane; i < 512; i += 32) sh[warp][i] = data[warp * 512 + i];
    __syncwarp();
    const gc_u16* row = &sh[warp][0] + rows[threadIdx.x];
    gc_u32 r[4] = {0u, 0u, 0u, 0u};
    if (num == 4) {
        if (trans) gc_ldmatrix_x4_trans(r, row); else gc_ldmatrix_x4(r, row);
    } else {
        emu_ldmatrix((unsigned)num, trans != 0, r, row);
    }
    for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = r[i];
}
"""
LDSM_LAUNCHER = r"""
extern "C" void emu_ldsm(EMU_LAUNCH_PARAMS, const int* rows, const gc_u16* data, gc_u32* out, int num, int trans) {
    EMU_LAUNCH(ldsm(rows, data, out, num, trans));
}
"""


@pytest.fixture(scope="module")
def ldsm_lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    lib = cudaemu.build_text("ldsm", kernels.PRELUDE_FOR_TESTS() + LDSM_KERNEL, LDSM_LAUNCHER)
    lib.emu_ldsm.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2
    return lib


def ldmatrix_model(mem: np.ndarray, rows: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """[lane][i] as the PTX ISA describes ldmatrix .m8n8 .b16: lanes 8i .. 8i + 7 hold the addresses of
    rows 0 .. 7 of matrix i (8 consecutive elements each); lane l, with g = l // 4 and t = l % 4,
    receives elements (g, 2t) and (g, 2t + 1) of matrix i in register i, the first in the low half;
    with .trans the elements (2t, g) and (2t + 1, g)."""
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(num):
            mat = [mem[rows[8 * i + q]:rows[8 * i + q] + 8] for q in range(8)]
            lo, hi = (mat[2 * t][g], mat[2 * t + 1][g]) if trans else (mat[g][2 * t], mat[g][2 * t + 1])
            out[lane, i] = int(lo) | (int(hi) << 16)
    return out


def _run_ldsm(lib, rows: np.ndarray, data: np.ndarray, num: int, trans: bool) -> np.ndarray:
    out = np.zeros(64 * 4, np.uint32)
    lib.emu_ldsm(1, 1, 1, 64, 1, 1, cudaemu.ptr(rows), cudaemu.ptr(data), cudaemu.ptr(out), num, int(trans))
    return out.reshape(64, 4)


@pytest.mark.slow
@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_delivers_the_isa_layout(ldsm_lib, num, trans):
    """Two warps, each with its own data; the rows are 16-byte slots in a shuffled order (not
    the obvious one), and the lanes beyond 8 num supply misaligned addresses, which ldmatrix
    ignores. Registers beyond num stay untouched (0)."""
    rng = np.random.default_rng(10 * num + trans)
    data = rng.integers(0, 1 << 16, 2 * 512, dtype=np.uint16)
    rows = np.empty(64, np.int32)
    for w in range(2):
        rows[32 * w:32 * w + 32] = 8 * rng.permutation(64)[:32]
        rows[32 * w + 8 * num:32 * w + 32] = 3  # an unaligned address in every lane whose address is unused
    got = _run_ldsm(ldsm_lib, rows, data, num, trans)
    for w in range(2):
        want = ldmatrix_model(data[512 * w:512 * (w + 1)], rows[32 * w:32 * w + 32], num, trans)
        assert np.array_equal(got[32 * w:32 * w + 32], want), (w, num, trans)
    assert len({tuple(r) for r in got[:32, :num]}) == 32  # every lane got its own elements


def _mma_a(lane, i):
    """(row, col) of element a_i of the mma.m16n8k16 A fragment (PTX ISA table, .row)."""
    g, t = lane // 4, lane % 4
    return g + (8 if i in (2, 3, 6, 7) else 0), 2 * t + (i & 1) + (8 if i >= 4 else 0)


def _mma_b(lane, i):
    """(k, n) of element b_i of the B fragment (16 x 8, .col)."""
    g, t = lane // 4, lane % 4
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4_rows_as_poet_addresses_them_are_the_mma_fragments(ldsm_lib, trans):
    """Lane l addressing row l % 8 of matrix l / 8 with matrices (rows 0-7, cols 0-7), (8-15, 0-7),
    (0-7, 8-15), (8-15, 8-15) of a row-major 16 x 16 A (stride 24, padded) gives a[0..3] of the
    mma A fragment; with .trans, matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
    (k 8-15, n 8-15) of a k-major B (16 x 16, stride 24) give b[0], b[1] of n-tiles 0 and 1."""
    stride = 24
    rng = np.random.default_rng(5 + trans)
    data = rng.integers(0, 1 << 16, 2 * 512, dtype=np.uint16)
    lanes = np.arange(32)
    lr, lm = lanes % 8, lanes // 8
    rows = np.tile(((lr + 8 * (lm & 1)) * stride + 8 * (lm >> 1)).astype(np.int32), 2)
    got = _run_ldsm(ldsm_lib, rows, data, 4, trans)
    M = data[:16 * stride].reshape(16, stride)  # warp 0's region as the 16 x 16 matrix (+ padding)
    for lane in range(32):
        for j in range(4):
            if trans:  # B(k, n) = M[k][n]; register j: n-tile j // 2, fragment register j % 2
                (k0, n0), (k1, n1) = _mma_b(lane, 2 * (j % 2)), _mma_b(lane, 2 * (j % 2) + 1)
                lo, hi = M[k0, n0 + 8 * (j // 2)], M[k1, n1 + 8 * (j // 2)]
            else:
                lo, hi = M[_mma_a(lane, 2 * j)], M[_mma_a(lane, 2 * j + 1)]
            assert got[lane, j] == int(lo) | (int(hi) << 16), (lane, j)


def test_a_misaligned_ldmatrix_row_is_refused_not_emulated(ldsm_lib):
    """The ISA requires 16-byte aligned rows: a lane whose address is used and is 8 bytes off is a
    fault of the launch (KernelFault, naming the access and the address), never a load."""
    rows = (8 * np.arange(64) % 512).astype(np.int32)
    rows[3] = 28
    data, out = np.zeros(1024, np.uint16), np.zeros(256, np.uint32)
    for trans in (0, 1):
        with pytest.raises(cudaemu.KernelFault, match=r"ldmatrix(\.trans)?: a row address at address 0x[0-9a-f]+, "
                                                       r"which is not a multiple of 16"):
            ldsm_lib.emu_ldsm(1, 1, 1, 64, 1, 1, rows.ctypes.data, data.ctypes.data, out.ctypes.data, 4, trans)


# ---- (2) bank conflicts ------------------------------------------------------------------------
def wavefronts(addrs: list[int | None], width: int) -> int:
    """Shared-memory wavefronts of one warp-wide access (the model): 32 banks of 4-byte words;
    the lanes are served in phases, all 32 together for accesses of up to 4 bytes, 16 for 8-byte
    and 8 for 16-byte accesses (an ldmatrix phase is one 8 x 8 matrix: its 8 rows of 16 bytes); a
    phase takes as many wavefronts as the most distinct words one bank is asked for (lanes asking
    for the same word share it). None: a lane without an access."""
    per_phase = {16: 8, 8: 16}.get(width, 32)
    total = 0
    for p0 in range(0, 32, per_phase):
        words: dict[int, set[int]] = defaultdict(set)
        for a in addrs[p0:p0 + per_phase]:
            if a is not None:
                for w in range(a // 4, (a + width - 1) // 4 + 1):
                    words[w % 32].add(w)
        total += max((len(s) for s in words.values()), default=0)
    return total


def _phases(addrs: list[int | None], width: int) -> int:
    per_phase = {16: 8, 8: 16}.get(width, 32)
    return sum(any(a is not None for a in addrs[p0:p0 + per_phase]) for p0 in range(0, 32, per_phase))


def test_the_bank_model_sees_conflicts():
    """The model on patterns with known answers, and on the index math of the kernel before
    ldmatrix: its non-transposed G staging (`gs[8v + 2i][kk] = ...` from a 16-byte load of
    G[k0 + kk][c0 + 8v ..], kk = e / 4, v = e % 4, rows of 64 + 8 elements) stored 16-bit values
    4 ways conflicted; its A fragment loads (32-bit, rows of 256 + 8) were conflict-free."""
    assert wavefronts([4 * lane for lane in range(32)], 4) == 1
    assert wavefronts([128 * lane for lane in range(32)], 4) == 32
    assert wavefronts([0] * 32, 4) == 1  # one word for everyone: a broadcast
    assert wavefronts([16 * lane for lane in range(32)], 16) == 4  # 512 contiguous bytes: 4 phases of 1
    assert wavefronts([128 * (lane % 8) for lane in range(32)], 16) == 32  # 8 rows in the same banks
    old_g_store = [2 * ((8 * (lane % 4) + 2 * 0) * 72 + lane // 4) for lane in range(32)]
    assert wavefronts(old_g_store, 2) == 4
    old_a_load = [2 * ((lane // 4) * 264 + 2 * (lane % 4)) for lane in range(32)]
    assert wavefronts(old_a_load, 4) == 1


BANK_KERNEL = r"""
// For every shared-memory access of poet_bd_mma (one sub-tile; the next ones repeat it), in the
// kernel's order, a slot: per thread its byte offset in poet_mma_smem and its width in bytes (0: no
// access by this thread in that slot). The slots are the same in every thread (uniform loops, as
// the kernel's are); the offsets come from the kernel's own index functions.
extern "C" __global__ void bank_slots(int b, int transpose, int* out, int max_slots, int* n_slots) {
    __shared__ poet_mma_smem sm;
    const poet_mma_geom q = poet_mma_geometry(b, transpose);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int slot = 0;
    auto put = [&](const void* p, int bytes) {
        if (slot < max_slots) {
            out[2 * (slot * POET_MMA_THREADS + tid)] = (int)((const char*)p - (const char*)&sm);
            out[2 * (slot * POET_MMA_THREADS + tid) + 1] = bytes;
        }
        ++slot;
    };
    auto tiles16 = [&](gc_u16* dst, int dst_rs, int rows, int units) {  // poet_mma_copy_tiles' stores
        const int tiles = (rows / 8) * (units / 4);
        for (int t0 = 0; t0 < tiles; t0 += POET_MMA_VEC * POET_MMA_WARPS)
            for (int i = 0; i < POET_MMA_VEC; ++i) {
                const int tile = t0 + warp + i * POET_MMA_WARPS;
                int r, u;
                poet_mma_tile_slot(tile, rows, r, u);
                put(dst + r * dst_rs + 8 * u, tile < tiles ? 16 : 0);
            }
    };
    tiles16(sm.xs, q.xs_rs, q.st, b / 8);  // the stripe, 16-byte copies
    const int pair_tiles = (q.st / 8) * (b / 8);  // the stripe, column pairs (poet_mma_gather_pairs)
    for (int t0 = 0; t0 < pair_tiles; t0 += POET_MMA_BATCH * POET_MMA_WARPS) {
        for (int i = 0; i < POET_MMA_BATCH; ++i) {
            int r, p;
            poet_mma_tile_slot(t0 + warp + i * POET_MMA_WARPS, q.st, r, p);
            put(&sm.in_s[2 * p], 4);
            put(&sm.in_s[2 * p + 1], 4);
        }
        for (int i = 0; i < POET_MMA_BATCH; ++i) {
            int r, p;
            poet_mma_tile_slot(t0 + warp + i * POET_MMA_WARPS, q.st, r, p);
            put(&sm.xs[r * q.xs_rs + 2 * p], 4);
        }
    }
    const poet_mma_rows lr = poet_mma_lane_rows(q, lane);
    for (int c0 = 0; c0 < b; c0 += q.pw) {
        const int pwv = b - c0 < q.pw ? b - c0 : q.pw;
        const bool active = q.wc < pwv;
        for (int k0 = 0; k0 < b; k0 += q.kcm) {
            const int kc = b - k0 < q.kcm ? b - k0 : q.kcm;
            tiles16(sm.gs, q.gs_rs, q.kmajor ? kc : pwv, (q.kmajor ? pwv : kc) / 8);  // the G chunk
            for (int ks = 0; ks < kc; ks += 16) {  // ldmatrix rows: A, then B of tiles 0-1 and 2-3
                const gc_u16* bp = sm.gs + lr.b + (ks / 16) * lr.b_k16;
                put(sm.xs + lr.a + k0 + ks, active ? 16 : 0);
                put(bp, active ? 16 : 0);
                put(bp + lr.b_n16, active ? 16 : 0);
            }
        }
        const int g = lane / 4, t = lane % 4;
        for (int nt = 0; nt < 4; ++nt)  // the scatter's index reads
            for (int h = 0; h < 2; ++h) {
                const int lc = c0 + q.wc + nt * 8 + 2 * t;
                put(&sm.out_s[lc], active ? 4 : 0);
                put(&sm.out_s[lc + 1], active ? 4 : 0);
            }
    }
    if (tid == 0) *n_slots = slot;
}
"""
BANK_LAUNCHER = r"""
extern "C" void emu_bank_slots(EMU_LAUNCH_PARAMS, int b, int transpose, int* out, int max_slots, int* n_slots) {
    EMU_LAUNCH(bank_slots(b, transpose, out, max_slots, n_slots));
}
"""
MAX_SLOTS = 4096


@pytest.fixture(scope="module")
def bank_lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    lib = cudaemu.build_text("poet_banks", kernels.source("poet") + BANK_KERNEL, BANK_LAUNCHER)
    lib.emu_bank_slots.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_int] * 2 + [ctypes.c_void_p, ctypes.c_int,
                                                                               ctypes.c_void_p]
    return lib


@pytest.mark.slow
@pytest.mark.parametrize("transpose", [0, 1])
@pytest.mark.parametrize("b", [32, 64, 96, 128, 160, 192, 224, 256])
def test_every_shared_access_of_the_tensor_core_kernel_is_conflict_free(bank_lib, b, transpose):
    out = np.zeros(MAX_SLOTS * THREADS * 2, np.int32)
    n = np.zeros(1, np.int32)
    bank_lib.emu_bank_slots(1, 1, 1, THREADS, 1, 1, b, transpose, cudaemu.ptr(out), MAX_SLOTS, cudaemu.ptr(n))
    slots = int(n[0])
    assert 0 < slots <= MAX_SLOTS
    rec = out.reshape(MAX_SLOTS, THREADS, 2)[:slots]
    accesses = ldsm_phases = 0
    for s in range(slots):
        for w in range(THREADS // 32):
            lanes = rec[s, 32 * w:32 * w + 32]
            widths = {int(x) for x in lanes[:, 1] if x}
            if not widths:
                continue
            assert len(widths) == 1, (s, w, widths)
            width = widths.pop()
            addrs = [int(o) if wd else None for o, wd in lanes]
            assert all(a % width == 0 for a in addrs if a is not None), (s, w)  # aligned to its size
            assert wavefronts(addrs, width) == _phases(addrs, width), (b, transpose, s, w, addrs)
            accesses += 1
            ldsm_phases += width == 16
    assert accesses > 0 and ldsm_phases > 0


# ---- (3) the block sizes with an idle warp in the last pass ---------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("b", [160, 224])
def test_the_tensor_core_kernel_with_a_partial_last_pass(b):
    """b = 160 and 224 run in sub-tiles of 32 rows and passes of 64 columns: the last pass has 32
    columns, and two of the four warps sit it out (ldmatrix and mma only in warps with columns).
    Within the tensor-core bound of the float64 reference, gather and scatter, both layouts of G."""
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    torch = pytest.importorskip("torch")
    import poet_emu
    from gpucheck.poet.bounds import STORE_ROUNDOFF, unit_acc_coeff, unit_floor
    from gpucheck.poet.ortho import bd_torch

    torch.set_num_threads(1)
    ops = poet_emu.EmuOps(poet_emu.build())
    g = torch.Generator().manual_seed(b)
    m, u = 40, STORE_ROUNDOFF["bf16"]
    X = torch.randn(m, b, generator=g).to(torch.bfloat16)
    G = (torch.eye(b) + 0.2 * torch.randn(1, b, b, generator=g) / b**0.5).to(torch.bfloat16)
    perm = torch.randperm(b, generator=g)
    for kw in (dict(in_idx=perm), dict(transpose=True, out_idx=torch.argsort(perm))):
        Y = ops.bd(X, G, **kw)
        assert ops.calls[-1] == ("poet_bd_mma_bf16", (1, 1, 1))
        ref = bd_torch(torch, X.double(), G.double(), acc=torch.float64, **kw)
        absr = bd_torch(torch, X.double().abs(), G.double().abs(), acc=torch.float64, **kw)
        bound = u * ref.abs() + (1 + u) * unit_acc_coeff("tensor", b) * absr + unit_floor("tensor", "bf16", b)
        assert bool(((Y.double() - ref).abs() <= bound).all()), kw.keys()
        assert bool((Y.double() != 0).all())  # every column written, the idle warps' included
