// CUDA on the CPU, for tests: compiles gpucheck's kernel sources with g++ and runs them.
//
// Every CUDA thread of a block is an OS thread; blocks run one after another, so `__shared__`
// (made `static`) is shared by exactly the threads of one block, and __syncthreads() is a
// std::barrier. A thread that returns drops out of the barrier (as exited threads do on Volta and
// later). Enough of the device API for gpucheck's kernels; see gpucheck/kernels/prelude.cuh for
// the rules kernel sources follow. Driver code exports launchers with EMU_LAUNCH_PARAMS /
// EMU_LAUNCH (see tests/cudaemu.py).
//
// Warps: the threads of a block are grouped into warps of 32 by linear thread index (x fastest),
// as on the GPU. A warp-collective operation (__syncwarp, __shfl*_sync, __ballot_sync,
// __any_sync, __all_sync, and the tensor-core mma below) is executed by the warp's lanes
// together: each lane publishes its operand in the warp's exchange area, the lanes meet at a
// barrier of the warp, and each reads what it needs (double-buffered, so one barrier per
// operation suffices: a lane can only overwrite a buffer after every lane has passed the next
// barrier, that is, after every lane has read it). Only full-warp masks are emulated (0xffffffff,
// or exactly the lanes a partial last warp has): a kernel that passes another mask aborts with a
// message rather than computing something the GPU would not.
#pragma once
#define GC_EMULATION 1
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <algorithm>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 { unsigned x, y, z; };

inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline dim3 blockDim, gridDim;
inline thread_local std::barrier<>* emu_block_barrier = nullptr;

// One warp of the running block: its barrier and the lanes' exchange area (see the header).
struct emu_warp_state {
    static constexpr int WORDS = 8;  // 32-bit words one lane can publish per operation
    std::barrier<> bar;
    unsigned lanes;                  // 32, or fewer in a partial last warp
    unsigned slot[2][32][WORDS];
    explicit emu_warp_state(unsigned n) : bar((std::ptrdiff_t)n), lanes(n) {}
};
inline thread_local emu_warp_state* emu_warp = nullptr;
inline thread_local unsigned emu_lane = 0;
inline thread_local unsigned emu_warp_parity = 0;  // which exchange buffer this lane uses next

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <class T> inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {
    std::atomic_ref<float> a(*p);
    return a.fetch_add(v);
}
template <class T> inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <class T> inline T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <class T> inline T atomicCAS(T* p, T cmp, T v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
template <class T> inline T __ldg(const T* p) { return *p; }

// ---- warp-collective operations --------------------------------------------------------------

inline void emu_check_mask(unsigned mask, const char* what) {
    const unsigned lanes = emu_warp->lanes;
    const unsigned present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    if (mask != 0xffffffffu && mask != present) {
        fprintf(stderr, "cudaemu: %s with mask %#x in a warp of %u lanes: only full-warp masks are emulated\n",
                what, mask, lanes);
        abort();
    }
}

// Publish `n` 32-bit words of this lane, wait for the warp; the warp's words of this operation.
inline const unsigned (*emu_warp_exchange(unsigned mask, const char* what, const unsigned* words, int n))[emu_warp_state::WORDS] {
    emu_check_mask(mask, what);
    emu_warp_state& w = *emu_warp;
    const unsigned par = emu_warp_parity;
    emu_warp_parity ^= 1u;
    memcpy(w.slot[par][emu_lane], words, sizeof(unsigned) * (size_t)n);
    w.bar.arrive_and_wait();
    return w.slot[par];
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_check_mask(mask, "__syncwarp");
    emu_warp->bar.arrive_and_wait();
}

// shfl.sync as PTX defines it (mode up / down / bfly / idx; c = clamp | segment mask << 8), with
// the c values CUDA's __shfl*_sync pass for `width`. A source lane outside the segment, or one that
// does not exist in a partial warp, leaves the caller's own value.
enum emu_shfl_mode { EMU_SHFL_UP, EMU_SHFL_DOWN, EMU_SHFL_BFLY, EMU_SHFL_IDX };

inline unsigned emu_shfl_source(emu_shfl_mode mode, unsigned lane, unsigned b, unsigned c) {
    const unsigned cval = c & 31u, segmask = (c >> 8) & 31u;
    const unsigned max_lane = (lane & segmask) | (cval & ~segmask);
    const unsigned min_lane = lane & segmask;
    long j;
    bool p;
    switch (mode) {
        case EMU_SHFL_UP: j = (long)lane - (long)(b & 31u); p = j >= (long)max_lane; break;
        case EMU_SHFL_DOWN: j = (long)lane + (long)(b & 31u); p = j <= (long)max_lane; break;
        case EMU_SHFL_BFLY: j = (long)(lane ^ (b & 31u)); p = j <= (long)max_lane; break;
        default: j = (long)(min_lane | ((b & 31u) & ~segmask)); p = j <= (long)max_lane; break;
    }
    return p ? (unsigned)j : lane;
}

template <class T> inline T emu_shfl(emu_shfl_mode mode, const char* what, unsigned mask, T var, unsigned b,
                                     int width, unsigned clamp) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 64 bits");
    if (width < 1 || width > 32 || (width & (width - 1))) {
        fprintf(stderr, "cudaemu: %s with width %d (a power of 2 up to 32)\n", what, width);
        abort();
    }
    unsigned words[2] = {0, 0};
    memcpy(words, &var, sizeof(T));
    const auto all = emu_warp_exchange(mask, what, words, 2);
    unsigned src = emu_shfl_source(mode, emu_lane, b, clamp | ((32u - (unsigned)width) << 8));
    if (src >= emu_warp->lanes) src = emu_lane;
    T out;
    memcpy(&out, all[src], sizeof(T));
    return out;
}
template <class T> inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return emu_shfl(EMU_SHFL_IDX, "__shfl_sync", mask, var, (unsigned)src_lane, width, 31u);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return emu_shfl(EMU_SHFL_UP, "__shfl_up_sync", mask, var, delta, width, 0u);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return emu_shfl(EMU_SHFL_DOWN, "__shfl_down_sync", mask, var, delta, width, 31u);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return emu_shfl(EMU_SHFL_BFLY, "__shfl_xor_sync", mask, var, (unsigned)lane_mask, width, 31u);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
    const unsigned mine = predicate ? 1u : 0u;
    const auto all = emu_warp_exchange(mask, "__ballot_sync", &mine, 1);
    unsigned out = 0;
    for (unsigned l = 0; l < emu_warp->lanes; ++l) out |= all[l][0] << l;
    return out;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
    const unsigned lanes = emu_warp->lanes;
    return __ballot_sync(mask, predicate) == (lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u));
}

// ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 ---------------
//
// Fragments exactly as the PTX ISA documents them ("Matrix Fragments for mma.m16n8k16 with
// floating point type"), with groupID g = lane / 4 and threadID_in_group t = lane % 4; each
// 32-bit register holds two 16-bit elements, the lower index in the low half:
//   A (16 x 16, row):  a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                      a[2] = A[g][2t+8, 2t+9]  a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   C, D (16 x 8):     c[i], d[i] = [g + 8 (i >= 2)][2t + (i & 1)]
// Arithmetic model (the hardware's is not IEEE and not documented): the 16 products are exact
// (a bf16 or fp16 product fits fp32's 24 bits), c and the products are summed in k order in
// binary64 and the sum is truncated (rounded toward zero) to fp32 once: one fused multi-term
// addition with truncation per instruction, as measured on the hardware (Fasi et al. 2021;
// Khattak and Mikaitis 2025). gpucheck.poet.bounds.mma_acc_coeff bounds this model and the
// hardware's alike.
enum emu_mma_kind { EMU_MMA_BF16 = 0, EMU_MMA_F16 = 1 };

inline double emu_mma_elem(emu_mma_kind kind, unsigned reg, unsigned half) {
    const unsigned short h = (unsigned short)(half ? reg >> 16 : reg & 0xffffu);
    if (kind == EMU_MMA_BF16) {
        const unsigned u = (unsigned)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return (double)f;
    }
    _Float16 v;
    memcpy(&v, &h, 2);
    return (double)(float)v;
}

inline float emu_round_toward_zero(double x) {
    float f = (float)x;
    if (std::isfinite(f) && std::fabs((double)f) > std::fabs(x)) f = std::nextafter(f, 0.0f);
    return f;
}

inline void emu_mma_m16n8k16(emu_mma_kind kind, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                             const float (&c)[4]) {
    const unsigned words[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const auto all = emu_warp_exchange(0xffffffffu, "mma.sync.m16n8k16", words, 6);
    if (emu_warp->lanes != 32) {
        fprintf(stderr, "cudaemu: mma.sync in a partial warp of %u lanes\n", emu_warp->lanes);
        abort();
    }
    const unsigned g = emu_lane / 4, t = emu_lane % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const unsigned row = g + 8u * (unsigned)(i >= 2), col = 2u * t + (unsigned)(i & 1);
        double s = (double)c[i];
        for (unsigned k = 0; k < 16; ++k) {
            // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8)
            const unsigned a_reg = all[(row % 8) * 4 + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
            // B[k][col]: lane col * 4 + (k % 8) / 2, register 4 + (k >= 8) of the published words
            const unsigned b_reg = all[col * 4 + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)];
            s += emu_mma_elem(kind, a_reg, k & 1) * emu_mma_elem(kind, b_reg, k & 1);
        }
        out[i] = emu_round_toward_zero(s);
    }
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ---- ldmatrix ----------------------------------------------------------------------------------
//
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 as the PTX ISA defines it ("Warp-level
// matrix load instruction: ldmatrix"): a warp-collective load of `num` (1, 2 or 4) 8 x 8 matrices of
// 16-bit elements. Lanes 8i .. 8i + 7 supply the addresses of rows 0 .. 7 of matrix i (the other
// lanes' addresses are not used: lanes 0-7 for .x1, 0-15 for .x2); each row is 8 contiguous
// elements (16 bytes) and its address must be 16-byte aligned. Lane l (g = l / 4, t = l % 4)
// receives in r[i] the elements (g, 2t) (low half) and (g, 2t + 1) of matrix i, or with .trans
// (2t, g) and (2t + 1, g). Emulated with one exchange: each address lane reads its own 16-byte
// row (so no lane reads shared memory after the warp has moved on) and publishes it; each lane
// then picks its elements. A misaligned row address, a partial warp or another `num` aborts with
// a message.
inline void emu_ldmatrix(unsigned num, bool trans, unsigned* r, const void* row) {
    const char* what = trans ? "ldmatrix.trans" : "ldmatrix";
    if (num != 1 && num != 2 && num != 4) {
        fprintf(stderr, "cudaemu: %s.x%u: only .x1, .x2 and .x4 exist\n", what, num);
        abort();
    }
    unsigned words[4] = {0, 0, 0, 0};
    if (emu_lane < 8 * num) {
        if ((uintptr_t)row % 16 != 0) {
            fprintf(stderr, "cudaemu: %s: lane %u's row address %p is not 16-byte aligned\n", what, emu_lane, row);
            abort();
        }
        memcpy(words, row, 16);
    }
    const auto all = emu_warp_exchange(0xffffffffu, what, words, 4);
    if (emu_warp->lanes != 32) {
        fprintf(stderr, "cudaemu: %s in a partial warp of %u lanes\n", what, emu_warp->lanes);
        abort();
    }
    const unsigned g = emu_lane / 4, t = emu_lane % 4;
    for (unsigned i = 0; i < num; ++i) {
        unsigned short lo, hi;  // element c of row q of matrix i: 16-bit element c of lane 8i + q's row
        if (trans) {
            memcpy(&lo, (const char*)all[8 * i + 2 * t] + 2 * g, 2);
            memcpy(&hi, (const char*)all[8 * i + 2 * t + 1] + 2 * g, 2);
        } else {
            memcpy(&lo, (const char*)all[8 * i + g] + 4 * t, 2);
            memcpy(&hi, (const char*)all[8 * i + g] + 4 * t + 2, 2);
        }
        r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
}

// Run `body` (a call of the kernel) as a grid of blocks of threads.
template <class F> void emu_launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar((std::ptrdiff_t)nt);
                std::vector<std::unique_ptr<emu_warp_state>> warps;
                for (unsigned w = 0; w * 32 < nt; ++w)
                    warps.push_back(std::make_unique<emu_warp_state>(std::min(32u, nt - w * 32)));
                std::vector<std::thread> threads;
                threads.reserve(nt);
                for (unsigned t = 0; t < nt; ++t)
                    threads.emplace_back([&, t] {
                        threadIdx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        blockIdx = uint3{bx, by, bz};
                        emu_block_barrier = &bar;
                        emu_warp = warps[t / 32].get();
                        emu_lane = t % 32;
                        emu_warp_parity = 0;
                        body();
                        bar.arrive_and_drop();
                        emu_warp->bar.arrive_and_drop();
                    });
                for (auto& th : threads) th.join();
            }
}

#define EMU_LAUNCH_PARAMS unsigned emu_gx, unsigned emu_gy, unsigned emu_gz, unsigned emu_bx, unsigned emu_by, unsigned emu_bz
#define EMU_LAUNCH(call) emu_launch(dim3(emu_gx, emu_gy, emu_gz), dim3(emu_bx, emu_by, emu_bz), [&] { call; })
