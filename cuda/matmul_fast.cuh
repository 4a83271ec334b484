// Fast variants of the matrix kernels: one tiled SGEMM serves every matrix product of the model (the linear layers
// forward and backward, and the attention products); the bias gradients come from colsum.cuh. Every product kernel:
//   C[z] (M x N, ldc) = alpha * op(A[z]) @ op(B[z]) + bias[n] + beta * C[z]     for z < gridDim.z
//   op(A) is M x K (A stored M x K, lda, or transposed, K x M); op(B) is K x N (B stored K x N, ldb, or N x K).
// C is read only when beta != 0, so it may hold anything (NaN) before. The last argument, a_sums, is used only by
// the wgmma kernels (matmul_tc.cuh: the row sums of a transposed A, a bias gradient); this SGEMM ignores it.
#pragma once
#include "common.cuh"

// `causal` lets attention skip the half of the work that the mask makes constant. Mirrored once in
// Python (microgpt/kernels/matmul_fast.py, class Causal).
enum Causal : int {
    CAUSAL_NONE = 0,
    CAUSAL_OUT_LOWER = 1,  // C is lower triangular: C[m][n] = fill for n > m (tiles wholly above the
                           // diagonal are not computed)
    CAUSAL_A_LOWER = 2,    // A is lower triangular (A[m][k] = 0 for k > m): K stops at the tile's last row
    CAUSAL_A_UPPER = 3,    // A is upper triangular (A[m][k] = 0 for k < m): K starts at the tile's first row
};

#define GEMM_BM 128
#define GEMM_BK 8
#define GEMM_PAD 4  // keeps the transposing shared-memory stores free of bank conflicts
#define GEMM_THREADS 256

// 16-byte loads need a 16-byte aligned base and a leading dimension that keeps every row aligned.
__device__ __forceinline__ bool aligned16(const float* p, int ld) {
    return ((reinterpret_cast<unsigned long long>(p) & 15) == 0) && ((ld & 3) == 0);
}
// ... and 8-byte accesses (a pair of floats at an even column) an 8-byte aligned base and an even one
__device__ __forceinline__ bool aligned8(const float* p, int ld) {
    return ((reinterpret_cast<unsigned long long>(p) & 7) == 0) && ((ld & 1) == 0);
}

// The 4 floats of src's row r from column c (a row of `cols`, ld apart), zero past rows and cols; 16 bytes at once
// where vec (aligned16(src, ld): every quad of a row is)
__device__ __forceinline__ float4 load_quad(const float* src, long long r, int c, int rows, int cols, int ld,
                                            bool vec) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r >= rows) return v;
    const float* p = src + r * ld + c;
    if (vec && c + 3 < cols) return *reinterpret_cast<const float4*>(p);
    if (c < cols) v.x = p[0];
    if (c + 1 < cols) v.y = p[1];
    if (c + 2 < cols) v.z = p[2];
    if (c + 3 < cols) v.w = p[3];
    return v;
}

// A tile of C wholly above the diagonal of a CAUSAL_OUT_LOWER product is the constant fill: written, and the
// block is done (true). Shared by the SIMT SGEMM and the tensor-core products (matmul_tc.cuh).
template <int BN>
__device__ __forceinline__ bool gemm_fill_above_diagonal(float* C, int m0, int n0, int M, int N, int ldc,
                                                         float fill) {
    if (n0 <= m0 + GEMM_BM - 1) return false;
    for (int e = threadIdx.x; e < GEMM_BM * BN; e += GEMM_THREADS) {
        int m = m0 + e / BN, n = n0 + e % BN;
        if (m < M && n < N) C[(long long)m * ldc + n] = fill;
    }
    return true;
}

// alpha * sum + bias[n] + beta * c (C[m][n] before), or fill above the diagonal of a CAUSAL_OUT_LOWER product; the
// roundings spelled out (a fused multiply-add for each add), so that every kernel and code path gives the same float
__device__ __forceinline__ float gemm_value(float sum, float c, int m, int n, const float* bias, float alpha,
                                            float beta, Causal causal, float fill) {
    float v = bias != nullptr ? __fmaf_rn(alpha, sum, bias[n]) : alpha * sum;
    if (beta != 0.0f) v = __fmaf_rn(beta, c, v);
    if (causal == CAUSAL_OUT_LOWER && n > m) v = fill;
    return v;
}

// C[m][n] = gemm_value(sum, C[m][n], ..): C is read only where beta != 0
__device__ __forceinline__ void gemm_store(float* C, float sum, int m, int n, int ldc, const float* bias,
                                           float alpha, float beta, Causal causal, float fill) {
    long long o = (long long)m * ldc + n;
    C[o] = gemm_value(sum, beta != 0.0f ? C[o] : 0.0f, m, n, bias, alpha, beta, causal, fill);
}

// One block computes a BM x BN tile of C (BN 128, or 64 for attention's narrow products, N = d_k) with 16 x 16
// threads, stepping K by BK through double-buffered shared-memory tiles stored k-major. Thread (tx, ty) computes
// rows {ty*4 + i, 64 + ty*4 + i} and columns {c*64 + tx*4 + j}: consecutive float4 reads across the warp.
template <bool TA, bool TB, int BN>
__device__ __forceinline__ void sgemm_tile(float* C, const float* A, const float* B, const float* bias,
                                           int M, int N, int K, int lda, int ldb, int ldc,
                                           long long strideA, long long strideB, long long strideC,
                                           float alpha, float beta, Causal causal, float fill,
                                           float* /* a_sums: the launchers pass 0 */) {
    constexpr int BM = GEMM_BM, BK = GEMM_BK, TN = BN / 16;
    __shared__ __align__(16) float As[2][BK][BM + GEMM_PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + GEMM_PAD];
    A += blockIdx.z * strideA;
    B += blockIdx.z * strideB;
    C += blockIdx.z * strideC;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

    if (causal == CAUSAL_OUT_LOWER && gemm_fill_above_diagonal<BN>(C, m0, n0, M, N, ldc, fill)) return;
    const int k_begin = causal == CAUSAL_A_UPPER ? m0 : 0;
    const int k_end = causal == CAUSAL_A_LOWER ? min(K, m0 + BM) : K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    const bool vec_a = aligned16(A, lda), vec_b = aligned16(B, ldb);

    // Each thread moves one float4 of the A tile (128 x 8) and, while e < BK * BN / 4, one of the B tile:
    // along k for a row-major A (M x K) or a transposed B (N x K), along m / n otherwise.
    float4 ra, rb;
    const int e = tid;
    auto load = [&](int k0) {
        if (TA) ra = load_quad(A, k0 + e / 32, m0 + (e % 32) * 4, k_end, M, lda, vec_a);  // A stored K x M
        else ra = load_quad(A, m0 + e / 2, k0 + (e % 2) * 4, M, k_end, lda, vec_a);       // A stored M x K
        if (e < BK * BN / 4) {
            if (TB) rb = load_quad(B, n0 + e / 2, k0 + (e % 2) * 4, N, k_end, ldb, vec_b);  // B stored N x K
            else rb = load_quad(B, k0 + e / (BN / 4), n0 + (e % (BN / 4)) * 4, k_end, N, ldb, vec_b);
        }
    };
    auto store = [&](int buf) {
        if (TA) {
            *reinterpret_cast<float4*>(&As[buf][e / 32][(e % 32) * 4]) = ra;
        } else {
            int m = e / 2, k = (e % 2) * 4;
            As[buf][k][m] = ra.x; As[buf][k + 1][m] = ra.y; As[buf][k + 2][m] = ra.z; As[buf][k + 3][m] = ra.w;
        }
        if (e < BK * BN / 4) {
            if (TB) {
                int n = e / 2, k = (e % 2) * 4;
                Bs[buf][k][n] = rb.x; Bs[buf][k + 1][n] = rb.y; Bs[buf][k + 2][n] = rb.z; Bs[buf][k + 3][n] = rb.w;
            } else {
                *reinterpret_cast<float4*>(&Bs[buf][e / (BN / 4)][(e % (BN / 4)) * 4]) = rb;
            }
        }
    };

    float acc[8][TN];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

    if (n_tiles > 0) {
        load(k_begin);
        store(0);
    }
    __syncthreads();
    for (int t = 0; t < n_tiles; t++) {
        const int buf = t & 1;
        if (t + 1 < n_tiles) load(k_begin + (t + 1) * BK);  // in flight while this tile is multiplied
#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[8], b[TN];
            *(float4*)&a[0] = *(const float4*)&As[buf][k][ty * 4];
            *(float4*)&a[4] = *(const float4*)&As[buf][k][64 + ty * 4];
#pragma unroll
            for (int c = 0; c < TN / 4; c++) *(float4*)&b[c * 4] = *(const float4*)&Bs[buf][k][c * 64 + tx * 4];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] += a[i] * b[j];
        }
        if (t + 1 < n_tiles) store(buf ^ 1);
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; i++) {
        int m = m0 + (i / 4) * 64 + ty * 4 + i % 4;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j++) {
            int n = n0 + (j / 4) * 64 + tx * 4 + j % 4;
            if (n >= N) continue;
            gemm_store(C, acc[i][j], m, n, ldc, bias, alpha, beta, causal, fill);
        }
    }
}

// A GEMM kernel: one tile function (sgemm_tile here, gemm_tc_tile and gemm_wg_tile in matmul_tc.cuh) at one
// layout and tile width, under its launch bounds, with the SGEMM's arguments: every product kernel is
// declared here, so that all of them take the same arguments in the same order.
#define GEMM_KERNEL(name, TILE, TA, TB, BN, THREADS, MIN_BLOCKS)                                               \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                                          \
    name(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda, int ldb,   \
         int ldc, long long strideA, long long strideB, long long strideC, float alpha, float beta,            \
         Causal causal, float fill, float* a_sums) {                                                           \
        TILE<TA, TB, BN>(C, A, B, bias, M, N, K, lda, ldb, ldc, strideA, strideB, strideC, alpha, beta, causal, \
                         fill, a_sums);                                                                        \
    }

// One kernel per (transposes, tile width), named k_sgemm_<op(A)><op(B)>, with _n64 for the 128 x 64 tile.
#define SGEMM_KERNEL(name, TA, TB, BN) GEMM_KERNEL(name, sgemm_tile, TA, TB, BN, GEMM_THREADS, 2)
SGEMM_KERNEL(k_sgemm_nn, false, false, 128)
SGEMM_KERNEL(k_sgemm_nn_n64, false, false, 64)
SGEMM_KERNEL(k_sgemm_nt, false, true, 128)
SGEMM_KERNEL(k_sgemm_nt_n64, false, true, 64)
SGEMM_KERNEL(k_sgemm_tn, true, false, 128)
SGEMM_KERNEL(k_sgemm_tn_n64, true, false, 64)
SGEMM_KERNEL(k_sgemm_tt, true, true, 128)
SGEMM_KERNEL(k_sgemm_tt_n64, true, true, 64)
#undef SGEMM_KERNEL

// Split-K's reduction, for products whose M x N has too few tiles to fill the GPU (the weight gradients): C = beta *
// C + the splits' partial products added in split order. Where sums is given, threads MN .. MN + M - 1 also add the
// splits' row sums of op(A) ([splits][M] after the partials: a wgmma dW product's bias gradient) into sums.
extern "C" __global__ void k_splitk_reduce(float* C, const float* partials, int splits, long long MN, float beta,
                                           float* sums, int M) {
    long long i = thread_index();
    if (i < MN) {
        float s = 0.0f;
        for (int k = 0; k < splits; k++) s += partials[k * MN + i];
        C[i] = (beta != 0.0f ? beta * C[i] : 0.0f) + s;
    } else if (i < MN + M) {
        const float* row_sums = partials + splits * MN;
        const long long m = i - MN;
        float s = 0.0f;
        for (int k = 0; k < splits; k++) s += row_sums[k * M + m];
        sums[m] += s;
    }
}
