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
//
// Both are tiled matmuls on static shared memory with fp32 FMA accumulation (__fmaf_rn, so that the
// emulation rounds exactly like the device); loads and stores of the storage dtype go through
// gc_load / gc_store. 256 threads per block (POET_THREADS); a thread owns RM x 4 outputs.
// Grid: bd_apply (k * b/32, ceil(m/128)); cnp_step (k * b/32, ceil(b/64)).

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
                for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(a[i], bv[j], acc[i][j]);
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
