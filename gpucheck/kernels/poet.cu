// POET block-orthogonal kernels (gpucheck.poet; docs/poet.md).
//
// (1) poet_bd_apply_<dtype>: Y = A[:, in_idx] . BD(G)   (or . BD(G)^T with transpose=1) for all k
//     blocks at once, with the permutation gather of the input columns fused into the tile load and
//     an optional scatter of the output columns (Y[:, out_idx[c]] = result column c).
//     A is read through strides (x_rs, x_cs), Y is written through (y_rs, y_cs): a transposed
//     operand or result costs nothing extra. A null in_idx / out_idx is the identity.
// (2) poet_cnp_step_<dtype>: one Horner step of the Cayley-Neumann construction of all blocks,
//     OUT_j = c I + Q_j H_j, with H_j = 2I + Q_j on the first step (H ignored). Three steps give
//     G = I + Q(2I + Q(2I + Q(2I + Q))) = I + 2Q + 2Q^2 + 2Q^3 + Q^4: the first two write fp32
//     scratch (the _f32 entry), the last one writes the storage dtype.
// (3) poet_bd_mma_<bf16|f16>: the same operation as (1) with the same arguments, on tensor cores
//     (mma.sync m16n8k16, fp32 accumulation; sm_80 and later): the independent second unit the
//     POET invariants compare (1) with. fp32 has no tensor-core path (it stays on (1)).
//
// (1) and (2) are tiled matmuls on static shared memory with fp32 FMA accumulation (gc_fmaf:
// fma.rn.f32, rounded exactly as the emulation rounds, and with gradual underflow although CuPy
// compiles with -ftz=true: gpucheck.poet.bounds' floor counts on it); loads and stores of the
// storage dtype go through gc_load / gc_store. 256 threads per block (POET_THREADS); a thread
// owns RM x 4 outputs.
// Grid: bd_apply (k * b/32, ceil(m/128)); cnp_step (k * b/32, ceil(b/64)); bd_mma (k, ceil(m/64)),
// 128 threads. Every kernel has a fixed reduction order: the same inputs give the same bits.

#define POET_TN 32
#define POET_TK 32
#define POET_THREADS 256
#define POET_BD_TM 128
#define POET_CNP_TM 64

// C[TM x 32] += A[TM x K] . B[K x 32] for the tile of this thread block; A and B come through
// loaders: la(r, kk) is A(row r of the tile, inner index kk); lb(kk, c) is B(inner kk, column c of
// the tile); lb.by_column says which index the loader wants to vary fastest (coalescing).
template <int TM, class LoadA, class LoadB>
__device__ __forceinline__ void poet_tile_mm(const LoadA& la, const LoadB& lb, int K,
                                             float (&acc)[TM / 32][4]) {
    __shared__ float As[POET_TK][TM + 1];
    __shared__ float Bs[POET_TK][POET_TN + 1];
    const int t = threadIdx.x;
    const int tx = t % 8, ty = t / 8;
    const int RM = TM / 32;
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += POET_TK) {
        for (int e = t; e < TM * POET_TK; e += POET_THREADS) {
            const int r = e / POET_TK, kk = e % POET_TK;
            As[kk][r] = la(r, k0 + kk);
        }
        for (int e = t; e < POET_TK * POET_TN; e += POET_THREADS) {
            int kk, c;
            if (lb.by_column) { c = e / POET_TK; kk = e % POET_TK; }
            else { kk = e / POET_TN; c = e % POET_TN; }
            Bs[kk][c] = lb(k0 + kk, c);
        }
        __syncthreads();
        for (int kk = 0; kk < POET_TK; ++kk) {
            float a[TM / 32];
            float bv[4];
            for (int i = 0; i < RM; ++i) a[i] = As[kk][ty * RM + i];
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx * 4 + j];
            for (int i = 0; i < RM; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = gc_fmaf(a[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
}

// ---- (1) block-diagonal apply -------------------------------------------------------------------

template <class T>
struct poet_bd_load_x {
    const typename T::storage* X;
    gc_i64 rs, cs;
    const int* in_idx;
    int m, row0, colbase;  // colbase = blk * b: first logical input column of the block
    __device__ float operator()(int r, int kk) const {
        const int row = row0 + r;
        if (row >= m) return 0.0f;
        const int lc = colbase + kk;
        const int src = in_idx ? in_idx[lc] : lc;
        return gc_load(X + (gc_i64)row * rs + (gc_i64)src * cs, T());
    }
};

template <class T>
struct poet_bd_load_g {
    const typename T::storage* G;  // this block's b x b matrix
    int b, col0, transpose;
    bool by_column;
    __device__ float operator()(int kk, int c) const {
        const int cc = col0 + c;
        return transpose ? gc_load(G + (gc_i64)cc * b + kk, T()) : gc_load(G + (gc_i64)kk * b + cc, T());
    }
};

template <class T>
__device__ __forceinline__ void poet_bd_apply_impl(
    const typename T::storage* __restrict__ X, gc_i64 x_rs, gc_i64 x_cs,
    const typename T::storage* __restrict__ G,
    typename T::storage* __restrict__ Y, gc_i64 y_rs, gc_i64 y_cs,
    const int* __restrict__ in_idx, const int* __restrict__ out_idx,
    int m, int b, int k, int transpose) {
    const int tiles_per_block = b / POET_TN;
    const int blk = blockIdx.x / tiles_per_block;
    const int col0 = (blockIdx.x % tiles_per_block) * POET_TN;
    const int row0 = blockIdx.y * POET_BD_TM;
    poet_bd_load_x<T> la;
    la.X = X; la.rs = x_rs; la.cs = x_cs; la.in_idx = in_idx; la.m = m; la.row0 = row0; la.colbase = blk * b;
    poet_bd_load_g<T> lb;
    lb.G = G + (gc_i64)blk * b * b; lb.b = b; lb.col0 = col0; lb.transpose = transpose;
    lb.by_column = transpose != 0;
    float acc[POET_BD_TM / 32][4];
    poet_tile_mm<POET_BD_TM>(la, lb, b, acc);
    const int t = threadIdx.x;
    const int tx = t % 8, ty = t / 8;
    const int RM = POET_BD_TM / 32;
    for (int i = 0; i < RM; ++i) {
        const int row = row0 + ty * RM + i;
        if (row < m) {
            for (int j = 0; j < 4; ++j) {
                const int lc = blk * b + col0 + tx * 4 + j;
                const int dst = out_idx ? out_idx[lc] : lc;
                gc_store(Y + (gc_i64)row * y_rs + (gc_i64)dst * y_cs, acc[i][j], T());
            }
        }
    }
}

#define POET_BD_ENTRY(NAME, TAG)                                                                      \
    extern "C" __global__ void __launch_bounds__(POET_THREADS) NAME(                                  \
        const TAG::storage* X, gc_i64 x_rs, gc_i64 x_cs, const TAG::storage* G, TAG::storage* Y,      \
        gc_i64 y_rs, gc_i64 y_cs, const int* in_idx, const int* out_idx, int m, int b, int k,         \
        int transpose) {                                                                              \
        poet_bd_apply_impl<TAG>(X, x_rs, x_cs, G, Y, y_rs, y_cs, in_idx, out_idx, m, b, k, transpose); \
    }

POET_BD_ENTRY(poet_bd_apply_f32, gc_f32)
POET_BD_ENTRY(poet_bd_apply_bf16, gc_bf16)
POET_BD_ENTRY(poet_bd_apply_f16, gc_f16)

// ---- (2) Cayley-Neumann construction, one Horner step -------------------------------------------

struct poet_cnp_load_q {
    const float* Q;  // this block
    int b, row0;
    __device__ float operator()(int r, int kk) const {
        const int row = row0 + r;
        return row < b ? Q[(gc_i64)row * b + kk] : 0.0f;
    }
};

struct poet_cnp_load_h {
    const float* Q;  // this block (first step: H = 2I + Q)
    const float* H;  // this block (later steps)
    int b, col0, first;
    bool by_column;
    __device__ float operator()(int kk, int c) const {
        const int cc = col0 + c;
        if (first) {
            const float q = Q[(gc_i64)kk * b + cc];
            return kk == cc ? q + 2.0f : q;
        }
        return H[(gc_i64)kk * b + cc];
    }
};

template <class T>
__device__ __forceinline__ void poet_cnp_step_impl(const float* __restrict__ Q, const float* __restrict__ H,
                                                   typename T::storage* __restrict__ out, int b, int k,
                                                   float c, int first) {
    const int tiles_per_block = b / POET_TN;
    const int blk = blockIdx.x / tiles_per_block;
    const int col0 = (blockIdx.x % tiles_per_block) * POET_TN;
    const int row0 = blockIdx.y * POET_CNP_TM;
    const gc_i64 off = (gc_i64)blk * b * b;
    poet_cnp_load_q la;
    la.Q = Q + off; la.b = b; la.row0 = row0;
    poet_cnp_load_h lb;
    lb.Q = Q + off; lb.H = first ? Q : H + off; lb.b = b; lb.col0 = col0; lb.first = first; lb.by_column = false;
    float acc[POET_CNP_TM / 32][4];
    poet_tile_mm<POET_CNP_TM>(la, lb, b, acc);
    const int t = threadIdx.x;
    const int tx = t % 8, ty = t / 8;
    const int RM = POET_CNP_TM / 32;
    for (int i = 0; i < RM; ++i) {
        const int row = row0 + ty * RM + i;
        if (row < b) {
            for (int j = 0; j < 4; ++j) {
                const int col = col0 + tx * 4 + j;
                const float v = row == col ? acc[i][j] + c : acc[i][j];
                gc_store(out + off + (gc_i64)row * b + col, v, T());
            }
        }
    }
}

#define POET_CNP_ENTRY(NAME, TAG)                                                                \
    extern "C" __global__ void __launch_bounds__(POET_THREADS) NAME(                             \
        const float* Q, const float* H, TAG::storage* out, int b, int k, float c, int first) {  \
        poet_cnp_step_impl<TAG>(Q, H, out, b, k, c, first);                                      \
    }

POET_CNP_ENTRY(poet_cnp_step_f32, gc_f32)
POET_CNP_ENTRY(poet_cnp_step_bf16, gc_bf16)
POET_CNP_ENTRY(poet_cnp_step_f16, gc_f16)

// ---- (3) block-diagonal apply on tensor cores ---------------------------------------------------
//
// b: a multiple of 32 up to POET_MMA_BMAX (checked by gpucheck.poet.cupy_ops.bd_plan).
// One thread block = one diagonal block j (blockIdx.x) x POET_MMA_TM rows (blockIdx.y). It stages
// the block's input and output indices in shared memory, gathers its operand stripe
// A[row0 .. row0 + TM, in_idx[j b .. j b + b]] once into shared memory (raw 16-bit values, 16-byte
// vector loads where the columns are contiguous and aligned; along the rows for a transposed
// operand, so that loads coalesce either way), then computes all b output columns from it in
// passes of POET_MMA_TN columns: per pass, G's columns are staged in chunks of POET_MMA_KC inner
// indices as B(k, n) = [n][k] (the column-major B fragment is then one 32-bit load), and each warp
// accumulates its 16 rows x 32 columns with mma.sync over the inner dimension in k order (fixed:
// the result is deterministic). Results are rounded once to the storage dtype (gc_f32_to_*), as
// (1) does, and written through out_idx (pairs of columns as one 32-bit store when there is no
// scatter and the rows are contiguous).
// Shared rows are padded by 8 elements (16 bytes): the fragment loads of the 8 groups x 4 threads
// of a warp hit 32 different banks for every b.

#define POET_MMA_THREADS 128
#define POET_MMA_TM 64
#define POET_MMA_TN 32
#define POET_MMA_KC 64
#define POET_MMA_BMAX 256
#define POET_MMA_PAD 8

struct alignas(16) poet_mma_smem {
    gc_u16 xs[POET_MMA_TM][POET_MMA_BMAX + POET_MMA_PAD];  // the gathered operand stripe
    gc_u16 gs[POET_MMA_TN][POET_MMA_KC + POET_MMA_PAD];    // B(k0 + kk, c0 + n) at [n][kk]
    int in_s[POET_MMA_BMAX];                               // in_idx of the block's b columns
    int out_s[POET_MMA_BMAX];                              // out_idx of the block's b columns
};

__device__ __forceinline__ gc_u16 poet_bits(float v, gc_bf16) { return gc_f32_to_bf16(v); }
__device__ __forceinline__ gc_u16 poet_bits(float v, gc_f16) { return gc_f32_to_f16(v); }

// xs[r][kk] = A(row0 + r, in_s[kk]) for r < TM, kk < b (0 for rows >= m). Each thread issues a
// batch of independent loads before it stores any (POET_MMA_BATCH 16-bit values, or 2 vectors),
// so that enough loads are in flight to hide memory latency; TM * b is a multiple of the batch
// times the thread count for every b that is a multiple of 32 (64 b / (128 * 8) = b / 16).
#define POET_MMA_BATCH 8
__device__ __forceinline__ void poet_mma_gather_scalar(poet_mma_smem& sm, const gc_u16* __restrict__ X,
                                                       gc_i64 x_rs, gc_i64 x_cs, int m, int row0, int b) {
    const bool by_rows = x_rs == 1;  // a transposed operand: rows adjacent in memory vary fastest
    for (int e0 = threadIdx.x; e0 < POET_MMA_TM * b; e0 += POET_MMA_BATCH * POET_MMA_THREADS) {
        gc_u16 val[POET_MMA_BATCH];
        for (int u = 0; u < POET_MMA_BATCH; ++u) {
            const int e = e0 + u * POET_MMA_THREADS;
            const int r = by_rows ? e % POET_MMA_TM : e / b, kk = by_rows ? e / POET_MMA_TM : e % b;
            const int row = row0 + r;
            val[u] = row < m ? X[(gc_i64)row * x_rs + (gc_i64)sm.in_s[kk] * x_cs] : (gc_u16)0;
        }
        for (int u = 0; u < POET_MMA_BATCH; ++u) {
            const int e = e0 + u * POET_MMA_THREADS;
            const int r = by_rows ? e % POET_MMA_TM : e / b, kk = by_rows ? e / POET_MMA_TM : e % b;
            sm.xs[r][kk] = val[u];
        }
    }
}

__device__ __forceinline__ void poet_mma_gather(poet_mma_smem& sm, const gc_u16* __restrict__ X, gc_i64 x_rs,
                                                gc_i64 x_cs, bool contiguous, int m, int row0, int colbase,
                                                int b) {
    const int tid = threadIdx.x;
    if (contiguous) {  // no gather, unit column stride, 16-byte aligned rows: 8 columns per load
        const int per_row = b >> 3;
        for (int e0 = tid; e0 < POET_MMA_TM * per_row; e0 += 2 * POET_MMA_THREADS) {
            gc_v16 val[2];
            for (int u = 0; u < 2; ++u) {
                const int e = e0 + u * POET_MMA_THREADS, r = e / per_row, v = e - r * per_row;
                const int row = row0 + r;
                val[u] = gc_v16{{0u, 0u, 0u, 0u}};
                if (row < m) val[u] = gc_ld_v16(X + (gc_i64)row * x_rs + colbase + 8 * v);
            }
            for (int u = 0; u < 2; ++u) {
                const int e = e0 + u * POET_MMA_THREADS, r = e / per_row, v = e - r * per_row;
                gc_st_v16(&sm.xs[r][8 * v], val[u]);
            }
        }
    } else {
        // a transposed operand (x_rs == 1): consecutive rows are adjacent in memory, so rows vary
        // fastest across the threads; otherwise the block's columns do
        poet_mma_gather_scalar(sm, X, x_rs, x_cs, m, row0, b);
    }
}

// gs[n][kk] = B(k0 + kk, c0 + n) for n < TN, kk < kc, with B = G (or G^T with transpose).
__device__ __forceinline__ void poet_mma_stage_g(poet_mma_smem& sm, const gc_u16* __restrict__ G, int b,
                                                 int transpose, bool aligned, int c0, int k0, int kc) {
    const int tid = threadIdx.x;
    const int vecs = kc >> 3;  // 8-element pieces per staged row
    if (aligned && transpose) {  // B(k, n) = G[n][k]: rows of G, contiguous along k
        for (int e = tid; e < POET_MMA_TN * vecs; e += POET_MMA_THREADS) {
            const int n = e / vecs, v = e - n * vecs;
            gc_st_v16(&sm.gs[n][8 * v], gc_ld_v16(G + (gc_i64)(c0 + n) * b + k0 + 8 * v));
        }
    } else if (aligned) {  // B(k, n) = G[k][n]: contiguous along n, transposed into [n][k]
        for (int e = tid; e < kc * (POET_MMA_TN / 8); e += POET_MMA_THREADS) {
            const int kk = e / (POET_MMA_TN / 8), v = e % (POET_MMA_TN / 8);
            const gc_v16 val = gc_ld_v16(G + (gc_i64)(k0 + kk) * b + c0 + 8 * v);
            for (int i = 0; i < 4; ++i) {
                sm.gs[8 * v + 2 * i][kk] = (gc_u16)(val.w[i] & 0xffffu);
                sm.gs[8 * v + 2 * i + 1][kk] = (gc_u16)(val.w[i] >> 16);
            }
        }
    } else {
        for (int e = tid; e < POET_MMA_TN * kc; e += POET_MMA_THREADS) {
            const int n = e / kc, kk = e - n * kc;
            sm.gs[n][kk] = transpose ? G[(gc_i64)(c0 + n) * b + k0 + kk] : G[(gc_i64)(k0 + kk) * b + c0 + n];
        }
    }
}

// One pass: acc (this warp's 16 rows x 32 columns c0 .. c0 + 31) = stripe . B[:, c0 .. c0 + 31].
template <class T>
__device__ __forceinline__ void poet_mma_pass(poet_mma_smem& sm, const gc_u16* __restrict__ G, int b,
                                              int transpose, bool g_aligned, int c0, float (&acc)[4][4]) {
    const int lane = threadIdx.x % 32, r0 = (threadIdx.x / 32) * 16;
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < b; k0 += POET_MMA_KC) {
        const int kc = b - k0 < POET_MMA_KC ? b - k0 : POET_MMA_KC;
        poet_mma_stage_g(sm, G, b, transpose, g_aligned, c0, k0, kc);
        __syncthreads();
        for (int ks = 0; ks < kc; ks += 16) {
            const gc_u16* x0 = &sm.xs[r0 + g][k0 + ks + 2 * t];
            const gc_u16* x1 = &sm.xs[r0 + g + 8][k0 + ks + 2 * t];
            const gc_u32 a[4] = {gc_ld_u32(x0), gc_ld_u32(x1), gc_ld_u32(x0 + 8), gc_ld_u32(x1 + 8)};
            for (int nt = 0; nt < 4; ++nt) {
                const gc_u16* gp = &sm.gs[nt * 8 + g][ks + 2 * t];
                const gc_u32 bf[2] = {gc_ld_u32(gp), gc_ld_u32(gp + 8)};
                gc_mma_16816(acc[nt], a, bf, acc[nt], T());
            }
        }
        __syncthreads();
    }
}

template <class T>
__device__ __forceinline__ void poet_bd_mma_impl(
    const gc_u16* __restrict__ X, gc_i64 x_rs, gc_i64 x_cs, const gc_u16* __restrict__ G,
    gc_u16* __restrict__ Y, gc_i64 y_rs, gc_i64 y_cs, const int* __restrict__ in_idx,
    const int* __restrict__ out_idx, int m, int b, int k, int transpose) {
    __shared__ poet_mma_smem sm;
    const int tid = threadIdx.x;
    const int blk = blockIdx.x, row0 = blockIdx.y * POET_MMA_TM, colbase = blk * b;
    const gc_u16* Gb = G + (gc_i64)blk * b * b;
    for (int i = tid; i < b; i += POET_MMA_THREADS) {
        sm.in_s[i] = in_idx ? in_idx[colbase + i] : colbase + i;
        sm.out_s[i] = out_idx ? out_idx[colbase + i] : colbase + i;
    }
    __syncthreads();
    const bool x_vec = !in_idx && x_cs == 1 && (x_rs & 7) == 0 && ((gc_u64)X & 15u) == 0;
    poet_mma_gather(sm, X, x_rs, x_cs, x_vec, m, row0, colbase, b);
    const bool g_aligned = ((gc_u64)G & 15u) == 0;
    const bool y_pairs = !out_idx && y_cs == 1 && (y_rs & 1) == 0 && ((gc_u64)Y & 3u) == 0;
    const int lane = tid % 32, r0 = (tid / 32) * 16;
    const int g = lane / 4, t = lane % 4;
    for (int c0 = 0; c0 < b; c0 += POET_MMA_TN) {
        float acc[4][4];
        poet_mma_pass<T>(sm, Gb, b, transpose, g_aligned, c0, acc);  // starts with a barrier: the stripe is in
        for (int nt = 0; nt < 4; ++nt) {
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + r0 + g + 8 * h;
                const int lc = c0 + nt * 8 + 2 * t;  // this lane's two columns lc, lc + 1 of the block
                if (row < m) {
                    const gc_u16 v0 = poet_bits(acc[nt][2 * h], T()), v1 = poet_bits(acc[nt][2 * h + 1], T());
                    if (y_pairs) {
                        gc_st_u32(Y + (gc_i64)row * y_rs + colbase + lc, (gc_u32)v0 | ((gc_u32)v1 << 16));
                    } else {
                        Y[(gc_i64)row * y_rs + (gc_i64)sm.out_s[lc] * y_cs] = v0;
                        Y[(gc_i64)row * y_rs + (gc_i64)sm.out_s[lc + 1] * y_cs] = v1;
                    }
                }
            }
        }
    }
}

#define POET_MMA_ENTRY(NAME, TAG)                                                                     \
    extern "C" __global__ void __launch_bounds__(POET_MMA_THREADS) NAME(                              \
        const TAG::storage* X, gc_i64 x_rs, gc_i64 x_cs, const TAG::storage* G, TAG::storage* Y,      \
        gc_i64 y_rs, gc_i64 y_cs, const int* in_idx, const int* out_idx, int m, int b, int k,         \
        int transpose) {                                                                              \
        poet_bd_mma_impl<TAG>(X, x_rs, x_cs, G, Y, y_rs, y_cs, in_idx, out_idx, m, b, k, transpose);  \
    }

POET_MMA_ENTRY(poet_bd_mma_bf16, gc_bf16)
POET_MMA_ENTRY(poet_bd_mma_f16, gc_f16)
