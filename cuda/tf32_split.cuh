// The split passes: FP32 operands into the TF32 hi and lo of B that k_gemm_wg_areg and its fused kernel
// (k_gemm_wg_split_delta) only copy. A split operand is hi then lo, each rows_pad x K_pad (rows_pad a multiple of
// TC_SPLIT_ROWS, K_pad of TC_SPLIT_K) in the tiles the wgmma kernels copy whole (split_at, matmul_tc.cuh), zero past
// the matrix: op(B)^T. Every pass splits each float by the same tf32_split, so any of them gives the bits of any
// other, and the products the wgmma kernel's. k_tf32_split and k_tf32_split_t split one operand (transposed: a weight
// as a dX product reads it); k_tf32_split_batch splits many in one launch (the model's weights at the start of the
// forward, and of the backward).
#pragma once
#include <cstdint>

#include "matmul_tc.cuh"  // tf32_split, tf32_split_store; aligned16, load_quad (matmul_fast.cuh)

// hi, lo (rows_pad x K_pad, split_at) from src (rows x K, ld): one thread per quad of K, zero past rows and K
extern "C" __global__ void k_tf32_split(uint32_t* hi, uint32_t* lo, const float* src, int rows, int K, int ld,
                                        int K_pad, long long quads) {
    const long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= quads) return;
    const long long r = q / (K_pad / 4);
    const int k = (int)(q % (K_pad / 4)) * 4;
    const long long at = split_at(r, k, K_pad);
    tf32_split_store(hi + at, lo + at, 0, load_quad(src, r, k, rows, K, ld, aligned16(src, ld)));
}

// The same from src stored transposed (K x rows, ld), through a 32 x 32 tile of shared memory (8 warps, each
// taking every 8th row of it): blocks of 256 threads, a grid of (K_pad / 32, rows_pad / 32)
extern "C" __global__ void __launch_bounds__(256) k_tf32_split_t(uint32_t* hi, uint32_t* lo, const float* src,
                                                                 int rows, int K, int ld, int K_pad) {
    __shared__ float t[32][33];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int r0 = blockIdx.y * 32, k0 = blockIdx.x * 32;
    for (int j = warp; j < 32; j += 8) {
        const int k = k0 + j, r = r0 + lane;
        t[j][lane] = k < K && r < rows ? src[(long long)k * ld + r] : 0.0f;
    }
    __syncthreads();
    for (int j = warp; j < 32; j += 8) {
        const long long at = split_at(r0 + j, k0 + lane, K_pad);
        tf32_split(t[lane][j], hi[at], lo[at]);
    }
}

// A batch's table: a row of SPLIT_JOB_FIELDS 64-bit fields per operand, mirrored in microgpt/kernels/tf32_split.py.
// An operand's SPLIT_TILE x SPLIT_TILE tiles (of rows_pad x K_pad, row after row) are numbered from JOB_FIRST_TILE
// on; the jobs' tiles follow one another, so that the launch's blocks are the tiles of all.
enum SplitJob : int {
    JOB_SRC = 0, JOB_HI = 1, JOB_LO = 2, JOB_ROWS = 3, JOB_K = 4, JOB_LD = 5, JOB_K_PAD = 6, JOB_TRANSPOSED = 7,
    JOB_FIRST_TILE = 8, JOB_TILES_K = 9,
    SPLIT_JOB_FIELDS = 10,
    SPLIT_TILE = 64,
    SPLIT_THREADS = 256,
};

// Each job's operand split as k_tf32_split (src rows x K) or k_tf32_split_t (src stored K x rows) would, padding and
// all: one block per 64 x 64 tile, each thread 4 quads, 16-byte reads along src's rows and 16-byte writes along the
// operand's (through shared memory where transposed). jobs: n_jobs rows of the table, in tile order.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS) k_tf32_split_batch(const long long* jobs, int n_jobs) {
    __shared__ float t[SPLIT_TILE][SPLIT_TILE + 1];
    const int tile = blockIdx.x, tid = threadIdx.x;
    int lo_job = 0, hi_job = n_jobs - 1;  // the last job whose first tile is at most this one
    while (lo_job < hi_job) {
        const int mid = (lo_job + hi_job + 1) / 2;
        if (jobs[mid * SPLIT_JOB_FIELDS + JOB_FIRST_TILE] <= tile) lo_job = mid; else hi_job = mid - 1;
    }
    const long long* job = jobs + lo_job * SPLIT_JOB_FIELDS;
    const float* src = reinterpret_cast<const float*>(job[JOB_SRC]);
    uint32_t* hi = reinterpret_cast<uint32_t*>(job[JOB_HI]);
    uint32_t* lo = reinterpret_cast<uint32_t*>(job[JOB_LO]);
    const int rows = (int)job[JOB_ROWS], K = (int)job[JOB_K], ld = (int)job[JOB_LD], K_pad = (int)job[JOB_K_PAD];
    const int within = tile - (int)job[JOB_FIRST_TILE], tiles_k = (int)job[JOB_TILES_K];
    const int r0 = within / tiles_k * SPLIT_TILE, k0 = within % tiles_k * SPLIT_TILE;
    const bool vec = aligned16(src, ld);
    const int row = tid / 16, quad = (tid % 16) * 4;  // a thread's quad in rows row + 16 i of a tile
    if (!job[JOB_TRANSPOSED]) {
#pragma unroll
        for (int i = 0; i < SPLIT_TILE / 16; i++) {
            const int r = r0 + row + 16 * i, k = k0 + quad;
            if (k < K_pad) {  // K_pad % 4 == 0: a quad is all in or all out
                const long long at = split_at(r, k, K_pad);
                tf32_split_store(hi + at, lo + at, 0, load_quad(src, r, k, rows, K, ld, vec));
            }
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < SPLIT_TILE / 16; i++) {  // src's rows k0 + kk (K of them), its columns r0 .. (rows of them)
        const int kk = row + 16 * i;
        const float4 v = load_quad(src, k0 + kk, r0 + quad, K, rows, ld, vec);
        t[kk][quad] = v.x, t[kk][quad + 1] = v.y, t[kk][quad + 2] = v.z, t[kk][quad + 3] = v.w;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < SPLIT_TILE / 16; i++) {  // the operand's rows r0 + rr, along K
        const int rr = row + 16 * i, k = k0 + quad;
        if (k < K_pad) {
            const long long at = split_at(r0 + rr, k, K_pad);
            tf32_split_store(hi + at, lo + at, 0,
                             make_float4(t[quad][rr], t[quad + 1][rr], t[quad + 2][rr], t[quad + 3][rr]));
        }
    }
}
