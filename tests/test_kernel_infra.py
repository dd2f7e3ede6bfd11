"""The kernel infrastructure every CUDA check relies on: the prelude's dtype conversions and RNG
agree with torch / NumPy, the CPU emulation runs blocks with shared memory and barriers the way a
GPU does, and every shipped kernel source compiles with NVRTC for sm_80 and sm_90."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cudaemu
import nvrtc
from gpucheck import kernels

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
    import ctypes

    lib = cudaemu.build_text("infra", kernels.PRELUDE_FOR_TESTS() + DRIVER, LAUNCHERS)
    lib.emu_mix.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int]
    return lib


def _launch(fn, grid, block, *args):
    fn(*grid, *block, *args)


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
