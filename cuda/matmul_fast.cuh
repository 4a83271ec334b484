// Fast variants of the matrix kernels: one tiled SGEMM serves every matrix product of the model (the
// linear layers forward and backward, and the attention products), plus a deterministic column sum for
// the bias gradients. Tested against the reference kernels in matmul.cuh and attention.cuh.
//
//   C[z] (M x N, ldc) = alpha * op(A[z]) @ op(B[z]) + bias[n] + beta * C[z]     for z < gridDim.z
//   op(A) is M x K: A stored M x K (lda) or, transposed, K x M; op(B) is K x N: B stored K x N (ldb) or,
//   transposed, N x K. C is read only when beta != 0, so it may hold anything (NaN) before.
//
// Each block computes a 128 x 128 tile of C with 256 threads, 8 x 8 outputs a thread, stepping K by 8:
// the A and B tiles go through shared memory (double-buffered, the next tile's loads in flight in
// registers while the current one is multiplied), stored k-major so that each thread reads its 8 A and
// 8 B values as float4s.
//
// `causal` lets attention skip the half of the work that the mask makes constant:
//   1: C is lower triangular: C[m][n] = fill for n > m (tiles wholly above the diagonal are not computed)
//   2: A is lower triangular (A[m][k] = 0 for k > m): K stops at the tile's last row
//   3: A is upper triangular (A[m][k] = 0 for k < m): K starts at the tile's first row
#pragma once
#include "common.cuh"

#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 8
#define GEMM_PAD 4  // keeps the transposing shared-memory stores free of bank conflicts
#define GEMM_THREADS 256

template <bool TA, bool TB>
__device__ __forceinline__ void sgemm_tile(float* C, const float* A, const float* B, const float* bias,
                                           int M, int N, int K, int lda, int ldb, int ldc,
                                           long long strideA, long long strideB, long long strideC,
                                           float alpha, float beta, int causal, float fill) {
    __shared__ __align__(16) float As[2][GEMM_BK][GEMM_BM + GEMM_PAD];
    __shared__ __align__(16) float Bs[2][GEMM_BK][GEMM_BN + GEMM_PAD];
    A += blockIdx.z * strideA;
    B += blockIdx.z * strideB;
    C += blockIdx.z * strideC;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

    if (causal == 1 && n0 > m0 + GEMM_BM - 1) {  // wholly above the diagonal: constant
        for (int e = tid; e < GEMM_BM * GEMM_BN; e += GEMM_THREADS) {
            int m = m0 + e / GEMM_BN, n = n0 + e % GEMM_BN;
            if (m < M && n < N) C[(long long)m * ldc + n] = fill;
        }
        return;
    }
    const int k_begin = causal == 3 ? m0 : 0;
    const int k_end = causal == 2 ? min(K, m0 + GEMM_BM) : K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + GEMM_BK - 1) / GEMM_BK : 0;

    float ra[4], rb[4];  // this thread's share of the next A and B tiles, 4 elements each
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int e = tid + i * GEMM_THREADS;
            int m = TA ? e % GEMM_BM : e / GEMM_BK, ka = TA ? e / GEMM_BM : e % GEMM_BK;
            int gm = m0 + m, gka = k0 + ka;
            ra[i] = (gm < M && gka < k_end) ? (TA ? A[(long long)gka * lda + gm] : A[(long long)gm * lda + gka]) : 0.0f;
            int n = TB ? e / GEMM_BK : e % GEMM_BN, kb = TB ? e % GEMM_BK : e / GEMM_BN;
            int gn = n0 + n, gkb = k0 + kb;
            rb[i] = (gn < N && gkb < k_end) ? (TB ? B[(long long)gn * ldb + gkb] : B[(long long)gkb * ldb + gn]) : 0.0f;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int e = tid + i * GEMM_THREADS;
            As[buf][TA ? e / GEMM_BM : e % GEMM_BK][TA ? e % GEMM_BM : e / GEMM_BK] = ra[i];
            Bs[buf][TB ? e % GEMM_BK : e / GEMM_BN][TB ? e / GEMM_BK : e % GEMM_BN] = rb[i];
        }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

    if (n_tiles > 0) {
        load(k_begin);
        store(0);
    }
    __syncthreads();
    for (int t = 0; t < n_tiles; t++) {
        const int buf = t & 1;
        if (t + 1 < n_tiles) load(k_begin + (t + 1) * GEMM_BK);
#pragma unroll
        for (int k = 0; k < GEMM_BK; k++) {
            float a[8], b[8];
            *(float4*)&a[0] = *(const float4*)&As[buf][k][ty * 8];
            *(float4*)&a[4] = *(const float4*)&As[buf][k][ty * 8 + 4];
            *(float4*)&b[0] = *(const float4*)&Bs[buf][k][tx * 8];
            *(float4*)&b[4] = *(const float4*)&Bs[buf][k][tx * 8 + 4];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        if (t + 1 < n_tiles) store(buf ^ 1);
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; i++) {
        int m = m0 + ty * 8 + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int n = n0 + tx * 8 + j;
            if (n >= N) continue;
            long long o = (long long)m * ldc + n;
            float v = alpha * acc[i][j];
            if (bias != nullptr) v += bias[n];
            if (beta != 0.0f) v += beta * C[o];
            if (causal == 1 && n > m) v = fill;
            C[o] = v;
        }
    }
}

#define SGEMM_ARGS C, A, B, bias, M, N, K, lda, ldb, ldc, strideA, strideB, strideC, alpha, beta, causal, fill

extern "C" __global__ void __launch_bounds__(GEMM_THREADS) k_sgemm_nn(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda, int ldb, int ldc, long long strideA, long long strideB, long long strideC, float alpha, float beta, int causal, float fill) {
    sgemm_tile<false, false>(SGEMM_ARGS);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS) k_sgemm_nt(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda, int ldb, int ldc, long long strideA, long long strideB, long long strideC, float alpha, float beta, int causal, float fill) {
    sgemm_tile<false, true>(SGEMM_ARGS);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS) k_sgemm_tn(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda, int ldb, int ldc, long long strideA, long long strideB, long long strideC, float alpha, float beta, int causal, float fill) {
    sgemm_tile<true, false>(SGEMM_ARGS);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS) k_sgemm_tt(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda, int ldb, int ldc, long long strideA, long long strideB, long long strideC, float alpha, float beta, int causal, float fill) {
    sgemm_tile<true, true>(SGEMM_ARGS);
}

// Deterministic column sums of x (N, C), in two passes. Pass 1: block (column group of 32, row chunk
// blockIdx.y) sums its rows; 8 warps take every 8th row, then warp 0 adds the 8 in order into
// partials[chunk][c]. Pass 2: one thread per column adds the chunks in order into out[c] (+=).
extern "C" __global__ void k_colsum_partial(float* partials, const float* x, int N, int C, int rows_per_chunk) {
    __shared__ float part[8][32];
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float s = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += 8) s += x[(long long)r * C + c];
    part[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int w = 1; w < 8; w++) s += part[w][tx];
        partials[(long long)blockIdx.y * C + c] = s;
    }
}

extern "C" __global__ void k_colsum_reduce(float* out, const float* partials, int chunks, int C) {
    long long c = thread_index();
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++) s += partials[(long long)k * C + c];
    out[c] += s;
}
