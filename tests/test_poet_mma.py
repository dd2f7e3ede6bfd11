"""The tensor-core path of POET on the CPU: the emulator's warp-collective operations (tests/cudaemu.h)
against NumPy models written from the CUDA and PTX documentation, the mma.sync m16n8k16 fragment
layouts against the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16 with floating point
type"), and poet.cu's poet_bd_mma kernel against the float64 reference and against the CUDA-core
kernel, for every block size, bf16 and fp16, every gather/scatter/transpose mode. NVRTC compiles
the same text for sm_80 and sm_90 (ptxas included: the inline PTX is assembled), and ptxas's
resource report bounds the kernel's registers, spills and shared memory."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

import cudaemu
import nvrtc
import ptxas
from gpucheck import kernels
from gpucheck.poet.bounds import STORE_ROUNDOFF, TC_ROUNDOFF, mma_acc_coeff, unit_acc_coeff, unit_floor

torch = pytest.importorskip("torch")

import poet_emu  # noqa: E402
from gpucheck.poet import cupy_ops  # noqa: E402
from gpucheck.poet.cupy_ops import block_of, bd_plan  # noqa: E402
from gpucheck.poet.ortho import bd_torch  # noqa: E402

CPU = torch.device("cpu")
F64 = torch.float64
FULL = 0xFFFFFFFF

# ---- test kernels on the prelude: warp collectives and one mma per warp ------------------------
WARP_KERNELS = r"""
extern "C" __global__ void warp_ops(const int* src, const unsigned* delta, const int* xmask, const int* pred,
                                    int* out, double* out64, unsigned* vote, int width) {
    __shared__ int sh[256];
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int v = tid * 7 + 3;
    out[tid * 5 + 0] = __shfl_sync(0xffffffffu, v, src[tid], width);
    out[tid * 5 + 1] = __shfl_up_sync(0xffffffffu, v, delta[tid], width);
    out[tid * 5 + 2] = __shfl_down_sync(0xffffffffu, v, delta[tid], width);
    out[tid * 5 + 3] = __shfl_xor_sync(0xffffffffu, v, xmask[tid], width);
    sh[threadIdx.x] = v;
    __syncwarp();
    out[tid * 5 + 4] = sh[threadIdx.x ^ 1];
    out64[tid] = __shfl_sync(0xffffffffu, (double)v * 0.5 + 1e10, src[tid], width);
    vote[tid * 3 + 0] = __ballot_sync(0xffffffffu, pred[tid]);
    vote[tid * 3 + 1] = (unsigned)__any_sync(0xffffffffu, pred[tid]);
    vote[tid * 3 + 2] = (unsigned)__all_sync(0xffffffffu, pred[tid]);
}
// Each warp w: d = A_w . B_w + c_w from fragments laid out by the caller ([warp][lane][register]).
extern "C" __global__ void mma_frag(const gc_u32* a, const gc_u32* b, const float* c, float* d, int f16, int inplace) {
    const int base = blockIdx.x * blockDim.x + threadIdx.x;  // warp * 32 + lane
    gc_u32 ar[4], br[2];
    float cr[4], dr[4];
    for (int i = 0; i < 4; ++i) { ar[i] = a[base * 4 + i]; cr[i] = c[base * 4 + i]; }
    for (int i = 0; i < 2; ++i) br[i] = b[base * 2 + i];
    if (inplace) {  // d and c the same registers, as an accumulating kernel calls it
        if (f16) gc_mma_16816_f16(cr, ar, br, cr); else gc_mma_16816_bf16(cr, ar, br, cr);
        for (int i = 0; i < 4; ++i) dr[i] = cr[i];
    } else {
        if (f16) gc_mma_16816_f16(dr, ar, br, cr); else gc_mma_16816_bf16(dr, ar, br, cr);
    }
    for (int i = 0; i < 4; ++i) d[base * 4 + i] = dr[i];
}
extern "C" __global__ void half_mask(int* out) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 0);
}
"""

WARP_LAUNCHERS = r"""
extern "C" void emu_warp_ops(EMU_LAUNCH_PARAMS, const int* src, const unsigned* delta, const int* xmask,
                             const int* pred, int* out, double* out64, unsigned* vote, int width) {
    EMU_LAUNCH(warp_ops(src, delta, xmask, pred, out, out64, vote, width));
}
extern "C" void emu_mma_frag(EMU_LAUNCH_PARAMS, const gc_u32* a, const gc_u32* b, const float* c, float* d, int f16,
                             int inplace) {
    EMU_LAUNCH(mma_frag(a, b, c, d, f16, inplace));
}
extern "C" void emu_half_mask(EMU_LAUNCH_PARAMS, int* out) { EMU_LAUNCH(half_mask(out)); }
"""


@pytest.fixture(scope="module")
def warp_lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    lib = cudaemu.build_text("warp", kernels.PRELUDE_FOR_TESTS() + WARP_KERNELS, WARP_LAUNCHERS)
    lib.emu_warp_ops.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p] * 7 + [ctypes.c_int]
    lib.emu_mma_frag.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2
    return lib


# ---- NumPy models, from the documentation ---------------------------------------------------------
def shfl_model(values, src, delta, xmask, width):
    """__shfl*_sync as the CUDA C++ Programming Guide describes them, warp by warp."""
    out = np.empty((len(values), 4), np.int64)
    for tid in range(len(values)):
        lane, warp0 = tid % 32, tid - tid % 32
        seg = lane // width * width
        idx = seg + src[tid] % width  # srcLane outside [0, width): modulo width, in its own segment
        up = lane - delta[tid] if lane - seg >= delta[tid] else lane  # the lower delta lanes unchanged
        down = lane + delta[tid] if lane - seg + delta[tid] < width else lane
        x = lane ^ xmask[tid]
        xor = x if x // width <= lane // width else lane  # later groups: the caller's own value
        out[tid] = [values[warp0 + j] for j in (idx, up, down, xor)]
    return out


def a_elem(lane, i):
    """(row, col) of element a_i (i = 0..7) of `lane` in the A fragment (16 x 16, .row), PTX ISA."""
    g, t = lane // 4, lane % 4
    row = g if i in (0, 1, 4, 5) else g + 8
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_elem(lane, i):
    """(row, col) of element b_i (i = 0..3) in the B fragment (16 x 8, .col)."""
    g, t = lane // 4, lane % 4
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def c_elem(lane, i):
    """(row, col) of element c_i / d_i (i = 0..3) in the C and D fragments (16 x 8, fp32)."""
    g, t = lane // 4, lane % 4
    return g + (8 if i >= 2 else 0), t * 2 + (i & 1)


def pack(bits16, coords, lanes, nregs):
    """[lane][register] 32-bit words: register j holds elements 2j (low half) and 2j + 1."""
    out = np.zeros((lanes, nregs), np.uint32)
    for lane in range(lanes):
        for j in range(nregs):
            lo = int(bits16[coords(lane, 2 * j)])
            hi = int(bits16[coords(lane, 2 * j + 1)])
            out[lane, j] = lo | (hi << 16)
    return out


def mma_model(A, B, C):
    """The emulator's arithmetic model: c + the 16 exact products summed in k order in binary64,
    truncated (rounded toward zero) to fp32 once."""
    s = C.astype(np.float64)
    for k in range(16):
        s = s + A[:, k:k + 1].astype(np.float64) * B[k:k + 1, :].astype(np.float64)
    f = s.astype(np.float32)
    away = np.isfinite(f) & (np.abs(f.astype(np.float64)) > np.abs(s))
    f[away] = np.nextafter(f[away], np.float32(0))
    return f


def _bits16(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


# ---- the emulator's warp collectives -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("width", [32, 16, 8, 4, 2, 1])
def test_shuffles_votes_and_syncwarp_follow_the_documented_semantics(warp_lib, width):
    rng = np.random.default_rng(width)
    nt = 128  # 2 blocks of 64 threads: 4 warps
    src = rng.integers(0, 64, nt).astype(np.int32)  # beyond width and beyond 32: taken modulo width
    delta = rng.integers(0, width + 1, nt).astype(np.uint32)
    xmask = rng.integers(0, 32, nt).astype(np.int32)
    pred = (rng.random(nt) < 0.5).astype(np.int32)
    pred[64:96] = 1  # warp 2: every lane true (all); warp 3 random
    pred[32:64] = 0  # warp 1: none (any false)
    out = np.zeros(nt * 5, np.int32)
    out64 = np.zeros(nt, np.float64)
    vote = np.zeros(nt * 3, np.uint32)
    warp_lib.emu_warp_ops(2, 1, 1, 64, 1, 1, *(cudaemu.ptr(a) for a in (src, delta, xmask, pred, out, out64, vote)),
                          width)
    values = np.arange(nt) * 7 + 3
    want = shfl_model(values, src, delta, xmask, width)
    got = out.reshape(nt, 5)
    assert np.array_equal(got[:, :4], want)
    assert np.array_equal(got[:, 4], values[np.arange(nt) ^ 1])  # through shared memory after __syncwarp
    assert np.array_equal(out64, want[:, 0] * 0.5 + 1e10)  # 64 bits moved as one value
    v = vote.reshape(nt, 3)
    for w in range(4):
        lanes = pred[w * 32:(w + 1) * 32]
        ballot = sum(int(p) << i for i, p in enumerate(lanes))
        assert (v[w * 32:(w + 1) * 32] == [ballot, int(lanes.any()), int(lanes.all())]).all()


def test_a_partial_mask_is_refused_not_emulated(warp_lib):
    """Only full-warp collectives are emulated: a kernel passing another mask is a fault of the
    launch, with the reason (cudaemu.KernelFault when the launcher returns)."""
    out = np.zeros(32, np.int32)
    warp_lib.emu_half_mask.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p]
    with pytest.raises(cudaemu.KernelFault, match=r"__shfl_sync with mask 0xffff in a warp of 32 lanes: only "
                                                  r"full-warp masks are emulated"):
        warp_lib.emu_half_mask(1, 1, 1, 32, 1, 1, out.ctypes.data)


# ---- mma.sync m16n8k16: the PTX fragment layouts -------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("inplace", [0, 1])
def test_mma_fragments_are_laid_out_as_the_ptx_isa_documents(warp_lib, dtype, inplace):
    """Four warps (two blocks of two), each with its own A, B, C; fragments packed by the NumPy
    model of the PTX tables; D read back through the C/D table. Exact against the emulator's
    documented arithmetic model, and within the tensor-core bound of float64 A.B + C."""
    st = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(7 + inplace)
    warps = 4
    A = [torch.randn(16, 16, generator=g).to(st) for _ in range(warps)]
    B = [torch.randn(16, 8, generator=g).to(st) for _ in range(warps)]
    C = [torch.randn(16, 8, generator=g) for _ in range(warps)]
    a = np.concatenate([pack(_bits16(x), lambda ln, i: a_elem(ln, i), 32, 4) for x in A])
    b = np.concatenate([pack(_bits16(x), lambda ln, i: b_elem(ln, i), 32, 2) for x in B])
    c = np.concatenate([np.array([[x.numpy()[c_elem(ln, i)] for i in range(4)] for ln in range(32)], np.float32)
                        for x in C])
    d = np.zeros_like(c)
    warp_lib.emu_mma_frag(2, 1, 1, 64, 1, 1, cudaemu.ptr(a), cudaemu.ptr(b), cudaemu.ptr(c), cudaemu.ptr(d),
                          int(dtype == "fp16"), inplace)
    for w in range(warps):
        D = np.zeros((16, 8), np.float32)
        for ln in range(32):
            for i in range(4):
                D[c_elem(ln, i)] = d[w * 32 + ln, i]
        An, Bn, Cn = A[w].float().numpy(), B[w].float().numpy(), C[w].numpy()
        assert np.array_equal(D, mma_model(An, Bn, Cn)), w
        exact = An.astype(np.float64) @ Bn.astype(np.float64) + Cn
        absum = np.abs(An).astype(np.float64) @ np.abs(Bn).astype(np.float64) + np.abs(Cn)
        assert (np.abs(D - exact) <= 17 * TC_ROUNDOFF * absum).all()
    # a layout mistake would not be caught if the data were symmetric: it is not
    assert not torch.equal(A[0][:8, :8].float(), A[0][:8, :8].float().t())


def test_the_mma_model_truncates():
    A = np.zeros((16, 16), np.float32)
    B = np.zeros((16, 8), np.float32)
    A[0, 0], B[0, 0] = 1.0, 2.0**-30
    C = np.zeros((16, 8), np.float32)
    C[0, 0] = 1.0
    assert mma_model(A, B, C)[0, 0] == np.float32(1.0)  # 1 + 2^-30 truncates to 1 (RN would too)
    C[0, 0] = -1.0
    B[0, 0] = -(2.0**-25)
    assert mma_model(A, B, C)[0, 0] == np.float32(-1.0)  # toward zero: not -(1 + 2^-23)


# ---- poet_bd_mma against the float64 reference --------------------------------------------------
@pytest.fixture(scope="module")
def poet_lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    torch.set_num_threads(1)
    return poet_emu.build()


def _data(dtype, m, k, b, seed):
    g = torch.Generator().manual_seed(seed)
    st = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    n = k * b
    X = torch.randn(m, n, generator=g).to(st)
    G = (torch.eye(b) + 0.2 * torch.randn(k, b, b, generator=g) / b**0.5).to(st)
    return X, G, torch.randperm(n, generator=g)


def _bounds(dtype, unit, X, G, **kw):
    """(ref, kernel_reference bound of `unit`) of a bd of X and G."""
    b = G.shape[-1]
    u = STORE_ROUNDOFF[dtype]
    ref = bd_torch(torch, X.double(), G.double(), acc=F64, **kw)
    absr = bd_torch(torch, X.double().abs(), G.double().abs(), acc=F64, **kw)
    return ref, u * ref.abs() + (1 + u) * unit_acc_coeff(unit, b) * absr + unit_floor(unit, dtype, b)


MODES = [dict(in_idx=True), dict(transpose=True, out_idx=True), dict(in_idx=True, out_idx=True, transpose=True),
         dict(), dict(x_t=True, y_t=True, out_idx=True)]


def _kw(mode, perm, inv):
    kw = dict(mode)
    if kw.pop("in_idx", False):
        kw["in_idx"] = perm
    if kw.pop("out_idx", False):
        kw["out_idx"] = inv
    return kw


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("b,k,m", [(32, 3, 40), (64, 2, 130), (128, 2, 64), (256, 1, 70), (96, 2, 20)])
def test_the_tensor_core_kernel_matches_the_reference_in_every_mode(poet_lib, dtype, b, k, m):
    """Gather in (scalar loads), no gather (16-byte loads), scatter out, transposed blocks,
    transposed operand and result (x_t: the square merge operand); m not a multiple of the 64-row
    tile; b = 96 (not a power of 2: a partial G chunk). Within the tensor-core kernel_reference
    bound, within the sum of both units' bounds of the CUDA-core kernel, and bitwise the same when
    run again."""
    ops = poet_emu.EmuOps(poet_lib)
    assert ops.units(dtype) == ("tensor", "cuda")
    X, G, perm = _data(dtype, m, k, b, seed=b + m)
    inv = torch.argsort(perm)
    W = torch.randn(k * b, k * b, generator=torch.Generator().manual_seed(b)).to(X.dtype)
    for mode in MODES:
        kw = _kw(mode, perm, inv)
        src = W if kw.get("x_t") else X
        Y = ops.bd(src, G, **kw)
        assert ops.calls[-1] == (f"poet_bd_mma_{cupy_ops.SUFFIX[dtype]}", (k, (src.shape[1 if kw.get('x_t') else 0] + 63) // 64, 1))
        ref, bound = _bounds(dtype, "tensor", src, G, **kw)
        err = (Y.double() - ref).abs()
        assert bool((err <= bound).all()), (mode, float((err / bound).max()))
        Ys = ops.bd(src, G, unit="cuda", **kw)
        assert ops.calls[-1][0] == f"poet_bd_apply_{cupy_ops.SUFFIX[dtype]}"
        _, bound_s = _bounds(dtype, "cuda", src, G, **kw)
        assert bool(((Y.double() - Ys.double()).abs() <= bound + bound_s).all()), mode
        assert torch.equal(ops.bd(src, G, **kw).view(torch.int16), Y.view(torch.int16)), mode


def test_the_tensor_core_kernel_has_its_own_rounding(poet_lib):
    """The two units are different arithmetic: on data where the CUDA-core kernel's fp32 round to
    nearest and the tensor cores' truncation differ, they differ (within the bounds)."""
    ops = poet_emu.EmuOps(poet_lib)
    X, G, perm = _data("bf16", 64, 2, 64, seed=5)
    differ = 0
    for kw in (dict(in_idx=perm), dict(transpose=True)):
        differ += int((ops.bd(X, G, **kw).view(torch.int16) != ops.bd(X, G, unit="cuda", **kw).view(torch.int16))
                      .sum())
    assert differ > 0


def test_misaligned_operands_take_the_scalar_paths(poet_lib):
    """G one element off a 16-byte boundary, X without a gather but with an odd row stride (a
    view is made contiguous by bd, so the plan is driven directly here): the kernel falls back to
    scalar loads and stores and still matches."""
    ops = poet_emu.EmuOps(poet_lib)
    X, G, _ = _data("fp16", 70, 2, 32, seed=9)
    Gbuf = torch.empty(G.numel() + 1, dtype=G.dtype)
    Goff = Gbuf[1:].view(G.shape)
    Goff.copy_(G)
    assert Goff.data_ptr() % 16 and Goff.is_contiguous()
    Y = torch.empty_like(X)
    kernel, grid, args = bd_plan(X, Goff, Y, tensor_cores=True)
    ops._run(kernel, grid, args)
    ref, bound = _bounds("fp16", "tensor", X, G)
    assert bool(((Y.double() - ref).abs() <= bound).all())
    Yt = torch.empty_like(X)
    kernel, grid, args = bd_plan(X, Goff, Yt, tensor_cores=True, transpose=True)
    ops._run(kernel, grid, args)
    ref, bound = _bounds("fp16", "tensor", X, G, transpose=True)
    assert bool(((Yt.double() - ref).abs() <= bound).all())


def test_the_plan_refuses_what_the_tensor_core_kernel_cannot_do():
    X, Y = torch.zeros(4, 64), torch.zeros(4, 64)
    with pytest.raises(ValueError, match="takes bf16 and fp16, not fp32"):
        bd_plan(X, torch.zeros(2, 32, 32), Y, tensor_cores=True)
    Xb = torch.zeros(4, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="blocks of up to 256, not 512"):
        bd_plan(Xb, torch.zeros(1, 512, 512, dtype=torch.bfloat16), torch.zeros(4, 512, dtype=torch.bfloat16),
                tensor_cores=True)
    X2, G2, Y2 = (torch.zeros(s, dtype=torch.bfloat16) for s in ((130, 256), (2, 128, 128), (130, 256)))
    kernel, grid, args = bd_plan(X2, G2, Y2, tensor_cores=True)
    assert kernel == "poet_bd_mma_bf16" and grid == (2, 3, 1) and block_of(kernel) == (128, 1, 1)
    assert [a for a in args if a[0] != "ptr"] == [("i64", 256), ("i64", 1), ("i64", 256), ("i64", 1), ("i32", 130),
                                                  ("i32", 128), ("i32", 2), ("i32", 0)]
    kernel, grid, _ = bd_plan(X2, G2, Y2)  # the CUDA-core kernel: the same arguments, its own grid
    assert kernel == "poet_bd_apply_bf16" and grid == (8, 2, 1) and block_of(kernel) == (256, 1, 1)


def test_the_tensor_core_bound_covers_every_group_size_and_exceeds_round_to_nearest():
    for b in (32, 64, 96, 128, 256):
        for g in (4, 8, 16):
            chained = (1 + (g + 1) * TC_ROUNDOFF) ** -(-b // g) - 1
            assert mma_acc_coeff(b) >= chained
        assert mma_acc_coeff(b) > unit_acc_coeff("cuda", b) > 0
        assert unit_floor("tensor", "bf16", b) > unit_floor("cuda", "bf16", b)
    with pytest.raises(ValueError, match="unknown unit"):
        unit_acc_coeff("npu", 32)


# ---- NVRTC (with ptxas) and the kernel's resources ------------------------------------------------
def _require_nvrtc() -> None:
    if nvrtc.find_library() is None:
        if os.environ.get("GPUCHECK_REQUIRE_NVRTC"):
            pytest.fail("GPUCHECK_REQUIRE_NVRTC is set but libnvrtc was not found (pip install nvidia-cuda-nvrtc)")
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_warp_test_kernels_assemble_for_the_gpu(arch):
    _require_nvrtc()
    ptx = nvrtc.compile_ptx(kernels.PRELUDE_FOR_TESTS() + WARP_KERNELS, "warp", arch, ("--std=c++17",))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "shfl.sync.bfly.b32" in ptx and "vote.sync.ballot.b32" in ptx


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_tensor_core_kernel_fits_its_launch_without_spills(arch):
    """ptxas's report for poet_bd_mma_*: no spills, its static shared memory as planned
    (cupy_ops.mma_shared_bytes, <= 48 KiB), registers that let 128-thread blocks run 4 at a time
    per SM (65536 / (4 * 128) = 128), and mma.sync in the PTX."""
    _require_nvrtc()
    report = ptxas.report(kernels.source("poet"), "poet", arch)
    assert {"poet_bd_mma_bf16", "poet_bd_mma_f16", "poet_bd_apply_bf16"} <= set(report), report
    for kernel in ("poet_bd_mma_bf16", "poet_bd_mma_f16"):
        r = report[kernel]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
        assert r["smem"] == cupy_ops.mma_shared_bytes() <= cupy_ops.MAX_STATIC_SHARED, r
        assert r["registers"] <= 128, r
        assert ptxas.blocks_per_sm(r, cupy_ops.MMA_THREADS) >= 4, r
    ptx = nvrtc.compile_ptx(kernels.source("poet"), "poet", arch, ("--std=c++17",))
    body = ptx[ptx.index(".entry poet_bd_mma_bf16"):]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in body
