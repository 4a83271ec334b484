// mlp.proj's dX product and the GELU backward after it, in one kernel (sm_90a):
//   dpre = (dY @ W) * gelu'(pre)        (M x N: the pre-activation's gradient; dY @ W, the GELU output's, never stored)
// The product is k_gemm_wg_areg's (wg_areg_tiles: dY raw, W split; the same acc bits), each element then
// gelu_bwd_of of its stored value (gemm_pair) and pre: the bits of k_gemm_wg_areg, then k_gelu_bwd_fast. pre's tile
// is copied into the warpgroup's store buffer by the bulk copy engine early in the tile's products (gelu_pre_ahead),
// so that the epilogue reads it from shared memory, and dpre goes out from there as k_gemm_wg_areg's tiles do.
#pragma once
#include "matmul_tc.cuh"       // wg_areg_tiles, gemm_pair, the store buffers
#include "pointwise_fast.cuh"  // gelu_bwd_of

// k_gemm_wg_areg_gelu_bwd's dynamic shared memory: k_gemm_wg_areg's, and an mbarrier a consumer warpgroup that
// counts its rows of pre in. Mirrored in microgpt/kernels/matmul_gelu_tc.py through source.int_constants.
enum GeluTcLaunch : int {
    TC_AREG_GELU_SMEM_BYTES = WG_AREG_STORE_STAGES * (WG_AREG_STAGE_BYTES + 2 * 8) + WG_STORE_BYTES + 2 * 8,
};
static_assert(TC_AREG_GELU_SMEM_BYTES == TC_AREG_STORE_SMEM_BYTES + 2 * 8, "k_gemm_wg_areg's, and two mbarriers");
static_assert(TC_AREG_GELU_SMEM_BYTES <= 227 * 1024, "within sm_90's dynamic shared memory a block");

// Threads 0 .. 63 of a consumer warpgroup: each copies row m0 + tid of pre (columns n0 .., as many as the tile has
// of N) into row tid of the warpgroup's buffer, once the copy engine has read what the thread last stored from there
// (the last tile's dpre row), and arrives on bar (64 arrivals; the phase also waits for the bytes).
__device__ __forceinline__ void gelu_pre_ahead(float* buf, uint64_t* bar, const float* pre, int m0, int n0, int M,
                                               int N, int ldc) {
#if WG_AVAILABLE
    const int tid = threadIdx.x % 128;
    if (tid >= 64) return;
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the last tile's row read out of buf
    if (m0 + tid < M) {
        const uint32_t bytes = 4 * min(128, N - n0);
        mbar_expect_tx(bar, bytes);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_u32(buf + tid * WG_STORE_LD)),
                     "l"(pre + (long long)(m0 + tid) * ldc + n0), "r"(bytes), "r"(smem_u32(bar))
                     : "memory");
    }
    mbar_arrive(bar);
#endif
}

// dpre (M x N, ldc) as above: dY (M x K, lda; dY_map a tensor map over it, or null), b_split W^T's rows split (N_pad x
// K_pad, as k_gemm_wg_areg's), pre (M x N, ldc). dpre and pre 16-byte aligned, N and ldc multiples of 4 (the bulk
// copies' rows: bulk_store_fits), dpre not pre. k_gemm_wg_areg's grid and schedule: gridDim.x blocks, one an SM, each
// taking the tiles blockIdx.x, blockIdx.x + gridDim.x, .. in row-major order; TC_AREG_GELU_SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_wg_areg_gelu_bwd(float* dpre, const float* dY, const TensorMap* dY_map, const uint32_t* b_split,
                            const float* pre, int M, int N, int K, int lda, int K_pad, int ldc) {
#if WG_AVAILABLE
    constexpr int S = WG_AREG_STORE_STAGES, STAGES_BYTES = S * (2 * WG_SPLIT + WgRawA<false>::FLOATS) * 4 + 2 * S * 8;
    static_assert(STAGES_BYTES % 16 == 0 && STAGES_BYTES + WG_STORE_BYTES + 2 * 8 <= TC_AREG_GELU_SMEM_BYTES,
                  "TC_AREG_GELU_SMEM_BYTES holds the stages, their barriers, the two store buffers and theirs");
    // [WG_AREG_STORE_STAGES][B hi, B lo, raw A], the barriers, the store buffers, their barriers
    extern __shared__ __align__(1024) float areg_smem[];
    float* buffers = areg_smem + STAGES_BYTES / 4;
    uint64_t* pre_in = reinterpret_cast<uint64_t*>(buffers + 2 * 64 * WG_STORE_LD);
    if (threadIdx.x == 0) mbar_init(&pre_in[0], 64), mbar_init(&pre_in[1], 64);  // seen after wg_areg_tiles' barrier
    const int n_cols = (N + 127) / 128, tiles = n_cols * ((M + 127) / 128);
    const int count = (int)blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int half = threadIdx.x / 128 - 1;  // of the consumers
    float* buf = buffers + half * 64 * WG_STORE_LD;
    int done = 0;  // the tiles this thread has ended: the phase of pre_in its next tile waits for
    wg_areg_tiles<S>(
        areg_smem, dY, lda, dY_map, M, K, b_split, n_cols, K_pad, blockIdx.x, gridDim.x, count,
        [&](const float (&acc)[64], int m0, int n0) {
            const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
            const int r0 = m0 + half * 64;
            mbar_wait(&pre_in[half], done++ & 1);  // the tile's rows of pre are in buf
#pragma unroll
            for (int i = 0; i < 64; i += 2) {  // each thread reads its elements of pre and writes theirs of dpre
                const int r = warp * 16 + g + 8 * ((i % 4) / 2), c = (i / 4) * 8 + 2 * t, n = n0 + c;
                float2* at = reinterpret_cast<float2*>(buf + r * WG_STORE_LD + c);
                const float2 x = *at, d = gemm_pair(acc[i], acc[i + 1], r0 + r, n, N, nullptr, 1.0f);
                *at = make_float2(gelu_bwd_of(d.x, x.x), gelu_bwd_of(d.y, x.y));
            }
            wg_store_bulk_send(buf, dpre, r0, n0, M, N, ldc, half);
        },
        [&](int m0, int n0, int) { gelu_pre_ahead(buf, &pre_in[half], pre, m0 + half * 64, n0, M, N, ldc); });
    wg_store_bulk_done();
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}
