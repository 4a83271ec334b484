// Products of a few rows: out (M, N) = inp (M, K) @ W (N, K)^T + bias, M <= MATVEC_ROWS. Sampling's decode
// step multiplies one position a sequence (M = B) by every weight matrix: a tiled SGEMM would spend its 128-row
// tile on M rows and leave most SMs idle, while this is a pass over W at memory speed, each weight read once.
#pragma once
#include "common.cuh"

// Read by microgpt/kernels/matvec.py: which products come here, and the grid and block of their launch.
enum MatvecLaunch : int {
    MATVEC_ROWS = 8,       // products of at most this many rows take k_matvec
    MATVEC_COLS = 4,       // output columns per block: each load of the input rows serves four weight rows
    MATVEC_THREADS = 256,  // the block's warps split K, so that a short N still fills the GPU (mlp.proj: 768
                           // columns of 3072 weights, 192 blocks)
};
static_assert(MATVEC_ROWS <= 8, "k_matvec instantiates matvec_cols for up to 8 rows");

__device__ __forceinline__ float madd(float acc, float x, float w) { return fmaf(x, w, acc); }
__device__ __forceinline__ float madd(float acc, float4 x, float4 w) {
    return fmaf(x.w, w.w, fmaf(x.z, w.z, fmaf(x.y, w.y, fmaf(x.x, w.x, acc))));
}

// One block, columns n0 .. n0 + MATVEC_COLS - 1 of every row: thread i sums k = i, i + 256, ... in order (in
// units of Vec: float4 where K % 4 == 0 and the rows are 16-byte aligned), a fixed shuffle tree adds each
// warp's lanes, and one thread per (row, column) adds the warps' sums in warp order.
template <int ROWS, typename Vec>
__device__ void matvec_cols(float* out, const float* inp, const float* W, const float* bias, int M, int K, int N,
                            int n0) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float), WARPS = MATVEC_THREADS / 32;
    __shared__ float part[WARPS][ROWS * MATVEC_COLS];
    const int KV = K / WIDTH, cols = min(MATVEC_COLS, N - n0);
    const Vec* x = reinterpret_cast<const Vec*>(inp);
    const Vec* w = reinterpret_cast<const Vec*>(W) + (long long)n0 * KV;
    float acc[ROWS][MATVEC_COLS] = {};
    for (int kv = threadIdx.x; kv < KV; kv += MATVEC_THREADS) {
        Vec xv[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < M) xv[r] = __ldg(x + (long long)r * KV + kv);
#pragma unroll
        for (int c = 0; c < MATVEC_COLS; c++) {
            if (c >= cols) break;
            const Vec wv = __ldg(w + (long long)c * KV + kv);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (r < M) acc[r][c] = madd(acc[r][c], xv[r], wv);
        }
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int c = 0; c < MATVEC_COLS; c++) {
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2)
                acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], offset);
            if (lane == 0) part[warp][r * MATVEC_COLS + c] = acc[r][c];
        }
    __syncthreads();
    const int r = threadIdx.x / MATVEC_COLS, c = threadIdx.x % MATVEC_COLS;
    if (r < M && c < cols) {
        float s = 0.0f;
        for (int i = 0; i < WARPS; i++) s += part[i][threadIdx.x];
        out[(long long)r * N + n0 + c] = s + (bias ? bias[n0 + c] : 0.0f);
    }
}

// One block of MATVEC_THREADS per MATVEC_COLS columns (blockIdx.x); vec4: K % 4 == 0 and inp, W 16-byte aligned
// (the launcher checks). Rows are templated up to the next power of two, so that M = 1 keeps one accumulator
// per column.
extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)
k_matvec(float* out, const float* inp, const float* W, const float* bias, int M, int K, int N, int vec4) {
    const int n0 = blockIdx.x * MATVEC_COLS;
    if (n0 >= N) return;
    if (vec4) {
        if (M <= 1) matvec_cols<1, float4>(out, inp, W, bias, M, K, N, n0);
        else if (M <= 2) matvec_cols<2, float4>(out, inp, W, bias, M, K, N, n0);
        else if (M <= 4) matvec_cols<4, float4>(out, inp, W, bias, M, K, N, n0);
        else matvec_cols<8, float4>(out, inp, W, bias, M, K, N, n0);
    } else {
        if (M <= 1) matvec_cols<1, float>(out, inp, W, bias, M, K, N, n0);
        else if (M <= 2) matvec_cols<2, float>(out, inp, W, bias, M, K, N, n0);
        else if (M <= 4) matvec_cols<4, float>(out, inp, W, bias, M, K, N, n0);
        else matvec_cols<8, float>(out, inp, W, bias, M, K, N, n0);
    }
}
