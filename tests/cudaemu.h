// CUDA on the CPU, for tests: compiles gpucheck's kernel sources with g++ and runs them.
//
// Every CUDA thread of a block is an OS thread; the blocks of a grid run one at a time, so
// `__shared__` (made `static`) is shared by exactly the threads of one block, and __syncthreads()
// is a std::barrier. A thread that returns drops out of the barrier (as exited threads do on Volta
// and later). Enough of the device API for gpucheck's kernels; see gpucheck/kernels/prelude.cuh
// for the rules kernel sources follow. Driver code exports launchers with EMU_LAUNCH_PARAMS /
// EMU_LAUNCH (see tests/cudaemu.py, which also compiles the text: -fsanitize=alignment, and an
// EMU_SHARED registration after every __shared__ declaration).
//
// Strict where a GPU is: what would fault or differ on the GPU faults or differs here too.
//  - Faults. A kernel that does what faults on a GPU (a misaligned access, below) or what the
//    emulator refuses to guess (a partial warp mask) calls emu_fault: that thread leaves the kernel
//    at once (a longjmp back to where its thread started it: kernel code holds no objects with
//    destructors, and no emulator code calls emu_fault while it holds one), the other threads of
//    its block leave at their next __syncthreads or warp-collective operation, no further block
//    starts, and the launcher returns with the first fault's message kept (with the block, the
//    thread and the block-order seed). tests/cudaemu.py takes it after every launcher call and
//    raises KernelFault: a test failure with the message, never an abort or a hang. A fault also
//    stops any later EMU_LAUNCH of the same launcher call (CUDA's errors are sticky).
//  - Alignment. The GPU faults on an access at an address that is not a multiple of its size
//    ("misaligned address"). The prelude's vector loads and stores check their address
//    (emu_check_align: 16 bytes for gc_ld_v16 / gc_st_v16, 4 for gc_ld_u32 / gc_st_u32), and the
//    text is compiled with -fsanitize=alignment, whose handler below makes every typed access at
//    an address misaligned for its type a fault: an alignas(16) struct (memtest's mt_u128, moved
//    as one 16-byte vector on the GPU), a float through a misaligned pointer, and so on.
//  - Shared memory holds junk when a block starts. Before each block every `__shared__` variable
//    is filled with EMU_SHARED_POISON bytes (0xFF): read before the block wrote it, an fp32, fp64,
//    bf16 or fp16 value is a NaN, a signed integer -1, an unsigned one its maximum; never zeros or
//    the previous block's data. tests/cudaemu.py puts EMU_SHARED(name) after every __shared__
//    declaration of the kernel text: it registers the variable the first time its declaration
//    runs (and poisons it then); emu_launch poisons every registered variable before each block.
//  - Block order. The blocks of a grid run in a shuffled order, a function of the seed in
//    GPUCHECK_EMU_SEED (tests/cudaemu.py sets a random one per test session when it is unset, and
//    prints it with every failure) and of the grid's shape: the same seed gives the same order. A
//    kernel that reads what another block wrote without a grid-wide synchronisation gets what it
//    would on a GPU, where blocks run in no particular order. GPUCHECK_EMU_SEED=grid runs the
//    blocks in grid order (x fastest), for debugging.
//  - Flush to zero. CuPy compiles with -ftz=true, so on the GPU fp32 arithmetic written in C (+,
//    -, *, /, __fmaf_rn, sqrtf, comparisons, conversions from and to fp32) treats subnormal inputs
//    as zero and flushes subnormal results to sign-preserving zero (the .ftz forms of add, mul,
//    fma, setp, cvt ...). With GC_EMU_FTZ=1 (tests/cudaemu.py's default, from gpucheck's NVRTC
//    options and what CuPy appends) every kernel thread runs with x86's MXCSR FTZ and DAZ set,
//    which does the same to the CPU's fp32 arithmetic. What the GPU computes without .ftz keeps
//    gradual underflow here too: gc_fmaf (fma.rn.f32), the tensor-core mma below, the fp16
//    conversions (cvt without .ftz) and the bf16 ones (bit arithmetic). x86 flushes fp64 as well,
//    which the GPU never does (no gpucheck kernel computes in fp64); a result that rounds to
//    exactly 2^-126 from below is kept (x86 detects tininess after rounding; the GPU's choice is
//    not documented). An fp32 atomicAdd computes in the thread's mode, like the GPU's
//    atom.add.f32 only with GC_EMU_FTZ=1 (it always flushes).
//
// Warps: the threads of a block are grouped into warps of 32 by linear thread index (x fastest),
// as on the GPU. A warp-collective operation (__syncwarp, __shfl*_sync, __ballot_sync,
// __any_sync, __all_sync, and the tensor-core mma below) is executed by the warp's lanes
// together: each lane publishes its operand in the warp's exchange area, the lanes meet at a
// barrier of the warp, and each reads what it needs (double-buffered, so one barrier per
// operation suffices: a lane can only overwrite a buffer after every lane has passed the next
// barrier, that is, after every lane has read it). Only full-warp masks are emulated (0xffffffff,
// or exactly the lanes a partial last warp has): a kernel that passes another mask faults rather
// than computing something the GPU would not.
// A new warp-collective operation goes in a section of its own after the tensor-core one, built
// on emu_warp_exchange (which checks the mask, and leaves the kernel after a fault elsewhere in
// the block). One that reads or writes memory (ldmatrix, stmatrix, cp.async ...) must
//  - check each address the instruction requires aligned with emu_check_align (ldmatrix: every
//    row address a multiple of 16), before the exchange, so that a misaligned one faults;
//  - read the bytes where they are, at the time the lanes meet (memcpy from the address, not a
//    copy taken earlier), so that shared memory not yet written shows the poison;
//  - compute no fp32 value under the thread's FTZ mode unless the instruction has .ftz: wrap the
//    arithmetic in an emu_fp_scope(false) after the exchange, and fence its operands in and its
//    results out of the scope as emu_mma_m16n8k16 does (the compiler knows nothing of MXCSR).
#pragma once
#define GC_EMULATION 1
#ifndef GC_EMU_FTZ
#define GC_EMU_FTZ 1
#endif
#if !defined(__x86_64__)
#error "cudaemu.h emulates the GPU's flush-to-zero with x86's MXCSR: build the tests on x86-64"
#endif
#include <atomic>
#include <barrier>
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <algorithm>
#include <thread>
#include <vector>
#include <xmmintrin.h>

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
#define __align__(n) __attribute__((aligned(n)))  // after `static`, where alignas may not go

// ---- faults ------------------------------------------------------------------------------------

// The order the running grid's blocks run in (see the header), for messages.
struct emu_block_order {
    bool shuffled;
    unsigned long long seed;
};
inline emu_block_order emu_order_now{true, 0};
inline unsigned emu_block_position = 0;  // how many blocks of the running grid ran before this one

inline std::mutex emu_fault_mutex;
inline std::atomic<bool> emu_faulted{false};
inline char emu_fault_text[4096];
inline thread_local std::jmp_buf* emu_thread_exit = nullptr;  // where this kernel thread started

// Keep `what` as the fault of this launcher call unless one is kept already.
inline void emu_fault_record(const char* what) {
    std::lock_guard<std::mutex> lock(emu_fault_mutex);
    if (emu_faulted.load()) return;
    char order[96];
    if (emu_order_now.shuffled)
        snprintf(order, sizeof order, "shuffled by GPUCHECK_EMU_SEED=%#llx", emu_order_now.seed);
    else
        snprintf(order, sizeof order, "in grid order (GPUCHECK_EMU_SEED=grid)");
    snprintf(emu_fault_text, sizeof emu_fault_text,
             "%s [block (%u, %u, %u), thread (%u, %u, %u); grid (%u, %u, %u) of blocks (%u, %u, %u); "
             "this block ran after %u others, %s]",
             what, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, gridDim.x, gridDim.y,
             gridDim.z, blockDim.x, blockDim.y, blockDim.z, emu_block_position, order);
    emu_faulted.store(true);
}

[[noreturn]] inline void emu_leave_kernel() { std::longjmp(*emu_thread_exit, 1); }

// The kernel did what faults on a GPU (or what the emulator refuses): keep the message, leave.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void emu_fault(const char* fmt, ...) {
    char what[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    emu_fault_record(what);
    if (!emu_thread_exit) {  // not in a kernel thread: nothing to leave
        fprintf(stderr, "cudaemu: %s\n", what);
        abort();
    }
    emu_leave_kernel();
}

// At a barrier or collective: after a fault elsewhere in the block, this thread leaves too (the
// GPU stops the whole grid; here no thread goes on past a point where it could read what the
// faulting thread did not do).
inline void emu_checkpoint() {
    if (emu_faulted.load(std::memory_order_relaxed) && emu_thread_exit) emu_leave_kernel();
}

// For tests/cudaemu.py after every launcher call: 1 and the message (then forgotten) when a fault
// was kept, else 0.
extern "C" __attribute__((used, visibility("default"))) int emu_fault_take(char* out, unsigned long size) {
    std::lock_guard<std::mutex> lock(emu_fault_mutex);
    if (!emu_faulted.load()) return 0;
    snprintf(out, size, "%s", emu_fault_text);
    emu_faulted.store(false);
    return 1;
}

// ---- alignment ---------------------------------------------------------------------------------

inline void emu_check_align(const void* p, unsigned long align, const char* what) {
    if ((uintptr_t)p % align)
        emu_fault("%s at address %p, which is not a multiple of %lu: a misaligned address on the GPU", what, p,
                  align);
}

// -fsanitize=alignment calls this (GCC's and LLVM's UBSan ABI, "type mismatch" v1) before a typed
// access at an address that is not a multiple of the type's alignment: a fault, reported with the
// source line of the access. (No libubsan: tests/cudaemu.py links without it.)
struct emu_ubsan_location {
    const char* file;
    unsigned line, column;
};
struct emu_ubsan_type {
    unsigned short kind, info;
    char name[1];
};
struct emu_ubsan_mismatch {
    emu_ubsan_location loc;
    const emu_ubsan_type* type;
    unsigned char log_alignment, check_kind;
};
extern "C" __attribute__((visibility("hidden"))) void __ubsan_handle_type_mismatch_v1(emu_ubsan_mismatch* d,
                                                                                      uintptr_t p) {
    static const char* const kinds[] = {"load of", "store to", "reference binding to", "member access within",
                                        "member call on", "constructor call on", "downcast of", "downcast of",
                                        "upcast of", "cast to virtual base of"};
    const char* kind = d->check_kind < sizeof kinds / sizeof kinds[0] ? kinds[d->check_kind] : "access to";
    emu_fault("%s misaligned address %#lx for type %s, which requires %u-byte alignment: a misaligned address "
              "on the GPU (%s:%u)", kind, (unsigned long)p, d->type->name, 1u << d->log_alignment, d->loc.file,
              d->loc.line);
}
extern "C" __attribute__((visibility("hidden"))) void __ubsan_handle_type_mismatch_v1_abort(emu_ubsan_mismatch* d,
                                                                                            uintptr_t p) {
    __ubsan_handle_type_mismatch_v1(d, p);
}

// ---- shared memory -----------------------------------------------------------------------------

#define EMU_SHARED_POISON 0xFF

struct emu_shared_range {
    void* p;
    unsigned long n;
};
inline std::mutex emu_shared_mutex;
inline std::vector<emu_shared_range> emu_shared_ranges;

// Registers one __shared__ variable (poisoned now: this is the first time its declaration runs).
struct emu_shared_reg {
    emu_shared_reg(void* p, unsigned long n) {
        std::lock_guard<std::mutex> lock(emu_shared_mutex);
        memset(p, EMU_SHARED_POISON, n);
        emu_shared_ranges.push_back({p, n});
    }
};
#define EMU_SHARED(name) static emu_shared_reg emu_shared_reg_##name((void*)&(name), sizeof(name))

inline void emu_poison_shared() {
    std::lock_guard<std::mutex> lock(emu_shared_mutex);
    for (const emu_shared_range& r : emu_shared_ranges) memset(r.p, EMU_SHARED_POISON, r.n);
}

// ---- floating point: the GPU's flush to zero ---------------------------------------------------

constexpr unsigned EMU_MXCSR_FTZ_DAZ = 0x8040u;  // FTZ (bit 15): flush results; DAZ (bit 6): inputs

inline void emu_set_ftz(bool ftz) {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(ftz ? (csr | EMU_MXCSR_FTZ_DAZ) : (csr & ~EMU_MXCSR_FTZ_DAZ));
}

// fp32 arithmetic in this scope flushes (ftz) or keeps gradual underflow; the thread's mode after.
struct emu_fp_scope {
    unsigned saved;
    explicit emu_fp_scope(bool ftz) : saved(_mm_getcsr()) { emu_set_ftz(ftz); }
    ~emu_fp_scope() { _mm_setcsr(saved); }
};

// An optimisation barrier for fp values around an emu_fp_scope: GCC assumes the default floating-
// point environment (no -frounding-math), so it would move arithmetic across an MXCSR change or
// reuse a result computed under the other mode. Each value passes through an empty asm volatile
// after the mode changes (so what is computed from it comes after), or before the mode is
// restored (so it is computed before).
inline void emu_fp_fence(float& a) { asm volatile("" : "+x"(a)); }
inline void emu_fp_fence(float& a, float& b, float& c) { asm volatile("" : "+x"(a), "+x"(b), "+x"(c)); }

inline bool emu_is_subnormal(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
}

// fma.rn.f32 without .ftz (gc_fmaf): IEEE, gradual underflow, in either mode. Under FTZ the CPU's
// fma gives the IEEE result unless an input is subnormal or the result was flushed (a nonzero
// result is one gradual underflow gives too: x86 flushes only what rounds below 2^-126, and the
// products of a zero factor are exact): those few are recomputed without FTZ.
inline float emu_fmaf_ieee(float a, float b, float c) {
    const float r = std::fma(a, b, c);
    if (!GC_EMU_FTZ) return r;
    if (!emu_is_subnormal(a) && !emu_is_subnormal(b) && !emu_is_subnormal(c) &&
        (r != 0.0f || a == 0.0f || b == 0.0f))
        return r;
    emu_fp_scope ieee(false);
    emu_fp_fence(a, b, c);  // the compiler knows nothing of MXCSR: without these, it reuses r
    float exact = std::fma(a, b, c);
    emu_fp_fence(exact);
    return exact;
}

// ---- the device API ----------------------------------------------------------------------------

inline void __syncthreads() {
    emu_block_barrier->arrive_and_wait();
    emu_checkpoint();
}
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
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }  // fma.rn(.ftz).f32
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
template <class T> inline T __ldg(const T* p) { return *p; }

// ---- warp-collective operations --------------------------------------------------------------

inline void emu_check_mask(unsigned mask, const char* what) {
    const unsigned lanes = emu_warp->lanes;
    const unsigned present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    if (mask != 0xffffffffu && mask != present)
        emu_fault("%s with mask %#x in a warp of %u lanes: only full-warp masks are emulated", what, mask, lanes);
}

// Publish `n` 32-bit words of this lane, wait for the warp; the warp's words of this operation.
inline const unsigned (*emu_warp_exchange(unsigned mask, const char* what, const unsigned* words, int n))[emu_warp_state::WORDS] {
    emu_check_mask(mask, what);
    emu_warp_state& w = *emu_warp;
    const unsigned par = emu_warp_parity;
    emu_warp_parity ^= 1u;
    memcpy(w.slot[par][emu_lane], words, sizeof(unsigned) * (size_t)n);
    w.bar.arrive_and_wait();
    emu_checkpoint();
    return w.slot[par];
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_check_mask(mask, "__syncwarp");
    emu_warp->bar.arrive_and_wait();
    emu_checkpoint();
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
    if (width < 1 || width > 32 || (width & (width - 1)))
        emu_fault("%s with width %d (a power of 2 up to 32)", what, width);
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
// hardware's alike. The instruction has no .ftz: subnormal inputs, c and results are kept, so the
// arithmetic runs without the thread's flush to zero.
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
    if (emu_warp->lanes != 32) emu_fault("mma.sync in a partial warp of %u lanes", emu_warp->lanes);
    const unsigned words[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const auto all = emu_warp_exchange(0xffffffffu, "mma.sync.m16n8k16", words, 6);
    const unsigned g = emu_lane / 4, t = emu_lane % 4;
    float out[4];
    {
        emu_fp_scope ieee(false);  // no emu_fault in here
        asm volatile("" : : "m"(all[0][0]), "m"(c) : "memory");  // loads of the operands: after
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
        asm volatile("" : "+m"(out) : : "memory");  // computed before the mode is restored
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
// then picks its elements (16-bit moves only: no arithmetic, so the FTZ mode does not matter). A
// misaligned row address, a partial warp or another `num` is a fault of the launch.
inline void emu_ldmatrix(unsigned num, bool trans, unsigned* r, const void* row) {
    const char* what = trans ? "ldmatrix.trans" : "ldmatrix";
    if (num != 1 && num != 2 && num != 4) emu_fault("%s.x%u: only .x1, .x2 and .x4 exist", what, num);
    if (emu_warp->lanes != 32) emu_fault("%s in a partial warp of %u lanes", what, emu_warp->lanes);
    unsigned words[4] = {0, 0, 0, 0};
    if (emu_lane < 8 * num) {
        emu_check_align(row, 16, trans ? "ldmatrix.trans: a row address" : "ldmatrix: a row address");
        memcpy(words, row, 16);  // read where it is, as the lanes meet: unwritten shared memory is poison
    }
    const auto all = emu_warp_exchange(0xffffffffu, what, words, 4);
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

// ---- launches ----------------------------------------------------------------------------------

inline unsigned long long emu_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// GPUCHECK_EMU_SEED: a number (C syntax: 0x... for hex), or "grid". Unset: seed 0. Anything else
// is a fault of the launch.
inline bool emu_read_block_order(emu_block_order& out) {
    const char* s = getenv("GPUCHECK_EMU_SEED");
    out = emu_block_order{true, 0};
    if (!s || !*s) return true;
    if (!strcmp(s, "grid")) {
        out.shuffled = false;
        return true;
    }
    char* end = nullptr;
    out.seed = strtoull(s, &end, 0);
    return *end == '\0';
}

// The linear block indices (x fastest) in the order they run.
inline std::vector<unsigned> emu_block_sequence(dim3 grid, const emu_block_order& ord) {
    const unsigned n = grid.x * grid.y * grid.z;
    std::vector<unsigned> seq(n);
    for (unsigned i = 0; i < n; ++i) seq[i] = i;
    if (!ord.shuffled) return seq;
    const unsigned long long key =
        emu_mix64(ord.seed + 0x9E3779B97F4A7C15ull * (1ull + grid.x + ((unsigned long long)grid.y << 21) +
                                                      ((unsigned long long)grid.z << 42)));
    for (unsigned i = n; i > 1; --i) {  // Fisher-Yates
        const unsigned j = (unsigned)(emu_mix64(key + 0x9E3779B97F4A7C15ull * i) % i);
        std::swap(seq[i - 1], seq[j]);
    }
    return seq;
}

// One block of `block` threads running `body` as block (bx, by, bz).
template <class F> void emu_run_block(dim3 block, unsigned bx, unsigned by, unsigned bz, F& body) {
    const unsigned nt = block.x * block.y * block.z;
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
            emu_set_ftz(GC_EMU_FTZ);
            std::jmp_buf start;
            emu_thread_exit = &start;
            if (setjmp(start) == 0) body();
            emu_thread_exit = nullptr;
            bar.arrive_and_drop();
            emu_warp->bar.arrive_and_drop();
        });
    for (auto& th : threads) th.join();
}

// Run `body` (a call of the kernel) as a grid of blocks of threads, the blocks one at a time in
// the shuffled order, each with freshly poisoned shared memory.
template <class F> void emu_launch(dim3 grid, dim3 block, F body) {
    if (emu_faulted.load()) return;  // an earlier launch of this launcher call faulted
    gridDim = grid;
    blockDim = block;
    if (!emu_read_block_order(emu_order_now)) {
        emu_fault_record("GPUCHECK_EMU_SEED is neither a number nor \"grid\"");
        return;
    }
    const std::vector<unsigned> seq = emu_block_sequence(grid, emu_order_now);
    for (unsigned i = 0; i < seq.size() && !emu_faulted.load(); ++i) {
        const unsigned lin = seq[i];
        emu_block_position = i;
        emu_poison_shared();
        emu_run_block(block, lin % grid.x, (lin / grid.x) % grid.y, lin / (grid.x * grid.y), body);
    }
}

#define EMU_LAUNCH_PARAMS unsigned emu_gx, unsigned emu_gy, unsigned emu_gz, unsigned emu_bx, unsigned emu_by, unsigned emu_bz
#define EMU_LAUNCH(call) emu_launch(dim3(emu_gx, emu_gy, emu_gz), dim3(emu_bx, emu_by, emu_bz), [&] { call; })
