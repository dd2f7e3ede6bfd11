// gpucheck kernel prelude: prepended to every kernel source (gpucheck.kernels.source()).
//
// The same text compiles three ways, so that kernels are tested without a GPU:
//   - by NVRTC through CuPy (RawModule) on a GPU machine, the production path;
//   - by NVRTC alone in the CPU test suite (tests/nvrtc.py), a compile check for sm_80 and sm_90;
//   - by g++ with tests/cudaemu.h (GC_EMULATION defined), which runs every CUDA thread of a block
//     as an OS thread, so the kernels' indexing and arithmetic execute on the CPU in tests.
// Rules for kernel sources: no #include (NVRTC has no standard headers here), extern "C" entry
// points (no templates at the entry; templates inside are fine), static __shared__ sizes only,
// one __shared__ variable per declaration and no initializer (the emulator registers each one to
// fill it with junk before every block), no early `return` before a __syncthreads(), nothing that
// counts on the order the blocks run in (the emulator shuffles it), no access at an address that
// is not a multiple of its size (the emulator faults, as the GPU does). Warp-level operations (__syncwarp, __shfl*_sync,
// __ballot_sync, __any_sync, __all_sync, gc_mma_16816_* below) only with the full warp
// converged (mask 0xffffffff, every lane of the warp calling): the emulator runs them with a
// barrier among the warp's 32 lanes and refuses any other mask; no __activemask, no partial
// masks, no warp-synchronous code that relies on lockstep execution without a *_sync operation.

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

// 16 bytes moved as one (ld/st.v4.u32 on the device): for vectorised loads and stores of
// 16-byte-aligned data, and 32-bit words of 16-bit arrays. Only at addresses that are multiples
// of their size: the GPU faults on any other ("misaligned address"), and so does the emulation
// (tests/cudaemu.h: emu_check_align).
struct alignas(16) gc_v16 {
    gc_u32 w[4];
};
#ifdef GC_EMULATION
__device__ __forceinline__ gc_v16 gc_ld_v16(const void* p) {
    emu_check_align(p, 16, "gc_ld_v16 (a 16-byte vector load)");
    gc_v16 v; memcpy(&v, p, 16); return v;
}
__device__ __forceinline__ void gc_st_v16(void* p, gc_v16 v) {
    emu_check_align(p, 16, "gc_st_v16 (a 16-byte vector store)");
    memcpy(p, &v, 16);
}
__device__ __forceinline__ gc_u32 gc_ld_u32(const void* p) {
    emu_check_align(p, 4, "gc_ld_u32 (a 32-bit load)");
    gc_u32 v; memcpy(&v, p, 4); return v;
}
__device__ __forceinline__ void gc_st_u32(void* p, gc_u32 v) {
    emu_check_align(p, 4, "gc_st_u32 (a 32-bit store)");
    memcpy(p, &v, 4);
}
#else
__device__ __forceinline__ gc_v16 gc_ld_v16(const void* p) { return *(const gc_v16*)p; }
__device__ __forceinline__ void gc_st_v16(void* p, gc_v16 v) { *(gc_v16*)p = v; }
__device__ __forceinline__ gc_u32 gc_ld_u32(const void* p) { return *(const gc_u32*)p; }
__device__ __forceinline__ void gc_st_u32(void* p, gc_u32 v) { *(gc_u32*)p = v; }
#endif

// a * b + c in fp32, rounded once to nearest, with IEEE gradual underflow (fma.rn.f32 without
// .ftz) whatever -ftz the source is compiled with. CuPy appends -ftz=true, which makes __fmaf_rn
// and fp32 arithmetic written in C flush subnormal inputs and results to zero; a kernel whose
// error bound counts on gradual underflow (the POET kernels: gpucheck.poet.bounds, ACC_FLOOR)
// accumulates with this. On the device: inline PTX; in emulation: an IEEE fma under the emulated
// flush to zero (tests/cudaemu.h: emu_fmaf_ieee).
#ifdef GC_EMULATION
__device__ __forceinline__ float gc_fmaf(float a, float b, float c) { return emu_fmaf_ieee(a, b, c); }
#else
__device__ __forceinline__ float gc_fmaf(float a, float b, float c) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}
#endif

// ---- tensor cores: one warp-level matrix multiply-accumulate ------------------------------------
// d = A . B + c with A 16 x 16 (row major), B 16 x 8 (column major), c and d 16 x 8 in fp32:
// mma.sync.aligned.m16n8k16.row.col.f32.<bf16|f16>.<bf16|f16>.f32 (sm_80 and later). Fragments
// as the PTX ISA documents them ("Matrix Fragments for mma.m16n8k16 with floating point type"),
// with g = lane / 4 and t = lane % 4, two 16-bit elements per register (lower index in the low
// half):
//   a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   c[i], d[i] = C, D[g + 8 (i >= 2)][2t + (i & 1)]
// Every lane of the warp calls it together. On the device: inline PTX (a GPU older than sm_80
// traps; gpucheck.poet.cupy_ops never launches it there). In emulation (tests/cudaemu.h): the
// lanes exchange their fragments and each computes its own d with the same layout.
#ifdef GC_EMULATION
__device__ __forceinline__ void gc_mma_16816_bf16(float (&d)[4], const gc_u32 (&a)[4], const gc_u32 (&b)[2],
                                                  const float (&c)[4]) {
    emu_mma_m16n8k16(EMU_MMA_BF16, d, a, b, c);
}
__device__ __forceinline__ void gc_mma_16816_f16(float (&d)[4], const gc_u32 (&a)[4], const gc_u32 (&b)[2],
                                                 const float (&c)[4]) {
    emu_mma_m16n8k16(EMU_MMA_F16, d, a, b, c);
}
#else
__device__ __forceinline__ void gc_mma_16816_bf16(float (&d)[4], const gc_u32 (&a)[4], const gc_u32 (&b)[2],
                                                  const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
#else
    __trap();
#endif
}
__device__ __forceinline__ void gc_mma_16816_f16(float (&d)[4], const gc_u32 (&a)[4], const gc_u32 (&b)[2],
                                                 const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
#else
    __trap();
#endif
}
#endif

// The mma of a storage dtype tag (bf16 or fp16): gc_mma_16816(d, a, b, c, gc_bf16()).
__device__ __forceinline__ void gc_mma_16816(float (&d)[4], const gc_u32 (&a)[4], const gc_u32 (&b)[2],
                                             const float (&c)[4], gc_bf16) {
    gc_mma_16816_bf16(d, a, b, c);
}
__device__ __forceinline__ void gc_mma_16816(float (&d)[4], const gc_u32 (&a)[4], const gc_u32 (&b)[2],
                                             const float (&c)[4], gc_f16) {
    gc_mma_16816_f16(d, a, b, c);
}

// ---- ldmatrix: four 8 x 8 matrices of 16-bit elements from shared memory into mma fragments -----
// gc_ldmatrix_x4(r, row): ldmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_75 and later), a
// warp-collective load (PTX ISA, "Warp-level matrix load instruction: ldmatrix"). Lane l supplies
// `row`, the address of row l % 8 of matrix l / 8: 8 contiguous 16-bit elements in shared memory,
// 16-byte aligned. Every lane receives, in r[i], two elements of matrix i: (g, 2t) in the low half
// and (g, 2t + 1) in the high half, with g = lane / 4 and t = lane % 4, which is the register of an
// mma A or B fragment covering that 8 x 8 block (see the fragment table above: a[0..3] are the
// blocks (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) of A; b[0], b[1] the blocks
// (k 0-7), (k 8-15) of an n8 column of B stored n-major). gc_ldmatrix_x4_trans (.trans): each matrix
// transposed on the way, r[i] = (2t, g) low and (2t + 1, g) high: the B fragment of a k-major B.
// Every lane of the warp calls it together, with the same shared memory synchronised before it.
// In emulation (tests/cudaemu.h, emu_ldmatrix) the lanes exchange their rows the same way.
#ifdef GC_EMULATION
__device__ __forceinline__ void gc_ldmatrix_x4(gc_u32 (&r)[4], const gc_u16* row) { emu_ldmatrix(4, false, r, row); }
__device__ __forceinline__ void gc_ldmatrix_x4_trans(gc_u32 (&r)[4], const gc_u16* row) {
    emu_ldmatrix(4, true, r, row);
}
#else
__device__ __forceinline__ void gc_ldmatrix_x4(gc_u32 (&r)[4], const gc_u16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((gc_u32)__cvta_generic_to_shared(row)));
#else
    __trap();
#endif
}
__device__ __forceinline__ void gc_ldmatrix_x4_trans(gc_u32 (&r)[4], const gc_u16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((gc_u32)__cvta_generic_to_shared(row)));
#else
    __trap();
#endif
}
#endif
