// HBM pattern test kernels (check eud.memtest). Definitions: gpucheck/eud/patterns.py.
//
// A word is a 64-bit unsigned value; `base` is the region word index of a chunk's first word, so
// word i of a chunk is region word w = base + i at region byte offset 8 * w. The kernels move 16
// bytes (two words) per access: `mt_u128` unit u of a chunk holds words 2u (lo) and 2u + 1 (hi).
// Every chunk holds an even number of words and starts 16-byte aligned (cudaMalloc: 256 bytes),
// and offsets within a chunk are 32-bit: the host keeps n16 <= 2^30 units (16 GiB) per chunk and
// gridDim.x * blockDim.x <= 2^28 threads, so no 32-bit index below can wrap.
//
// One kernel per pattern family, no per-word switch: the family is a template parameter, and each
// family's value of word w depends on two parameters (p0, p1) only. gpucheck.eud.patterns
// .kernel_pattern maps every pattern to its family and parameters (and an XOR the host folds
// into xexp / xwrite):
//   pair     w even: p0, w odd: p1       zeros, ones, checkerboard, checkerboard-inv
//   walk     1 << (w mod 64)             walking-ones (walking-zeros: XOR ~0)
//   address  8 * w                       address (its complement step: XOR ~0)
//   random   gc_mix64(p0, w)             random, moving inversions
//
// memtest_fill_<family>   unit u := (f(w), f(w + 1)) ^ xwrite                (writes only)
// memtest_check_<family>  expect f(w) ^ xexp; count, histogram and record miscompares; with
//                         write_back, write f(w) ^ xwrite back (moving inversions, the address
//                         complement); `descending` sweeps from the top of the chunk down.
//                         MT_UNROLL 16-byte loads per thread are issued before any is compared.
// memtest_scrub           read and rewrite (inverted) every unit of a scratch buffer larger than
//                         the L2 cache: the dirty lines a sweep leaves in L2 are written back and
//                         evicted, so the next sweep's first reads come from HBM.
// memtest_flip            buf[i] ^= mask (one thread): fault injection between a fill and a verify.
//
// Launch grids come from the occupancy API (one wave: every block is resident at once, so a
// grid-stride sweep really moves from one end of the chunk to the other, which moving inversions
// relies on).
//
// Stats (MT_STATS_WORDS uint64 per step, shared by every chunk of the step; [MT_MIN] starts at
// 2^64-1, the rest at 0):
//   [0] miscompared words  [1] record slots claimed  [2] OR of flipped bits
//   [3] lowest error word  [4] highest error word
//   [8 + b]  bit b read 1 where 0 was written     [72 + b] bit b read 0 where 1 was written
// errs: max_errs records of 3 uint64 (word, expected, actual), in the order they were found.
// A miscompare costs native 32-bit shared-memory atomics only (counts, OR halves, chunk-relative
// lowest / highest word, histogram): no 64-bit shared atomics, which compile to compare-and-swap
// loops. Each block folds its totals into the global stats once, with native 64-bit global
// atomics, so a chunk full of errors costs a few shared atomics per word and cannot stall.

#define MT_COUNT 0
#define MT_SLOTS 1
#define MT_OR 2
#define MT_MIN 3
#define MT_MAX 4
#define MT_UP 8
#define MT_DOWN 72
#define MT_STATS_WORDS 136
#define MT_UNROLL 4

struct alignas(16) mt_u128 {
    gc_u64 lo, hi;
};

struct mt_pair {
    gc_u64 even, odd;
    __device__ __forceinline__ gc_u64 at(gc_u64 w) const { return (w & 1ull) ? odd : even; }
};
struct mt_walk {
    gc_u64 unused0, unused1;
    __device__ __forceinline__ gc_u64 at(gc_u64 w) const { return 1ull << (w & 63ull); }
};
struct mt_address {
    gc_u64 unused0, unused1;
    __device__ __forceinline__ gc_u64 at(gc_u64 w) const { return w << 3; }
};
struct mt_random {
    gc_u64 seed, unused1;
    __device__ __forceinline__ gc_u64 at(gc_u64 w) const { return gc_mix64(seed, w); }
};

template <class F>
__device__ __forceinline__ void mt_fill(F f, mt_u128* buf, gc_u32 n16, gc_u64 base, gc_u64 xwrite) {
    const gc_u32 stride = gridDim.x * blockDim.x;
    for (gc_u32 j0 = blockIdx.x * blockDim.x + threadIdx.x; j0 < n16; j0 += MT_UNROLL * stride) {
#pragma unroll
        for (int k = 0; k < MT_UNROLL; ++k) {
            const gc_u32 j = j0 + (gc_u32)k * stride;
            if (j < n16) {
                const gc_u64 w = base + 2ull * j;
                mt_u128 v;
                v.lo = f.at(w) ^ xwrite;
                v.hi = f.at(w + 1ull) ^ xwrite;
                buf[j] = v;
            }
        }
    }
}

// Per-block error totals in shared memory: 32-bit, so every update is a native atomic.
struct mt_block {
    gc_u32 hist[128];  // [b]: bit b 0 -> 1, [64 + b]: bit b 1 -> 0
    gc_u32 count, or_lo, or_hi, lowest, highest, full;
};

// One miscompared word: `rel` is its index within the chunk, w its region index.
__device__ __noinline__ void mt_error(mt_block* s, gc_u32 rel, gc_u64 w, gc_u64 expect, gc_u64 actual,
                                      gc_u64* stats, gc_u64* errs, gc_u32 max_errs) {
    const gc_u64 diff = expect ^ actual;
    atomicAdd(&s->count, 1u);
    atomicOr(&s->or_lo, (gc_u32)diff);
    atomicOr(&s->or_hi, (gc_u32)(diff >> 32));
    atomicMin(&s->lowest, rel);
    atomicMax(&s->highest, rel);
    gc_u64 d = diff;
    while (d) {
        const int b = __ffsll((long long)d) - 1;
        d &= d - 1ull;
        atomicAdd(&s->hist[((expect >> b) & 1ull) ? 64 + b : b], 1u);
    }
    if (*((volatile gc_u32*)&s->full)) return;
    if (*((volatile gc_u64*)&stats[MT_SLOTS]) >= (gc_u64)max_errs) {
        *((volatile gc_u32*)&s->full) = 1u;  // this block stops looking at the global counter
        return;
    }
    const gc_u64 slot = atomicAdd(&stats[MT_SLOTS], 1ull);
    if (slot < (gc_u64)max_errs) {
        errs[3ull * slot] = w;
        errs[3ull * slot + 1ull] = expect;
        errs[3ull * slot + 2ull] = actual;
    } else {
        *((volatile gc_u32*)&s->full) = 1u;
    }
}

template <class F>
__device__ __forceinline__ void mt_check(F f, mt_u128* buf, gc_u32 n16, gc_u64 base, gc_u64 xexp, int write_back,
                                         gc_u64 xwrite, int descending, gc_u64* stats, gc_u64* errs,
                                         gc_u32 max_errs) {
    __shared__ mt_block s;
    for (unsigned t = threadIdx.x; t < 128u; t += blockDim.x) s.hist[t] = 0u;
    if (threadIdx.x == 0) {
        s.count = 0u;
        s.or_lo = 0u;
        s.or_hi = 0u;
        s.lowest = 0xFFFFFFFFu;
        s.highest = 0u;
        s.full = 0u;
    }
    __syncthreads();

    const gc_u32 stride = gridDim.x * blockDim.x;
    for (gc_u32 j0 = blockIdx.x * blockDim.x + threadIdx.x; j0 < n16; j0 += MT_UNROLL * stride) {
        mt_u128 v[MT_UNROLL];
        gc_u32 u[MT_UNROLL];
#pragma unroll
        for (int k = 0; k < MT_UNROLL; ++k) {  // every load issued before the first compare
            const gc_u32 j = j0 + (gc_u32)k * stride;
            u[k] = descending ? n16 - 1u - j : j;
            if (j < n16) v[k] = buf[u[k]];
        }
#pragma unroll
        for (int k = 0; k < MT_UNROLL; ++k) {
            if (j0 + (gc_u32)k * stride < n16) {
                const gc_u64 w = base + 2ull * u[k];
                const gc_u64 p0 = f.at(w), p1 = f.at(w + 1ull);
                const gc_u64 e0 = p0 ^ xexp, e1 = p1 ^ xexp;
                if ((v[k].lo ^ e0) | (v[k].hi ^ e1)) {
                    if (v[k].lo != e0) mt_error(&s, 2u * u[k], w, e0, v[k].lo, stats, errs, max_errs);
                    if (v[k].hi != e1) mt_error(&s, 2u * u[k] + 1u, w + 1ull, e1, v[k].hi, stats, errs, max_errs);
                }
                if (write_back) {
                    mt_u128 o;
                    o.lo = p0 ^ xwrite;
                    o.hi = p1 ^ xwrite;
                    buf[u[k]] = o;
                }
            }
        }
    }
    __syncthreads();
    for (unsigned t = threadIdx.x; t < 128u; t += blockDim.x)
        if (s.hist[t]) atomicAdd(&stats[MT_UP + t], (gc_u64)s.hist[t]);
    if (threadIdx.x == 0 && s.count) {
        atomicAdd(&stats[MT_COUNT], (gc_u64)s.count);
        atomicOr(&stats[MT_OR], ((gc_u64)s.or_hi << 32) | (gc_u64)s.or_lo);
        atomicMin(&stats[MT_MIN], base + (gc_u64)s.lowest);
        atomicMax(&stats[MT_MAX], base + (gc_u64)s.highest);
    }
}

#define MT_FAMILY(NAME, F)                                                                                    \
    extern "C" __global__ void memtest_fill_##NAME(mt_u128* buf, gc_u32 n16, gc_u64 base, gc_u64 p0,          \
                                                   gc_u64 p1, gc_u64 xwrite) {                                \
        mt_fill(F{p0, p1}, buf, n16, base, xwrite);                                                           \
    }                                                                                                         \
    extern "C" __global__ void memtest_check_##NAME(mt_u128* buf, gc_u32 n16, gc_u64 base, gc_u64 p0,         \
                                                    gc_u64 p1, gc_u64 xexp, int write_back, gc_u64 xwrite,    \
                                                    int descending, gc_u64* stats, gc_u64* errs,              \
                                                    gc_u32 max_errs) {                                        \
        mt_check(F{p0, p1}, buf, n16, base, xexp, write_back, xwrite, descending, stats, errs, max_errs);     \
    }

MT_FAMILY(pair, mt_pair)
MT_FAMILY(walk, mt_walk)
MT_FAMILY(address, mt_address)
MT_FAMILY(random, mt_random)

extern "C" __global__ void memtest_scrub(mt_u128* buf, gc_u32 n16) {
    const gc_u32 stride = gridDim.x * blockDim.x;
    for (gc_u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < n16; j += stride) {
        mt_u128 v = buf[j];
        v.lo = ~v.lo;
        v.hi = ~v.hi;
        buf[j] = v;
    }
}

extern "C" __global__ void memtest_flip(gc_u64* buf, gc_u64 i, gc_u64 mask) {
    if (blockIdx.x == 0 && threadIdx.x == 0) buf[i] ^= mask;
}
