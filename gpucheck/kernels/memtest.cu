// HBM pattern test kernels (check eud.memtest). Definitions: gpucheck/eud/patterns.py.
//
// A word is a 64-bit unsigned value; `base` is the region word index of a chunk's first word, so
// word i of a chunk is region word w = base + i at region byte offset 8 * w. mt_word(kind, seed, w)
// is the pattern value; gpucheck.eud.patterns.word_values computes the same in NumPy.
//
// memtest_fill   buf[i] = mt_word(w) ^ xwrite                           (grid-stride, writes only)
// memtest_check  expect mt_word(w) ^ xexp; count, histogram and record miscompares; optionally
//                write mt_word(w) ^ xwrite back (moving inversions); `descending` sweeps from the
//                top of the chunk down. Four words per thread per sweep step, loaded before any
//                is compared, keep enough loads in flight to run at memory speed.
// memtest_flip   buf[i] ^= mask (one thread): fault injection between a fill and a verify.
//
// Stats (MT_STATS_WORDS uint64 per step, shared by every chunk of the step; [MT_MIN] starts at
// 2^64-1, the rest at 0):
//   [0] miscompared words  [1] record slots claimed  [2] OR of flipped bits
//   [3] lowest error word  [4] highest error word
//   [8 + b]  bit b read 1 where 0 was written     [72 + b] bit b read 0 where 1 was written
// errs: max_errs records of 3 uint64 (word, expected, actual), in the order they were found.
// Per-thread totals are folded into shared memory, then once per block into global memory, so a
// region full of errors does not serialise on a few global atomics.

#define MT_COUNT 0
#define MT_SLOTS 1
#define MT_OR 2
#define MT_MIN 3
#define MT_MAX 4
#define MT_UP 8
#define MT_DOWN 72
#define MT_STATS_WORDS 136
#define MT_UNROLL 4

__device__ __forceinline__ gc_u64 mt_word(int kind, gc_u64 seed, gc_u64 w) {
    switch (kind) {
        case 0: return 0ull;
        case 1: return ~0ull;
        case 2: return 1ull << (w & 63ull);
        case 3: return ~(1ull << (w & 63ull));
        case 4: return (w & 1ull) ? 0xAAAAAAAAAAAAAAAAull : 0x5555555555555555ull;
        case 5: return (w & 1ull) ? 0x5555555555555555ull : 0xAAAAAAAAAAAAAAAAull;
        case 6: return w << 3;
        default: return gc_mix64(seed, w);
    }
}

extern "C" __global__ void memtest_fill(gc_u64* buf, gc_u64 n, gc_u64 base, int kind, gc_u64 seed,
                                        gc_u64 xwrite) {
    const gc_u64 stride = (gc_u64)gridDim.x * blockDim.x;
    for (gc_u64 i = (gc_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        buf[i] = mt_word(kind, seed, base + i) ^ xwrite;
}

extern "C" __global__ void memtest_check(gc_u64* buf, gc_u64 n, gc_u64 base, int kind, gc_u64 seed,
                                         gc_u64 xexp, int write_back, gc_u64 xwrite, int descending,
                                         gc_u64* stats, gc_u64* errs, gc_u64 max_errs) {
    __shared__ gc_u64 s_hist[128];
    __shared__ gc_u64 s_count;
    __shared__ gc_u64 s_or;
    __shared__ gc_u64 s_min;
    __shared__ gc_u64 s_max;
    for (unsigned t = threadIdx.x; t < 128u; t += blockDim.x) s_hist[t] = 0ull;
    if (threadIdx.x == 0) {
        s_count = 0ull;
        s_or = 0ull;
        s_min = ~0ull;
        s_max = 0ull;
    }
    __syncthreads();

    gc_u64 count = 0ull, orb = 0ull, mn = ~0ull, mx = 0ull;
    const gc_u64 stride = (gc_u64)gridDim.x * blockDim.x;
    for (gc_u64 j0 = (gc_u64)blockIdx.x * blockDim.x + threadIdx.x; j0 < n; j0 += MT_UNROLL * stride) {
        gc_u64 v[MT_UNROLL];
        gc_u64 idx[MT_UNROLL];
#pragma unroll
        for (int k = 0; k < MT_UNROLL; ++k) {
            const gc_u64 j = j0 + (gc_u64)k * stride;
            idx[k] = descending ? n - 1ull - j : j;
            v[k] = j < n ? buf[idx[k]] : 0ull;
        }
#pragma unroll
        for (int k = 0; k < MT_UNROLL; ++k) {
            if (j0 + (gc_u64)k * stride < n) {
                const gc_u64 w = base + idx[k];
                const gc_u64 pat = mt_word(kind, seed, w);
                const gc_u64 expect = pat ^ xexp;
                const gc_u64 diff = v[k] ^ expect;
                if (diff) {
                    count += 1ull;
                    orb |= diff;
                    mn = w < mn ? w : mn;
                    mx = w > mx ? w : mx;
                    gc_u64 d = diff;
                    while (d) {
                        const int b = __ffsll((long long)d) - 1;
                        d &= d - 1ull;
                        atomicAdd(&s_hist[((expect >> b) & 1ull) ? 64 + b : b], 1ull);
                    }
                    if (*((volatile gc_u64*)&stats[MT_SLOTS]) < max_errs) {
                        const gc_u64 slot = atomicAdd(&stats[MT_SLOTS], 1ull);
                        if (slot < max_errs) {
                            errs[3ull * slot] = w;
                            errs[3ull * slot + 1ull] = expect;
                            errs[3ull * slot + 2ull] = v[k];
                        }
                    }
                }
                if (write_back) buf[idx[k]] = pat ^ xwrite;
            }
        }
    }
    if (count) {
        atomicAdd(&s_count, count);
        atomicOr(&s_or, orb);
        atomicMin(&s_min, mn);
        atomicMax(&s_max, mx);
    }
    __syncthreads();
    for (unsigned t = threadIdx.x; t < 128u; t += blockDim.x)
        if (s_hist[t]) atomicAdd(&stats[MT_UP + t], s_hist[t]);
    if (threadIdx.x == 0 && s_count) {
        atomicAdd(&stats[MT_COUNT], s_count);
        atomicOr(&stats[MT_OR], s_or);
        atomicMin(&stats[MT_MIN], s_min);
        atomicMax(&stats[MT_MAX], s_max);
    }
}

extern "C" __global__ void memtest_flip(gc_u64* buf, gc_u64 i, gc_u64 mask) {
    if (blockIdx.x == 0 && threadIdx.x == 0) buf[i] ^= mask;
}
