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
// One thread block = one diagonal block j (blockIdx.x) x POET_MMA_TM rows (blockIdx.y), taken in
// sub-tiles of st rows: st = 64 for b <= 128, 32 above, so that a sub-tile's operand stripe (st x b
// 16-bit values) fits one shared buffer of 64 x (128 + 8) either way. Per sub-tile the block gathers
// its stripe A[rows, in_idx[j b .. j b + b]] once into shared memory (raw 16-bit values: 16-byte
// vector loads where the columns are contiguous and aligned, otherwise two columns per thread and
// tile, 8 loads in flight), then computes all b output columns from it in passes of pw columns
// (pw = 32 when st = 64, 64 when st = 32: a warp owns 16 rows x 32 columns of a pass). Per pass, G
// is staged in chunks of kcm inner indices (64 when st = 64, 32 when st = 32) as it lies in memory,
// a window of G's rows copied 16 bytes at a time: k-major (B(k, n) = G[k][n]) without transpose,
// n-major (B(k, n) = G[n][k]) with it. Each warp accumulates its 16 x 32 outputs with mma.sync over
// the inner dimension in k order (fixed: the result is deterministic), its fragments loaded with
// ldmatrix: per k16 step one gc_ldmatrix_x4 for the A fragment (16 x 16 of the stripe, row-major)
// and two for the B fragments of its four n8 tiles (gc_ldmatrix_x4_trans from a k-major chunk,
// gc_ldmatrix_x4 from an n-major one). Results are rounded once to the storage dtype (gc_f32_to_*),
// as (1) does, and written through out_idx (pairs of columns as one 32-bit store when there is no
// scatter and the rows are contiguous).
// Banks: every shared row is padded by 8 elements (16 bytes), so that its stride (b + 8, pw + 8 or
// kcm + 8 elements) is an odd number of 16-byte units: the 8 rows of an 8 x 8 matrix (one ldmatrix
// phase) lie in 8 different 16-byte bank groups. Stores go in tiles of 8 rows x 4 units (16-byte
// vectors, or 32-bit column pairs) per warp, lane l on row l % 8: a quarter warp's 16-byte stores
// hit 8 rows of one unit, a warp's 32-bit stores 8 rows x 4 words, conflict-free for the same reason
// (tests/test_poet_ldmatrix.py counts the wavefronts of every shared access of the kernel).

#define POET_MMA_THREADS 128
#define POET_MMA_TM 64
#define POET_MMA_TN 32
#define POET_MMA_KC 64
#define POET_MMA_BMAX 256
#define POET_MMA_PAD 8
// resident blocks per SM that __launch_bounds__ caps the registers for: 65536 / (8 x 128) = 64
#define POET_MMA_MIN_BLOCKS 8
#define POET_MMA_WARPS (POET_MMA_THREADS / 32)
// the stripe buffer: 64 rows of up to 128 (+ 8) columns, or 32 rows of up to 256 (+ 8)
#define POET_MMA_XS (POET_MMA_TM * (POET_MMA_BMAX / 2 + POET_MMA_PAD))
// a G chunk: [64][32 + 8] (k-major, st = 64) is the largest of its four shapes
#define POET_MMA_GS (POET_MMA_KC * (POET_MMA_TN + POET_MMA_PAD))
static_assert(POET_MMA_XS >= POET_MMA_TM / 2 * (POET_MMA_BMAX + POET_MMA_PAD), "stripe buffer too small");
static_assert(POET_MMA_GS >= POET_MMA_TN * (POET_MMA_KC + POET_MMA_PAD) &&
                  POET_MMA_GS >= POET_MMA_KC / 2 * (2 * POET_MMA_TN + POET_MMA_PAD) &&
                  POET_MMA_GS >= 2 * POET_MMA_TN * (POET_MMA_KC / 2 + POET_MMA_PAD),
              "G chunk buffer too small");

struct alignas(16) poet_mma_smem {
    gc_u16 xs[POET_MMA_XS];    // the operand stripe of a sub-tile: [st][b + 8]
    gc_u16 gs[POET_MMA_GS];    // a chunk of B: [kc][pw + 8] (k-major) or [pw][kcm + 8] (n-major)
    int in_s[POET_MMA_BMAX];   // in_idx of the block's b columns
    int out_s[POET_MMA_BMAX];  // out_idx of the block's b columns
};

// The shape of the work for block size b, the same in every thread but wr and wc.
struct poet_mma_geom {
    int st;       // rows per sub-tile: 64 (b <= 128) or 32
    int pw;       // output columns per pass: 32 or 64
    int kcm;      // inner indices per staged chunk of G: 64 or 32
    int xs_rs;    // stripe row stride: b + 8
    int gs_rs;    // chunk row stride: pw + 8 (k-major) or kcm + 8 (n-major)
    int wr, wc;   // this warp's first row in the sub-tile and first column in the pass
    bool kmajor;  // B = G, staged k-major and read with ldmatrix .trans; otherwise B = G^T, n-major
};

__device__ __forceinline__ poet_mma_geom poet_mma_geometry(int b, int transpose) {
    poet_mma_geom q;
    q.st = b <= POET_MMA_BMAX / 2 ? POET_MMA_TM : POET_MMA_TM / 2;
    q.pw = POET_MMA_TN * (POET_MMA_TM / q.st);
    q.kcm = POET_MMA_KC * q.st / POET_MMA_TM;
    q.kmajor = transpose == 0;
    q.xs_rs = b + POET_MMA_PAD;
    q.gs_rs = (q.kmajor ? q.pw : q.kcm) + POET_MMA_PAD;
    const int warp = threadIdx.x / 32, row_warps = q.st / 16;
    q.wr = 16 * (warp % row_warps);
    q.wc = POET_MMA_TN * (warp / row_warps);
    return q;
}

// The tiles of a rows x units copy (rows 32 or 64, units a multiple of 4): tile i covers rows
// 8 (i mod rows/8) .. + 7 and units 4 (i div rows/8) .. + 3; lane l takes row l % 8, unit l / 8.
__device__ __forceinline__ void poet_mma_tile_slot(int tile, int rows, int& r, int& u) {
    const int bits = rows > 32 ? 3 : 2, lane = threadIdx.x % 32;
    r = ((tile & ((1 << bits) - 1)) << 3) + lane % 8;
    u = ((tile >> bits) << 2) + lane / 8;
}

// dst[r][8u .. 8u + 7] = src[r][8u .. 8u + 7] for r < rows, u < units (16-byte aligned rows), zeros
// for rows r >= valid: one 16-byte load and store per thread and tile, POET_MMA_VEC tiles in flight.
#define POET_MMA_VEC 4
__device__ __forceinline__ void poet_mma_copy_tiles(gc_u16* dst, int dst_rs, const gc_u16* __restrict__ src,
                                                    gc_i64 src_rs, int rows, int units, int valid) {
    const int tiles = (rows / 8) * (units / 4);
    for (int t0 = threadIdx.x / 32; t0 < tiles; t0 += POET_MMA_VEC * POET_MMA_WARPS) {
        gc_v16 val[POET_MMA_VEC];
        for (int i = 0; i < POET_MMA_VEC; ++i) {
            const int tile = t0 + i * POET_MMA_WARPS;
            int r, u;
            poet_mma_tile_slot(tile, rows, r, u);
            val[i] = gc_v16{{0u, 0u, 0u, 0u}};
            if (tile < tiles && r < valid) val[i] = gc_ld_v16(src + r * src_rs + 8 * u);
        }
        for (int i = 0; i < POET_MMA_VEC; ++i) {
            const int tile = t0 + i * POET_MMA_WARPS;
            int r, u;
            poet_mma_tile_slot(tile, rows, r, u);
            if (tile < tiles) gc_st_v16(dst + r * dst_rs + 8 * u, val[i]);
        }
    }
}

// The stripe without vector loads: xs[r][2p], xs[r][2p + 1] = A(s0 + r, in_s[2p]), A(s0 + r,
// in_s[2p + 1]) as one 32-bit store, the units of the tiles being column pairs p (a transposed
// operand, x_rs = 1, reads 8 adjacent rows per column: coalesced either way). POET_MMA_BATCH tiles
// (8 loads) in flight per thread; a warp's st b / 256 tiles (b / 4 or b / 8) are a multiple of the
// batch for every b that is a multiple of 32. X points at row s0; rows r >= valid are zeros.
#define POET_MMA_BATCH 4
__device__ __forceinline__ void poet_mma_gather_pairs(poet_mma_smem& sm, const poet_mma_geom& q,
                                                      const gc_u16* __restrict__ X, gc_i64 x_rs, gc_i64 x_cs,
                                                      int valid, int b) {
    const int tiles = (q.st / 8) * (b / 8);
    for (int t0 = threadIdx.x / 32; t0 < tiles; t0 += POET_MMA_BATCH * POET_MMA_WARPS) {
        gc_u32 val[POET_MMA_BATCH];
        for (int i = 0; i < POET_MMA_BATCH; ++i) {
            int r, p;
            poet_mma_tile_slot(t0 + i * POET_MMA_WARPS, q.st, r, p);
            const gc_u16* xr = X + r * x_rs;
            const gc_u16 lo = r < valid ? xr[(gc_i64)sm.in_s[2 * p] * x_cs] : (gc_u16)0;
            const gc_u16 hi = r < valid ? xr[(gc_i64)sm.in_s[2 * p + 1] * x_cs] : (gc_u16)0;
            val[i] = (gc_u32)lo | ((gc_u32)hi << 16);
        }
        for (int i = 0; i < POET_MMA_BATCH; ++i) {
            int r, p;
            poet_mma_tile_slot(t0 + i * POET_MMA_WARPS, q.st, r, p);
            gc_st_u32(&sm.xs[r * q.xs_rs + 2 * p], val[i]);
        }
    }
}

// The stripe of the sub-tile at row s0: xs[r][kk] = A(s0 + r, in_s[kk]) for r < st, kk < b (0 for
// rows >= m). `contiguous`: no gather, unit column stride, 16-byte aligned rows: 8 columns per load.
__device__ __forceinline__ void poet_mma_gather(poet_mma_smem& sm, const poet_mma_geom& q, const gc_u16* X,
                                                gc_i64 x_rs, gc_i64 x_cs, bool contiguous, int m, int s0,
                                                int colbase, int b) {
    if (contiguous)
        poet_mma_copy_tiles(sm.xs, q.xs_rs, X + (gc_i64)s0 * x_rs + colbase, x_rs, q.st, b / 8, m - s0);
    else
        poet_mma_gather_pairs(sm, q, X + (gc_i64)s0 * x_rs, x_rs, x_cs, m - s0, b);
}

// One chunk of B for the pass at column c0 (pwv columns) and inner indices k0 .. k0 + kc, copied
// from G as it lies: k-major, rows k0.. and columns c0.. of G; n-major, rows c0.. and columns k0...
__device__ __forceinline__ void poet_mma_stage_g(poet_mma_smem& sm, const poet_mma_geom& q,
                                                 const gc_u16* __restrict__ G, int b, bool aligned, int c0,
                                                 int pwv, int k0, int kc) {
    const int rows = q.kmajor ? kc : pwv, cols = q.kmajor ? pwv : kc;
    const gc_u16* src = G + (q.kmajor ? (gc_i64)k0 * b + c0 : (gc_i64)c0 * b + k0);
    if (aligned) {
        poet_mma_copy_tiles(sm.gs, q.gs_rs, src, b, rows, cols / 8, rows);
    } else {
        for (int e = threadIdx.x; e < rows * cols; e += POET_MMA_THREADS) {
            const int r = e / cols, c = e - r * cols;
            sm.gs[r * q.gs_rs + c] = src[(gc_i64)r * b + c];
        }
    }
}

// The element offsets of this lane's ldmatrix rows (lane l addresses row l % 8 of matrix l / 8) at
// k = 0: `a` in the stripe, of the warp's A blocks (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15),
// (8-15, 8-15) (a[0..3]); `b` in the G chunk, of (k 0-7, n-tile 0), (k 8-15, tile 0), (k 0-7, tile 1),
// (k 8-15, tile 1) (the b of tiles 0 and 1); b_k16 the step to the next k16, b_n16 to tiles 2 and 3.
struct poet_mma_rows {
    int a, b, b_k16, b_n16;
};

__device__ __forceinline__ poet_mma_rows poet_mma_lane_rows(const poet_mma_geom& q, int lane) {
    const int lr = lane % 8, lm = lane / 8;
    poet_mma_rows o;
    o.a = (q.wr + lr + 8 * (lm & 1)) * q.xs_rs + 8 * (lm >> 1);
    o.b = q.kmajor ? (lr + 8 * (lm & 1)) * q.gs_rs + q.wc + 8 * (lm >> 1)
                   : (q.wc + lr + 8 * (lm >> 1)) * q.gs_rs + 8 * (lm & 1);
    o.b_k16 = q.kmajor ? 16 * q.gs_rs : 16;
    o.b_n16 = q.kmajor ? 16 : 16 * q.gs_rs;
    return o;
}

// acc += the stripe's k0 .. k0 + kc columns . the staged chunk, one k16 step at a time (kc a multiple
// of 32): three ldmatrix and four mma per step. KMAJOR: the chunk is k-major (ldmatrix .trans).
template <class T, bool KMAJOR>
__device__ __forceinline__ void poet_mma_chunk(const poet_mma_smem& sm, const poet_mma_rows& lr, int k0, int kc,
                                               float (&acc)[4][4]) {
#pragma unroll 2
    for (int ks = 0; ks < kc; ks += 16) {
        gc_u32 a[4], b01[4], b23[4];
        gc_ldmatrix_x4(a, sm.xs + lr.a + k0 + ks);
        const gc_u16* bp = sm.gs + lr.b + (ks / 16) * lr.b_k16;
        if (KMAJOR) {
            gc_ldmatrix_x4_trans(b01, bp);
            gc_ldmatrix_x4_trans(b23, bp + lr.b_n16);
        } else {
            gc_ldmatrix_x4(b01, bp);
            gc_ldmatrix_x4(b23, bp + lr.b_n16);
        }
        const gc_u32 f0[2] = {b01[0], b01[1]}, f1[2] = {b01[2], b01[3]};
        const gc_u32 f2[2] = {b23[0], b23[1]}, f3[2] = {b23[2], b23[3]};
        gc_mma_16816(acc[0], a, f0, acc[0], T());
        gc_mma_16816(acc[1], a, f1, acc[1], T());
        gc_mma_16816(acc[2], a, f2, acc[2], T());
        gc_mma_16816(acc[3], a, f3, acc[3], T());
    }
}

// One pass: acc (this warp's 16 rows x 32 columns c0 + wc ..) = stripe . B[:, c0 + wc ..], k in order.
template <class T>
__device__ __forceinline__ void poet_mma_pass(poet_mma_smem& sm, const poet_mma_geom& q,
                                              const gc_u16* __restrict__ G, int b, bool g_aligned, int c0,
                                              float (&acc)[4][4]) {
    const poet_mma_rows lr = poet_mma_lane_rows(q, threadIdx.x % 32);
    const int pwv = b - c0 < q.pw ? b - c0 : q.pw;
    const bool active = q.wc < pwv;  // a warp whose columns the last pass of b = 160, 224 lacks
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < b; k0 += q.kcm) {
        const int kc = b - k0 < q.kcm ? b - k0 : q.kcm;
        poet_mma_stage_g(sm, q, G, b, g_aligned, c0, pwv, k0, kc);
        __syncthreads();
        if (active && q.kmajor) poet_mma_chunk<T, true>(sm, lr, k0, kc, acc);
        else if (active) poet_mma_chunk<T, false>(sm, lr, k0, kc, acc);
        __syncthreads();
    }
}

__device__ __forceinline__ gc_u16 poet_bits(float v, gc_bf16) { return gc_f32_to_bf16(v); }
__device__ __forceinline__ gc_u16 poet_bits(float v, gc_f16) { return gc_f32_to_f16(v); }

// The warp's results of a pass, rounded to the storage dtype, to Y through out_idx.
template <class T>
__device__ __forceinline__ void poet_mma_store(const poet_mma_smem& sm, const poet_mma_geom& q,
                                               gc_u16* __restrict__ Y, gc_i64 y_rs, gc_i64 y_cs, bool y_pairs,
                                               int m, int s0, int colbase, int c0, const float (&acc)[4][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int nt = 0; nt < 4; ++nt) {
        for (int h = 0; h < 2; ++h) {
            const int row = s0 + q.wr + g + 8 * h;
            const int lc = c0 + q.wc + nt * 8 + 2 * t;  // this lane's two columns lc, lc + 1 of the block
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
    const poet_mma_geom q = poet_mma_geometry(b, transpose);
    const bool x_vec = !in_idx && x_cs == 1 && (x_rs & 7) == 0 && ((gc_u64)X & 15u) == 0;
    const bool g_aligned = ((gc_u64)G & 15u) == 0;
    const bool y_pairs = !out_idx && y_cs == 1 && (y_rs & 1) == 0 && ((gc_u64)Y & 3u) == 0;
    for (int s0 = row0; s0 < row0 + POET_MMA_TM && s0 < m; s0 += q.st) {
        // the stripe is free: the previous sub-tile's last pass ended with a barrier
        poet_mma_gather(sm, q, X, x_rs, x_cs, x_vec, m, s0, colbase, b);
        for (int c0 = 0; c0 < b; c0 += q.pw) {
            float acc[4][4];
            poet_mma_pass<T>(sm, q, Gb, b, g_aligned, c0, acc);  // its first barrier: the stripe is in
            if (q.wc < b - c0) poet_mma_store<T>(sm, q, Y, y_rs, y_cs, y_pairs, m, s0, colbase, c0, acc);
        }
    }
}

#define POET_MMA_ENTRY(NAME, TAG)                                                                     \
    extern "C" __global__ void __launch_bounds__(POET_MMA_THREADS, POET_MMA_MIN_BLOCKS) NAME(         \
        const TAG::storage* X, gc_i64 x_rs, gc_i64 x_cs, const TAG::storage* G, TAG::storage* Y,      \
        gc_i64 y_rs, gc_i64 y_cs, const int* in_idx, const int* out_idx, int m, int b, int k,         \
        int transpose) {                                                                              \
        poet_bd_mma_impl<TAG>(X, x_rs, x_cs, G, Y, y_rs, y_cs, in_idx, out_idx, m, b, k, transpose);  \
    }

POET_MMA_ENTRY(poet_bd_mma_bf16, gc_bf16)
POET_MMA_ENTRY(poet_bd_mma_f16, gc_f16)
