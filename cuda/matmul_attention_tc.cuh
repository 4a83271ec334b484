// The attention output projection's dX product and flash attention's delta, in one kernel (sm_90a):
//   dO = dY @ W_O                            (M x C, M = B * T: the attention output's gradient, written)
//   delta[b][h][t] = sum over d of dO * O   (O = y, the attention's output: head h is columns h d_k .. + d_k)
// for the rows past flash attention's first FA_DELTA_PASS_TILES query tiles, whose counters it also zeroes. dO is
// summed from the product's registers as it is stored, and only O is read. Each sum is FP64 over the head's d_k
// products, rounded once to FP32, in a fixed order (a thread's columns, then the quad's shuffle tree).
#pragma once
#include "flash_attention.cuh"  // FA_KEYS, FA_DELTA_PASS_TILES
#include "matmul_tc.cuh"        // wg_areg_tiles, wg_store, quad_sum

// the two consumer warpgroups (the producer has left: bar 0, __syncthreads, would wait for it)
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// O's 128 x 128 tile in the stages' shared memory, free once the products are done: rows of DELTA_TILE_LD floats
// (16-byte aligned, and a warp's fragment reads spread over the banks).
constexpr int DELTA_TILE_LD = 132;
constexpr int DELTA_COPY_BATCH = 8;  // a thread's 16-byte loads in flight at a time
static_assert(128 * DELTA_TILE_LD <= WG_AREG_STAGES * (2 * WG_SPLIT + WgRawA<false>::FLOATS),
              "O's tile fits the stages");

// The tile (m0, n0) of the M x N matrix a, zero outside it, copied by the 256 consumer threads into t (rows of
// DELTA_TILE_LD floats): one warp per row's 128 floats, rows tid / 32 + 8q, 16 bytes per thread where a's rows allow
// (VEC4: N % 4 == 0 and a 16-byte aligned), DELTA_COPY_BATCH loads in flight at a time.
template <bool VEC4>
__device__ __forceinline__ void tile_load(float* t, const float* a, int M, int N, int m0, int n0) {
    const int tid = threadIdx.x - 128, r0 = tid / 32, c = (tid % 32) * 4, col = n0 + c;
    const long long step = 8LL * N;  // 8 rows of a
    const float* p = a + (long long)(m0 + r0) * N + col;
    float* at = t + r0 * DELTA_TILE_LD + c;
    const int rows = min(16, (M - m0 - r0 + 7) / 8);  // of this thread's 16: those inside M
#pragma unroll
    for (int q0 = 0; q0 < 16; q0 += DELTA_COPY_BATCH) {
        float4 v[DELTA_COPY_BATCH];
#pragma unroll
        for (int q = 0; q < DELTA_COPY_BATCH; q++) {
            const int k = q0 + q;
            v[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (k < rows && col < N) {
                if constexpr (VEC4)
                    v[q] = *reinterpret_cast<const float4*>(p + k * step);
                else
                    v[q] = make_float4(p[k * step], col + 1 < N ? p[k * step + 1] : 0.0f,
                                       col + 2 < N ? p[k * step + 2] : 0.0f, col + 3 < N ? p[k * step + 3] : 0.0f);
            }
        }
#pragma unroll
        for (int q = 0; q < DELTA_COPY_BATCH; q++)
            *reinterpret_cast<float4*>(at + (q0 + q) * 8 * DELTA_TILE_LD) = v[q];
    }
}

// ... with VEC4 as vec4 says
__device__ __forceinline__ void tile_load(float* t, const float* a, int M, int N, int m0, int n0, bool vec4) {
    if (vec4)
        tile_load<true>(t, a, M, N, m0, n0);
    else
        tile_load<false>(t, a, M, N, m0, n0);
}

// The delta of a consumer's share of the tile (m0, n0) of dO (d, as wg_store lays it out: element i is row
// r0 + 8 ((i % 4) / 2), column n0 + 8 (i / 4) + 2t + i % 2, r0 = m0 + 16 * wg_warp + lane / 4), O's tile in os
// (rows of DELTA_TILE_LD floats), for heads of D = d_k columns: each of the tile's 128 / D heads is D / 8 of the
// thread's column pairs.
template <int D>
__device__ __forceinline__ void wg_delta_epilogue(const float (&d)[64], const float* os, float* delta, int* sync,
                                                  int M, int N, int T, int m0, int n0) {
    constexpr int HEADS = 128 / D, PAIRS = D / 8, T0 = FA_DELTA_PASS_TILES * FA_KEYS;
    const int tid = threadIdx.x - 128, lane = tid % 32, t = lane % 4, lr0 = (tid / 32) * 16 + lane / 4;
    const int NH = N / D, tiles = (T - 1) / FA_KEYS + 1;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int m = m0 + lr0 + 8 * r;
        const float* o = os + (lr0 + 8 * r) * DELTA_TILE_LD;
        double sum[HEADS];
#pragma unroll
        for (int hh = 0; hh < HEADS; hh++) {
            sum[hh] = 0.0;
#pragma unroll
            for (int j = hh * PAIRS; j < (hh + 1) * PAIRS; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) sum[hh] += (double)d[4 * j + 2 * r + e] * o[8 * j + 2 * t + e];
            sum[hh] = quad_sum(sum[hh]);
        }
        const int b = m / T, tp = m - b * T;
        if (t != 0 || m >= M || tp < T0) continue;
#pragma unroll
        for (int hh = 0; hh < HEADS; hh++) {
            const int h = n0 / D + hh;
            if (h >= NH) break;  // past N: a partial last column tile
            const long long bh = (long long)b * NH + h;
            delta[bh * T + tp] = (float)sum[hh];
            if (tp % FA_KEYS == 0) sync[bh * tiles + tp / FA_KEYS] = 0;
        }
    }
}

// d_o (M x N) = dY @ W_O (wg_areg_tiles: dY raw, M x K, ld, dY_map a tensor map over it or null; b_split: W_O^T's
// rows split, N_pad x K_pad), and for the rows at t >= FA_DELTA_PASS_TILES * FA_KEYS of each batch row: delta (B,
// N / d_k, T) = the sums of d_o * o (o: M x N) over each head's d_k columns, and sync's counters of those query tiles
// (B, N / d_k, ceil(T / 64)) set to 0; the first query tiles' are k_flash_bwd_delta_d*'s. d_k: 32, 64 or 128 (traps
// otherwise). Grid and dynamic shared memory as k_gemm_wg_areg: (ceil(N / 128), ceil(M / 128)) blocks of
// TC_WG_THREADS, TC_AREG_SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_wg_split_delta(float* d_o, float* delta, int* sync, const float* dY, int ld, const TensorMap* dY_map,
                          const uint32_t* b_split, const float* o, int M, int N, int K, int K_pad, int T, int d_k) {
#if WG_AVAILABLE
    extern __shared__ __align__(1024) float split_smem[];
    if (d_k != 32 && d_k != 64 && d_k != 128) __trap();
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    auto epilogue = [&](const float (&acc)[64], int, int) {
        const bool vec4 = N % 4 == 0 && reinterpret_cast<uintptr_t>(o) % 16 == 0;
        consumers_sync();  // every consumer's last wgmma has read the stages, which O's tile now takes
        tile_load(split_smem, o, M, N, m0, n0, vec4);
        consumers_sync();
        if (d_k == 32)
            wg_delta_epilogue<32>(acc, split_smem, delta, sync, M, N, T, m0, n0);
        else if (d_k == 64)
            wg_delta_epilogue<64>(acc, split_smem, delta, sync, M, N, T, m0, n0);
        else
            wg_delta_epilogue<128>(acc, split_smem, delta, sync, M, N, T, m0, n0);
        // stored after the sums: stored before them, its 64 addresses held registers and the sums spilled
        wg_store(d_o, acc, m0 + (threadIdx.x / 128 - 1) * 64, n0, M, N, N, nullptr, 1.0f, 0.0f, CAUSAL_NONE, 0.0f);
    };
    wg_areg_tiles(split_smem, dY, ld, dY_map, M, K, b_split, gridDim.x, K_pad, blockIdx.y * gridDim.x + blockIdx.x, 1,
                  1, epilogue);
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}
