"""The kernel infrastructure every CUDA check relies on: the prelude's dtype conversions and RNG
agree with torch / NumPy, the CPU emulation runs blocks with shared memory and barriers the way a
GPU does, and every shipped kernel source compiles with NVRTC for sm_80 and sm_90. And each of the
emulator's strictness guards (tests/cudaemu.h) fires on a tiny kernel that trips it: misaligned
vector and typed accesses fault with their address, shared memory read before it is written holds
the poison, the blocks run in a seeded shuffled order that breaks a kernel counting on grid order,
and fp32 arithmetic flushes subnormals as the GPU does under CuPy while what has no .ftz keeps
them."""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

import cudaemu
import nvrtc
from gpucheck import kernels
from gpucheck.poet.bounds import U32, acc_coeff, stage_floor

torch = pytest.importorskip("torch")

DRIVER = r"""
extern "C" __global__ void conv_kernel(const float* x, gc_u16* bf, gc_u16* hf, float* back_bf, float* back_hf, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        bf[i] = gc_f32_to_bf16(x[i]);
        hf[i] = gc_f32_to_f16(x[i]);
        back_bf[i] = gc_bf16_to_f32(bf[i]);
        back_hf[i] = gc_f16_to_f32(hf[i]);
    }
}
// Block sum through shared memory: wrong without a working __syncthreads.
extern "C" __global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float buf[128];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
extern "C" __global__ void mix(gc_u64 seed, gc_u64* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gc_mix64(seed, (gc_u64)i);
}
"""

LAUNCHERS = r"""
extern "C" void emu_conv(EMU_LAUNCH_PARAMS, const float* x, gc_u16* bf, gc_u16* hf, float* bb, float* bh, int n) {
    EMU_LAUNCH(conv_kernel(x, bf, hf, bb, bh, n));
}
extern "C" void emu_block_sum(EMU_LAUNCH_PARAMS, const float* x, float* out, int n) { EMU_LAUNCH(block_sum(x, out, n)); }
extern "C" void emu_mix(EMU_LAUNCH_PARAMS, gc_u64 seed, gc_u64* out, int n) { EMU_LAUNCH(mix(seed, out, n)); }
"""


@pytest.fixture(scope="module")
def lib():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    lib = cudaemu.build_text("infra", kernels.PRELUDE_FOR_TESTS() + DRIVER, LAUNCHERS)
    lib.emu_mix.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int]
    return lib


def _launch(fn, grid, block, *args):
    fn(*grid, *block, *args)


@pytest.mark.slow
def test_conversions_match_torch(lib):
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(4000).astype(np.float32) * 10.0 ** rng.integers(-6, 6, 4000),
        np.array([0.0, -0.0, 65504.0, 70000.0, 1e-8, -1e-8, np.inf, -np.inf, 3.3895314e38], np.float32),
    ]).astype(np.float32)
    n = x.size
    bf = np.zeros(n, np.uint16); hf = np.zeros(n, np.uint16)
    bb = np.zeros(n, np.float32); bh = np.zeros(n, np.float32)
    _launch(lib.emu_conv, ((n + 255) // 256, 1, 1), (256, 1, 1), cudaemu.ptr(x), cudaemu.ptr(bf),
            cudaemu.ptr(hf), cudaemu.ptr(bb), cudaemu.ptr(bh), n)
    t = torch.from_numpy(x)
    assert np.array_equal(bf, t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(hf, t.to(torch.float16).view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(bb, t.to(torch.bfloat16).float().numpy())
    assert np.array_equal(bh, t.to(torch.float16).float().numpy())


def test_nan_stays_nan(lib):
    x = np.array([np.nan, -np.nan], np.float32)
    bf = np.zeros(2, np.uint16); hf = np.zeros(2, np.uint16)
    bb = np.zeros(2, np.float32); bh = np.zeros(2, np.float32)
    _launch(lib.emu_conv, (1, 1, 1), (32, 1, 1), cudaemu.ptr(x), cudaemu.ptr(bf), cudaemu.ptr(hf),
            cudaemu.ptr(bb), cudaemu.ptr(bh), 2)
    assert np.isnan(bb).all() and np.isnan(bh).all()


def test_shared_memory_and_barriers(lib):
    x = np.arange(1000, dtype=np.float32)
    blocks = (1000 + 127) // 128
    out = np.zeros(blocks, np.float32)
    _launch(lib.emu_block_sum, (blocks, 1, 1), (128, 1, 1), cudaemu.ptr(x), cudaemu.ptr(out), 1000)
    want = [x[i * 128:(i + 1) * 128].sum() for i in range(blocks)]
    assert np.array_equal(out, np.array(want, np.float32))


def test_rng_matches_numpy_and_python(lib):
    n = 777
    out = np.zeros(n, np.uint64)
    seed = 0xDEADBEEF12345
    _launch(lib.emu_mix, (4, 1, 1), (256, 1, 1), seed, cudaemu.ptr(out), n)
    assert np.array_equal(out, kernels.splitmix64(seed, np.arange(n, dtype=np.uint64)))
    assert int(out[5]) == kernels.splitmix64(seed, 5)
    assert len(set(out.tolist())) == n


def _require_nvrtc() -> None:
    if nvrtc.find_library() is None:
        if os.environ.get("GPUCHECK_REQUIRE_NVRTC"):
            pytest.fail("GPUCHECK_REQUIRE_NVRTC is set but libnvrtc was not found (pip install nvidia-cuda-nvrtc)")
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_prelude_and_test_kernels_compile_with_nvrtc(arch):
    _require_nvrtc()
    ptx = nvrtc.compile_ptx(kernels.PRELUDE_FOR_TESTS() + DRIVER, "infra", arch, ("--std=c++17",))
    for k in ("conv_kernel", "block_sum", "mix"):
        assert f".entry {k}" in ptx


@pytest.mark.slow
@pytest.mark.parametrize("name", kernels.names())
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_source_compiles_with_nvrtc(name, arch):
    _require_nvrtc()
    from gpucheck.kernels.cupy_module import OPTIONS

    ptx = nvrtc.compile_ptx(kernels.source(name), name, arch, OPTIONS)
    assert ".entry" in ptx


def test_nvrtc_reports_errors():
    _require_nvrtc()
    with pytest.raises(nvrtc.CompileError, match="undefined"):
        nvrtc.compile_ptx("extern \"C\" __global__ void k() { undefined_thing(); }", "bad", "sm_90")


# ---- the emulator's strictness: each guard fires ---------------------------------------------------
GUARD_KERNELS = r"""
// 16 bytes from src + offset to dst + offset (one thread per 16 bytes), through the vector helpers.
extern "C" __global__ void v16_copy(const gc_u8* src, gc_u8* dst, int offset) {
    const int i = 16 * (blockIdx.x * blockDim.x + threadIdx.x) + offset;
    gc_st_v16(dst + i, gc_ld_v16(src + i));
}
extern "C" __global__ void v16_store(gc_u8* dst, int offset) {
    gc_v16 v = {{1u, 2u, 3u, 4u}};
    gc_st_v16(dst + offset, v);
}
extern "C" __global__ void u32_load(const gc_u8* src, gc_u32* out, int offset) {
    out[threadIdx.x] = gc_ld_u32(src + offset + 4 * threadIdx.x);
}
// A 16-byte struct moved as one (alignas(16), as memtest's mt_u128): plain C++ accesses, checked
// by -fsanitize=alignment.
struct alignas(16) wide { gc_u64 lo, hi; };
extern "C" __global__ void wide_copy(const gc_u8* src, wide* dst, int offset) {
    const wide* p = (const wide*)(src + offset);
    dst[threadIdx.x] = p[threadIdx.x];
}
// Thread `bad` of block 1 loads misaligned while every other thread waits at a barrier and then in
// a warp shuffle: the launch must end with the fault, not hang.
extern "C" __global__ void fault_among_waiters(const gc_u8* src, int* out, int bad) {
    __shared__ int s[64];
    int v = (int)threadIdx.x;
    if (blockIdx.x == 1 && (int)threadIdx.x == bad) v = (int)gc_ld_u32(src + 2);
    s[threadIdx.x] = v;
    __syncthreads();
    v = __shfl_xor_sync(0xffffffffu, s[threadIdx.x ^ 1], 1);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
// Block 0 writes its shared memory before reading it; block 1 reads without writing.
extern "C" __global__ void shared_peek(float* f, gc_u32* u, gc_u16* h) {
    __shared__ float sf[64];
    __shared__ gc_u32 su[64];
    __shared__ __align__(16) gc_u16 sh[64];  // CUDA's alignment spelling, as NVRTC and the emulator take it
    const int t = threadIdx.x;
    if (blockIdx.x == 0) { sf[t] = 1.0f; su[t] = 7u; sh[t] = (gc_u16)0x3c00u; }
    __syncthreads();
    f[blockIdx.x * 64 + t] = sf[t];
    u[blockIdx.x * 64 + t] = su[t];
    h[blockIdx.x * 64 + t] = sh[t];
}
// Which position each block ran at, and a kernel that wrongly counts on grid order: block b reads
// what block b - 1 wrote (a running sum across blocks without a grid-wide synchronisation).
extern "C" __global__ void run_position(int* pos, int* counter) {
    if (threadIdx.x == 0) pos[blockIdx.x] = atomicAdd(counter, 1);
}
extern "C" __global__ void chain(int* x) {
    if (threadIdx.x == 0) x[blockIdx.x + 1] += x[blockIdx.x];
}
// fp32 arithmetic written in C (flushed on the GPU: CuPy's -ftz=true), and what keeps gradual
// underflow: gc_fmaf (fma.rn.f32), the fp16 / bf16 conversions.
extern "C" __global__ void underflow(const float* a, float* out) {
    const float x = a[0], y = a[1], sub = a[2];
    out[0] = x * y;                    // mul.ftz.f32: a subnormal product
    out[1] = __fmaf_rn(x, y, 0.0f);    // fma.rn.ftz.f32
    out[2] = sub + 0.0f;               // add.ftz.f32: a subnormal input
    out[3] = sub * 1.0e30f;            // a subnormal input scaled up to a normal result
    out[4] = gc_fmaf(x, y, 0.0f);      // fma.rn.f32: kept
    out[5] = gc_fmaf(sub, 1.0e30f, 0.0f);
    out[6] = gc_f16_to_f32(gc_f32_to_f16(a[3]));  // an fp16 subnormal, both ways
    out[7] = gc_bf16_to_f32(gc_f32_to_bf16(a[4]));  // a bf16 subnormal, both ways (bit arithmetic)
}
extern "C" __global__ void f16_all(const gc_u16* h, float* f, gc_u16* back, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        f[i] = gc_f16_to_f32(h[i]);
        back[i] = gc_f32_to_f16(f[i]);
    }
}
// One warp's mma with every element of A and B 2^-70 (bf16), C 0: 16 products of 2^-140 sum to
// 2^-136, a subnormal fp32 result the tensor cores keep (mma.sync has no .ftz).
extern "C" __global__ void mma_tiny(float* d) {
    const gc_u32 two_m70 = 0x1c80u | (0x1c80u << 16);  // bf16 2^-70 in both halves
    const gc_u32 a[4] = {two_m70, two_m70, two_m70, two_m70}, b[2] = {two_m70, two_m70};
    const float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float r[4];
    gc_mma_16816_bf16(r, a, b, c);
    for (int i = 0; i < 4; ++i) d[threadIdx.x * 4 + i] = r[i];
}
// A length-n dot product at the bottom of fp32's range, accumulated with __fmaf_rn (flushed on the
// GPU) and with gc_fmaf (not flushed): one thread per pair of rows of a and columns of b.
extern "C" __global__ void dot_pair(const float* a, const float* b, float* c_rn, float* c_ieee, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.0f, t = 0.0f;
    for (int k = 0; k < n; ++k) {
        s = __fmaf_rn(a[i * n + k], b[i * n + k], s);
        t = gc_fmaf(a[i * n + k], b[i * n + k], t);
    }
    c_rn[i] = s;
    c_ieee[i] = t;
}
"""

GUARD_LAUNCHERS = r"""
extern "C" void emu_v16_copy(EMU_LAUNCH_PARAMS, const gc_u8* s, gc_u8* d, int o) { EMU_LAUNCH(v16_copy(s, d, o)); }
extern "C" void emu_v16_store(EMU_LAUNCH_PARAMS, gc_u8* d, int o) { EMU_LAUNCH(v16_store(d, o)); }
extern "C" void emu_u32_load(EMU_LAUNCH_PARAMS, const gc_u8* s, gc_u32* o, int off) { EMU_LAUNCH(u32_load(s, o, off)); }
extern "C" void emu_wide_copy(EMU_LAUNCH_PARAMS, const gc_u8* s, wide* d, int o) { EMU_LAUNCH(wide_copy(s, d, o)); }
extern "C" void emu_fault_among_waiters(EMU_LAUNCH_PARAMS, const gc_u8* s, int* o, int bad) {
    EMU_LAUNCH(fault_among_waiters(s, o, bad));
}
extern "C" void emu_shared_peek(EMU_LAUNCH_PARAMS, float* f, gc_u32* u, gc_u16* h) { EMU_LAUNCH(shared_peek(f, u, h)); }
extern "C" void emu_run_position(EMU_LAUNCH_PARAMS, int* p, int* c) { EMU_LAUNCH(run_position(p, c)); }
extern "C" void emu_chain(EMU_LAUNCH_PARAMS, int* x) { EMU_LAUNCH(chain(x)); }
extern "C" void emu_underflow(EMU_LAUNCH_PARAMS, const float* a, float* o) { EMU_LAUNCH(underflow(a, o)); }
extern "C" void emu_f16_all(EMU_LAUNCH_PARAMS, const gc_u16* h, float* f, gc_u16* b, int n) {
    EMU_LAUNCH(f16_all(h, f, b, n));
}
extern "C" void emu_mma_tiny(EMU_LAUNCH_PARAMS, float* d) { EMU_LAUNCH(mma_tiny(d)); }
extern "C" void emu_dot_pair(EMU_LAUNCH_PARAMS, const float* a, const float* b, float* r, float* e, int n) {
    EMU_LAUNCH(dot_pair(a, b, r, e, n));
}
"""


def _guards(ftz: bool):
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    lib = cudaemu.build_text("guards", kernels.PRELUDE_FOR_TESTS() + GUARD_KERNELS, GUARD_LAUNCHERS, ftz=ftz)
    for name in ("v16_copy", "u32_load", "wide_copy", "fault_among_waiters"):
        getattr(lib, f"emu_{name}").argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.emu_v16_store.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p, ctypes.c_int]
    lib.emu_dot_pair.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p] * 4 + [ctypes.c_int]
    return lib


@pytest.fixture(scope="module")
def guards():
    """The guard kernels as the GPU runs them (flush to zero: gpucheck's options plus CuPy's)."""
    assert cudaemu.gpu_flushes_subnormals()
    return _guards(ftz=True)


@pytest.fixture(scope="module")
def guards_ieee():
    """The same kernels with gradual underflow everywhere: what the emulator computed before it
    modelled the flush."""
    return _guards(ftz=False)


def _aligned(nbytes: int) -> np.ndarray:
    """A 256-byte-aligned byte buffer (as cudaMalloc's)."""
    raw = np.zeros(nbytes + 256, np.uint8)
    off = (-raw.ctypes.data) % 256
    return raw[off:off + nbytes]


@pytest.mark.slow
def test_aligned_vector_accesses_run(guards):
    src = _aligned(1024)
    src[:] = np.arange(1024) % 251
    dst = _aligned(1024)
    guards.emu_v16_copy(2, 1, 1, 32, 1, 1, cudaemu.ptr(src), cudaemu.ptr(dst), 0)
    assert np.array_equal(dst, src)
    out = np.zeros(32, np.uint32)
    guards.emu_u32_load(1, 1, 1, 32, 1, 1, cudaemu.ptr(src), cudaemu.ptr(out), 0)
    assert np.array_equal(out, src[:128].view(np.uint32))
    wide = _aligned(512)
    guards.emu_wide_copy(1, 1, 1, 16, 1, 1, cudaemu.ptr(src), cudaemu.ptr(wide), 16)
    assert np.array_equal(wide[:256], src[16:272])


@pytest.mark.parametrize("offset", [4, 8, 12])
def test_a_misaligned_vector_load_faults_with_its_address(guards, offset):
    """gc_ld_v16 at an address that is not a multiple of 16 (an illegal address on the GPU): the
    launch ends with KernelFault naming the access, the address and the alignment it needs."""
    src, dst = _aligned(1024), _aligned(1024)
    with pytest.raises(cudaemu.KernelFault) as caught:
        guards.emu_v16_copy(1, 1, 1, 1, 1, 1, cudaemu.ptr(src), cudaemu.ptr(dst), offset)
    msg = str(caught.value)
    assert f"gc_ld_v16 (a 16-byte vector load) at address {hex(src.ctypes.data + offset)}" in msg, msg
    assert "which is not a multiple of 16: a misaligned address on the GPU" in msg
    assert msg.startswith("emu_v16_copy: ") and "GPUCHECK_EMU_SEED=" in msg and "thread (" in msg
    # the library goes on working: the fault was taken with the exception
    guards.emu_v16_copy(2, 1, 1, 32, 1, 1, cudaemu.ptr(src), cudaemu.ptr(dst), 0)


def test_misaligned_stores_and_32_bit_loads_fault(guards):
    dst = _aligned(64)
    with pytest.raises(cudaemu.KernelFault, match=r"gc_st_v16 \(a 16-byte vector store\) at address 0x[0-9a-f]+, "
                                                  r"which is not a multiple of 16"):
        guards.emu_v16_store(1, 1, 1, 1, 1, 1, cudaemu.ptr(dst), 8)
    out = np.zeros(32, np.uint32)
    with pytest.raises(cudaemu.KernelFault, match=r"gc_ld_u32 \(a 32-bit load\) at address 0x[0-9a-f]+, "
                                                  r"which is not a multiple of 4"):
        guards.emu_u32_load(1, 1, 1, 32, 1, 1, cudaemu.ptr(_aligned(256)), cudaemu.ptr(out), 2)


def test_a_misaligned_typed_access_faults_with_its_type_and_source_line(guards):
    """A plain C++ access of an alignas(16) struct (memtest's mt_u128 is one) at an address 8 bytes
    off: -fsanitize=alignment's check, reported as a fault with the type and the kernel's line."""
    src, wide = _aligned(512), _aligned(512)
    with pytest.raises(cudaemu.KernelFault) as caught:
        guards.emu_wide_copy(1, 1, 1, 16, 1, 1, cudaemu.ptr(src), cudaemu.ptr(wide), 8)
    msg = str(caught.value)
    assert re.search(r"(load of|reference binding to) misaligned address 0x[0-9a-f]+ for type 'const struct wide', "
                     r"which requires 16-byte alignment: a misaligned address on the GPU", msg), msg
    assert msg.rstrip().endswith("dst[threadIdx.x] = p[threadIdx.x];"), msg


def test_a_fault_ends_the_launch_while_other_threads_wait(guards):
    """Thread 37 of block 1 faults; the block's other 63 threads are at __syncthreads or in a
    shuffle with it: the launch returns (no hang), blocks after it do not run, and the fault names
    that thread."""
    out = np.full(4 * 64, -5, np.int32)
    with pytest.raises(cudaemu.KernelFault, match=r"gc_ld_u32 .* \[block \(1, 0, 0\), thread \(37, 0, 0\)"):
        guards.emu_fault_among_waiters(4, 1, 1, 64, 1, 1, cudaemu.ptr(_aligned(64)), cudaemu.ptr(out), 37)
    assert (out[64:128] == -5).all()  # block 1 stopped before its stores
    guards.emu_fault_among_waiters(4, 1, 1, 64, 1, 1, cudaemu.ptr(_aligned(64)), cudaemu.ptr(out), 99)  # no fault
    assert np.array_equal(out, np.tile(np.arange(64), 4))


@pytest.mark.parametrize("seed", ["grid", "0x5eed"])
def test_shared_memory_read_before_written_holds_the_poison(guards, monkeypatch, seed):
    """Block 1 reads shared memory it never wrote: 0xFF bytes (NaN as fp32 and fp16, the maximum
    as unsigned), not block 0's values (which stayed in the static storage when block 0 ran first,
    as in grid order) nor zeros, whichever block runs first."""
    monkeypatch.setenv(cudaemu.SEED_ENV, seed)
    for _ in range(2):  # and again, once the variables are registered
        f = np.zeros(128, np.float32)
        u = np.zeros(128, np.uint32)
        h = np.zeros(128, np.uint16)
        guards.emu_shared_peek(2, 1, 1, 64, 1, 1, cudaemu.ptr(f), cudaemu.ptr(u), cudaemu.ptr(h))
        assert (f[:64] == 1.0).all() and (u[:64] == 7).all() and (h[:64] == 0x3C00).all()
        assert np.isnan(f[64:]).all() and (f[64:].view(np.uint32) == 0xFFFFFFFF).all()
        assert (u[64:] == 0xFFFFFFFF).all() and (h[64:] == 0xFFFF).all()


def test_every_shared_declaration_is_registered_or_refused():
    """cudaemu.py puts EMU_SHARED after each __shared__ declaration (so that it is poisoned before
    every block); one it could not register is refused rather than left unpoisoned."""
    text = ("// __shared__ in a comment is no declaration\n"
            "__shared__ foo<a, b> t[3][4];\n  __shared__ volatile int v;\n"
            "__shared__ __align__(16) gc_u16 w[8 * 8];\n")
    assert cudaemu.register_shared(text) == text.replace("[3][4];", "[3][4]; EMU_SHARED(t);").replace(
        "int v;", "int v; EMU_SHARED(v);").replace("[8 * 8];", "[8 * 8]; EMU_SHARED(w);")
    for bad in ("extern __shared__ float d[];", "__shared__ float a[4], b[4];", "__shared__ int z = 3;",
                "#define S __shared__ float x[3];", "  int q; \\\n  __shared__ float y[2]; \\\n",
                "__shared__ float e[];", "__shared__ alignas(16) float f[4];"):
        with pytest.raises(ValueError, match="cudaemu cannot register this __shared__ declaration"):
            cudaemu.register_shared(bad)
    for name in kernels.names():  # every __shared__ of the shipped kernels (outside comments)
        declared = re.findall(r"__shared__\s+[\w:<>, ]+?\s(\w+)\s*[\[;]", cudaemu._code_only(kernels.source(name)))
        registered = re.findall(r"EMU_SHARED\((\w+)\);", cudaemu.register_shared(kernels.source(name)))
        assert registered == declared and declared, name


def _positions(lib, n):
    pos, counter = np.full(n, -1, np.int32), np.zeros(1, np.int32)
    lib.emu_run_position(n, 1, 1, 1, 1, 1, cudaemu.ptr(pos), cudaemu.ptr(counter))
    return pos


def test_blocks_run_in_a_shuffled_order_fixed_by_the_seed(guards, monkeypatch):
    monkeypatch.setenv(cudaemu.SEED_ENV, "0x5eed")
    first = _positions(guards, 64)
    assert sorted(first) == list(range(64)) and not np.array_equal(first, np.arange(64))
    assert np.array_equal(_positions(guards, 64), first)  # the same seed, the same order
    monkeypatch.setenv(cudaemu.SEED_ENV, "0x5eee")
    assert not np.array_equal(_positions(guards, 64), first)
    monkeypatch.setenv(cudaemu.SEED_ENV, "grid")
    assert np.array_equal(_positions(guards, 64), np.arange(64))


def test_a_kernel_that_counts_on_block_order_fails(guards, monkeypatch):
    """chain: block b adds what block b - 1 left in x[b] to x[b + 1]: a prefix sum only if the blocks
    run in grid order, which the GPU does not promise. With seed 0x5eed (any seed whose order is not
    the grid's) the result is wrong; in grid order, as the emulator used to run, it looked right."""
    def run():
        x = np.ones(9, np.int32)
        guards.emu_chain(8, 1, 1, 1, 1, 1, cudaemu.ptr(x))
        return x

    monkeypatch.setenv(cudaemu.SEED_ENV, "grid")
    assert np.array_equal(run(), np.arange(1, 10))
    monkeypatch.setenv(cudaemu.SEED_ENV, "0x5eed")
    assert not np.array_equal(run(), np.arange(1, 10))


def test_a_malformed_seed_is_refused(guards, monkeypatch):
    monkeypatch.setenv(cudaemu.SEED_ENV, "soon")
    with pytest.raises(ValueError, match="GPUCHECK_EMU_SEED='soon'"):
        cudaemu.block_order_seed()
    with pytest.raises(cudaemu.KernelFault, match="GPUCHECK_EMU_SEED is neither a number nor \"grid\""):
        _positions(guards, 4)


# x, y, an fp32 subnormal, an fp16 subnormal, a bf16 subnormal
TINY = np.array([2.0**-70, 2.0**-60, 2.0**-140, 3.0 * 2.0**-20, 2.0**-130], np.float32)


def _underflow(lib):
    out = np.full(8, -1.0, np.float32)
    lib.emu_underflow(1, 1, 1, 32, 1, 1, cudaemu.ptr(TINY), cudaemu.ptr(out))
    return out


@pytest.mark.slow
def test_flush_to_zero_as_the_gpu_under_cupy(guards, guards_ieee):
    """fp32 arithmetic written in C flushes subnormal results and inputs to zero, as CuPy's
    -ftz=true makes the GPU do; gc_fmaf (fma.rn.f32), the fp16 and bf16 conversions keep them. The
    IEEE build shows what the flush changes."""
    x, y, sub = (float(v) for v in TINY[:3])
    ftz, ieee = _underflow(guards), _underflow(guards_ieee)
    prod = np.float32(x * y)  # 2^-130: subnormal
    assert 0 < prod < np.finfo(np.float32).tiny
    assert list(ftz[:4]) == [0.0, 0.0, 0.0, 0.0]
    assert list(ieee[:4]) == [prod, prod, np.float32(sub), np.float32(sub * 1e30)]
    for out in (ftz, ieee):
        assert out[4] == prod and out[5] == np.float32(np.float32(sub) * np.float32(1e30))
        assert out[6] == np.float32(TINY[3]).astype(np.float16).astype(np.float32) != 0
        assert out[7] == TINY[4] != 0


def test_fp16_conversions_keep_subnormals_under_the_flush(guards):
    """Every fp16 value to fp32 and back (cvt.f32.f16 and cvt.rn.f16.f32 have no .ftz): exact,
    the 2046 subnormals included."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    f = np.zeros(h.size, np.float32)
    back = np.zeros(h.size, np.uint16)
    guards.emu_f16_all(2, 1, 1, 64, 1, 1, cudaemu.ptr(h), cudaemu.ptr(f), cudaemu.ptr(back), h.size)
    want = h.view(np.float16).astype(np.float32)
    assert np.array_equal(f, want, equal_nan=True)
    number = ~np.isnan(want)
    assert np.array_equal(back[number], h[number])
    assert np.count_nonzero((f != 0) & (np.abs(f) < 2.0**-14)) == 2046  # the subnormals, all nonzero


def test_the_tensor_core_mma_keeps_subnormals_under_the_flush(guards):
    d = np.zeros(32 * 4, np.float32)
    guards.emu_mma_tiny(1, 1, 1, 32, 1, 1, cudaemu.ptr(d))
    assert (d == np.float32(2.0**-136)).all()


def test_the_stage_floor_holds_at_the_bottom_of_fp32_only_without_the_flush(guards, guards_ieee):
    """Dot products whose terms and sums are subnormal or just above (entries 2^-64 .. 2^-62):
    gc_fmaf stays within the POET stage bound (acc_coeff |a|.|b| + stage_floor, whose floor is
    2^-150 per operation), under the GPU's flush to zero too; __fmaf_rn, flushed, does not. That is
    why the POET kernels accumulate with gc_fmaf."""
    rng = np.random.default_rng(3)
    rows, n = 64, 32
    a = (rng.standard_normal((rows, n)) * 2.0**-64).astype(np.float32)
    b = (rng.standard_normal((rows, n)) * 2.0**-62).astype(np.float32)
    exact = (a.astype(np.float64) * b.astype(np.float64)).sum(1)
    bound = acc_coeff(n, U32) * (np.abs(a.astype(np.float64)) * np.abs(b.astype(np.float64))).sum(1) \
        + stage_floor("fp32", n)
    kept = []
    for lib, flushes in ((guards, True), (guards_ieee, False)):
        c_rn, c_ieee = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
        lib.emu_dot_pair(1, 1, 1, rows, 1, 1, cudaemu.ptr(a), cudaemu.ptr(b), cudaemu.ptr(c_rn), cudaemu.ptr(c_ieee), n)
        assert (np.abs(c_ieee - exact) <= bound).all()
        assert bool((np.abs(c_rn - exact) <= bound).all()) is not flushes
        kept.append(c_ieee)
    assert np.array_equal(kept[0].view(np.uint32), kept[1].view(np.uint32))  # gc_fmaf: the same bits either way


def _entry(ptx: str, name: str) -> str:
    body = ptx[ptx.index(f".entry {name}("):]
    return body[:body.index("\n}")]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_guard_kernels_are_the_instructions_the_emulator_models(arch):
    """NVRTC with gpucheck's options plus what CuPy appends (-ftz=true): the arithmetic that the
    emulator flushes compiles to .ftz forms (mul, fma, add), gc_fmaf and the fp16 conversions to
    forms without .ftz, the mma to mma.sync, and the vector helpers and the alignas(16) struct
    to 16-byte vector accesses (which fault on the GPU when misaligned)."""
    _require_nvrtc()
    from gpucheck.kernels.cupy_module import OPTIONS

    ptx = nvrtc.compile_ptx(kernels.PRELUDE_FOR_TESTS() + GUARD_KERNELS, "guards", arch,
                            OPTIONS + cudaemu.CUPY_APPENDED_OPTIONS)
    flushed = _entry(ptx, "underflow")
    for op in ("mul.ftz.f32", "fma.rn.ftz.f32", "add.ftz.f32", "fma.rn.f32 ", "cvt.rn.f16.f32 ", "cvt.f32.f16 "):
        assert op in flushed, op
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in _entry(ptx, "mma_tiny")
    for name in ("v16_copy", "wide_copy"):
        assert "ld.global.v4.u32" in _entry(ptx, name), name


@pytest.mark.gpu
def test_the_gpu_flushes_what_the_emulator_flushes(guards):
    """On the GPU machine (pytest -m gpu): the guard kernels compiled as gpucheck compiles through
    CuPy give the emulator's bits: the underflow kernel (flushed and kept values) and the mma's
    subnormal result."""
    cupy = pytest.importorskip("cupy")
    try:
        cc = int(cupy.cuda.Device(0).compute_capability)
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"no CUDA device: {e}")
    from gpucheck.kernels.cupy_module import OPTIONS

    mod = cupy.RawModule(code=kernels.PRELUDE_FOR_TESTS() + GUARD_KERNELS, options=OPTIONS)
    out = cupy.full(8, -1.0, cupy.float32)
    mod.get_function("underflow")((1,), (32,), (cupy.asarray(TINY), out))
    assert np.array_equal(out.get().view(np.uint32), _underflow(guards).view(np.uint32))
    if cc >= 80:
        d = cupy.zeros(32 * 4, cupy.float32)
        mod.get_function("mma_tiny")((1,), (32,), (d,))
        assert (d.get() == np.float32(2.0**-136)).all()
