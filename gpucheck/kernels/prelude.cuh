// gpucheck kernel prelude: prepended to every kernel source (gpucheck.kernels.source()).
//
// The same text compiles three ways, so that kernels are tested without a GPU:
//   - by NVRTC through CuPy (RawModule) on a GPU machine, the production path;
//   - by NVRTC alone in the CPU test suite (tests/nvrtc.py), a compile check for sm_80 and sm_90;
//   - by g++ with tests/cudaemu.h (GC_EMULATION defined), which runs every CUDA thread of a block
//     as an OS thread, so the kernels' indexing and arithmetic execute on the CPU in tests.
// Rules for kernel sources: no #include (NVRTC has no standard headers here), extern "C" entry
// points (no templates at the entry; templates inside are fine), static __shared__ sizes only,
// no warp intrinsics (__shfl*, __ballot*), no early `return` before a __syncthreads().

typedef unsigned char gc_u8;
typedef unsigned short gc_u16;
typedef unsigned int gc_u32;
typedef unsigned long long gc_u64;
typedef long long gc_i64;

// bfloat16 stored as its 16 bits. Conversion by bit arithmetic (round to nearest even; NaN stays a
// quiet NaN): identical on the device and in emulation, and to torch's float -> bfloat16.
__device__ __forceinline__ float gc_bf16_to_f32(gc_u16 h) {
    return __uint_as_float(((gc_u32)h) << 16);
}
__device__ __forceinline__ gc_u16 gc_f32_to_bf16(float f) {
    gc_u32 u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (gc_u16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (gc_u16)(u >> 16);
}

// IEEE half stored as its 16 bits: the hardware's conversion on the device, _Float16 in emulation.
#ifdef GC_EMULATION
__device__ __forceinline__ float gc_f16_to_f32(gc_u16 h) {
    _Float16 v; memcpy(&v, &h, 2); return (float)v;
}
__device__ __forceinline__ gc_u16 gc_f32_to_f16(float f) {
    _Float16 v = (_Float16)f; gc_u16 h; memcpy(&h, &v, 2); return h;
}
#else
__device__ __forceinline__ float gc_f16_to_f32(gc_u16 h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ gc_u16 gc_f32_to_f16(float f) {
    gc_u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
#endif

// Storage types by dtype tag, for templates: load to float, store from float.
struct gc_f32 { typedef float storage; };
struct gc_bf16 { typedef gc_u16 storage; };
struct gc_f16 { typedef gc_u16 storage; };
__device__ __forceinline__ float gc_load(const float* p, gc_f32) { return *p; }
__device__ __forceinline__ float gc_load(const gc_u16* p, gc_bf16) { return gc_bf16_to_f32(*p); }
__device__ __forceinline__ float gc_load(const gc_u16* p, gc_f16) { return gc_f16_to_f32(*p); }
__device__ __forceinline__ void gc_store(float* p, float v, gc_f32) { *p = v; }
__device__ __forceinline__ void gc_store(gc_u16* p, float v, gc_bf16) { *p = gc_f32_to_bf16(v); }
__device__ __forceinline__ void gc_store(gc_u16* p, float v, gc_f16) { *p = gc_f32_to_f16(v); }

// A counter-based generator (splitmix64's finaliser): word i of a seeded random stream, the same
// on the device, in emulation and in gpucheck.kernels.splitmix64 (NumPy), so data written from a
// seed can be regenerated for checking without storing it.
__device__ __forceinline__ gc_u64 gc_mix64(gc_u64 seed, gc_u64 i) {
    gc_u64 z = seed + (i + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
