// The tensor-core variant of the matrix products: the same function as matmul_fast.cuh's SGEMM, same
// arguments, at FP32 accuracy on the TF32 tensor cores (sm_80 and later).
//
//   C[z] (M x N, ldc) = alpha * op(A[z]) @ op(B[z]) + bias[n] + beta * C[z]     for z < gridDim.z
//
// Error-compensated TF32 ("3xTF32"): each FP32 operand x is split into a TF32 high part and the rest,
// x = hi + lo, and hi*hi + hi*lo + lo*hi go through the tensor cores (lo*lo lies below FP32's resolution).
// The tensor cores' own accumulation is not round-to-nearest FP32 and its error grows with K, so each k8
// step's three products go into a zeroed fragment that ordinary FP32 adds carry into the running sum: the
// error stays flat in K and below the SIMT kernel's (dev/NOTES.md has the measurements).
//
// A block computes a 128 x BN tile of C with 8 warps, each 32 columns wide: for BN = 128, 2 along M x 4
// along N, each warp 64 x 32 as 4 x 4 mma.m16n8k8 tiles; for BN = 64 (attention's d_k), 4 x 2, each 32 x 32. The tiles of A and B are copied into shared memory as they lie in global memory
// (cp.async, TC_STAGES deep, in dynamic shared memory, so no transposition is needed for any of the four layouts); the fragment
// loads read them K-contiguous or M/N-contiguous, padded so that a warp's loads hit 32 distinct banks.
// Within each k8 step the mma's logical k = t and t + 4 are read from the adjacent physical columns 2t and
// 2t + 1, for A and B alike (a relabelling of the sum's terms), so that a K-contiguous tile gives both
// halves of a fragment in one 8-byte load.
#pragma once
#include <cstdint>

#include "common.cuh"
#include "matmul_fast.cuh"  // enum Causal, aligned16

#define TC_BM 128
#define TC_THREADS 256
#ifndef TC_BK
#define TC_BK 32
#endif
#ifndef TC_STAGES
#define TC_STAGES 2
#endif
// How x is split into hi + lo. 0: both rounded to nearest TF32 (cvt.rna). 1: hi rounded to nearest by an
// integer add, lo = x - hi exactly, handed over as FP32 (the tensor core reads its top 19 bits).
#ifndef TC_SPLIT
#define TC_SPLIT 1
#endif

// k8 steps whose products the tensor cores sum before the FP32 add into the running sum
#ifndef TC_CHUNK
#define TC_CHUNK 1
#endif
#ifndef TC_MIN_BLOCKS
#define TC_MIN_BLOCKS 2  // blocks per SM the registers must allow: 128 registers a thread
#endif
// The dynamic shared memory a block takes: TC_STAGES stages of two tiles, at most 128 x (TC_BK + 8) floats
// each. Mirrored in microgpt/kernels/matmul_tc.py through source.int_constants.
enum TcLaunch : int { TC_SMEM_BYTES = TC_STAGES * 2 * TC_BM * (TC_BK + 8) * 4 };

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TC_AVAILABLE 1
#else
#define TC_AVAILABLE 0
#endif

// x = hi + lo
__device__ __forceinline__ void tf32_split(float x, uint32_t& hi, uint32_t& lo) {
#if TC_SPLIT == 0
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
    float rest = x - __uint_as_float(hi);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(rest));
#else
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
#endif
}

// d += a @ b for one m16n8k8 TF32 tile. Not volatile: the compiler may interleave independent tiles' mmas
// to hide their latency (volatile asm keeps program order, which serialises each tile's dependent chain).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if TC_AVAILABLE
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
// d = a @ b (the accumulator input is zero, so d needs no zeroing first)
__device__ __forceinline__ void mma_tf32_first(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if TC_AVAILABLE
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
#endif
}

// `bytes` (0..16) of global memory to shared memory, the rest of the 16 zero-filled
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, int bytes) {
#if TC_AVAILABLE
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(bytes));
#endif
}
__device__ __forceinline__ void cp_async4(float* smem, const float* gmem, int bytes) {
#if TC_AVAILABLE
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(gmem), "r"(bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if TC_AVAILABLE
    asm volatile("cp.async.commit_group;");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if TC_AVAILABLE
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

// One operand's tile in shared memory, as it lies in global memory: ROWS x COLS with COLS contiguous,
// ROWS along K (an M/N-contiguous operand, COLS = EXTENT, its 128 or 64 rows of C) or along M/N (a
// K-contiguous one, COLS = TC_BK). Row strides: COLS + 8 for K-contiguous tiles (8-byte fragment loads),
// COLS + 4 otherwise.
template <bool K_CONTIGUOUS, int EXTENT>
struct TcTile {
    static constexpr int ROWS = K_CONTIGUOUS ? EXTENT : TC_BK;
    static constexpr int COLS = K_CONTIGUOUS ? TC_BK : EXTENT;
    static constexpr int LD = COLS + (K_CONTIGUOUS ? 8 : 4);
    static constexpr int FLOATS = ROWS * LD;

    // copies rows [r0, r0 + ROWS) x columns [c0, c0 + COLS) of the row-major matrix p (ld), zero outside
    // [0, row_end) x [0, col_end)
    __device__ __forceinline__ static void load(float* s, const float* p, int ld, int r0, int c0, int row_end,
                                                int col_end, bool vec) {
        constexpr int CHUNKS = ROWS * COLS / 4;
        if (vec && r0 + ROWS <= row_end && c0 + COLS <= col_end) {  // wholly inside: no bounds to check
#pragma unroll
            for (int e = threadIdx.x; e < CHUNKS; e += TC_THREADS) {
                const int r = e / (COLS / 4), c = (e % (COLS / 4)) * 4;
                cp_async16(s + r * LD + c, p + (long long)(r0 + r) * ld + c0 + c, 16);
            }
            return;
        }
#pragma unroll
        for (int e = threadIdx.x; e < CHUNKS; e += TC_THREADS) {
            const int r = e / (COLS / 4), c = (e % (COLS / 4)) * 4;
            const int row = r0 + r, col = c0 + c;
            float* dst = s + r * LD + c;
            const bool in_row = row < row_end;
            const float* src = p + (long long)(in_row ? row : 0) * ld + col;
            if (vec) {
                const int n = in_row ? max(0, min(4, col_end - col)) : 0;
                cp_async16(dst, n > 0 ? src : p, 4 * n);
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const bool in = in_row && col + q < col_end;
                    cp_async4(dst + q, in ? src + q : p, in ? 4 : 0);
                }
            }
        }
    }
};

template <bool TA, bool TB, int BN>
__device__ __forceinline__ void gemm_tc_tile(float* C, const float* A, const float* B, const float* bias,
                                             int M, int N, int K, int lda, int ldb, int ldc, long long strideA,
                                             long long strideB, long long strideC, float alpha, float beta,
                                             Causal causal, float fill) {
#if TC_AVAILABLE
    constexpr int BM = TC_BM, BK = TC_BK, S = TC_STAGES, CH = TC_CHUNK;
    constexpr int WARPS_N = BN / 32, WARP_M = BM / (8 / WARPS_N), MI = WARP_M / 16;  // MI m16 tiles a warp
    using TileA = TcTile<!TA, BM>;  // A stored M x K is K-contiguous; transposed (K x M) it is M-contiguous
    using TileB = TcTile<TB, BN>;   // B stored N x K (transposed) is K-contiguous; K x N is N-contiguous
    static_assert(S * (TileA::FLOATS + TileB::FLOATS) * 4 <= TC_SMEM_BYTES, "TC_SMEM_BYTES holds the stages");
    extern __shared__ __align__(16) float tc_smem[];
    float* As = tc_smem;                       // S stages of TileA::FLOATS
    float* Bs = tc_smem + S * TileA::FLOATS;   // S stages of TileB::FLOATS
    A += blockIdx.z * strideA;
    B += blockIdx.z * strideB;
    C += blockIdx.z * strideC;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;                  // the fragment's row group and thread in it
    const int wm = (warp / WARPS_N) * WARP_M, wn = (warp % WARPS_N) * 32;  // this warp's corner of the tile

    if (causal == CAUSAL_OUT_LOWER && n0 > m0 + BM - 1) {  // wholly above the diagonal: constant
        for (int e = tid; e < BM * BN; e += TC_THREADS) {
            int m = m0 + e / BN, n = n0 + e % BN;
            if (m < M && n < N) C[(long long)m * ldc + n] = fill;
        }
        return;
    }
    const int k_begin = causal == CAUSAL_A_UPPER ? m0 : 0;
    const int k_end = causal == CAUSAL_A_LOWER ? min(K, m0 + BM) : K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    const bool vec_a = aligned16(A, lda), vec_b = aligned16(B, ldb);

    auto load = [&](int stage, int k0) {
        float *as = As + stage * TileA::FLOATS, *bs = Bs + stage * TileB::FLOATS;
        if (TA) TileA::load(as, A, lda, k0, m0, k_end, M, vec_a);  // A stored K x M
        else TileA::load(as, A, lda, m0, k0, M, k_end, vec_a);     // A stored M x K
        if (TB) TileB::load(bs, B, ldb, n0, k0, N, k_end, vec_b);  // B stored N x K
        else TileB::load(bs, B, ldb, k0, n0, k_end, N, vec_b);     // B stored K x N
    };

    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n_tiles) load(s, k_begin + s * BK);
        cp_async_commit();  // an empty group past the end keeps the count of groups in flight fixed
    }
    for (int kt = 0; kt < n_tiles; kt++) {
        cp_async_wait<S - 2>();  // tile kt has landed
        __syncthreads();         // ... for every thread, and every warp is done with the stage refilled next
        if (kt + S - 1 < n_tiles) load((kt + S - 1) % S, k_begin + (kt + S - 1) * BK);
        cp_async_commit();
        const float* as = As + (kt % S) * TileA::FLOATS;
        const float* bs = Bs + (kt % S) * TileB::FLOATS;
#pragma unroll
        for (int kc = 0; kc < BK; kc += 8 * CH) {
            uint32_t b_hi[CH][4][2], b_lo[CH][4][2];
#pragma unroll
            for (int c = 0; c < CH; c++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int n = wn + j * 8 + g, k = kc + 8 * c + 2 * t;
                    float b0, b1;
                    if (TB) {
                        float2 v = *reinterpret_cast<const float2*>(bs + n * TileB::LD + k);
                        b0 = v.x, b1 = v.y;
                    } else {
                        b0 = bs[k * TileB::LD + n], b1 = bs[(k + 1) * TileB::LD + n];
                    }
                    tf32_split(b0, b_hi[c][j][0], b_lo[c][j][0]);
                    tf32_split(b1, b_hi[c][j][1], b_lo[c][j][1]);
                }
#pragma unroll
            for (int i = 0; i < MI; i++) {
                uint32_t a_hi[CH][4], a_lo[CH][4];
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    const int m = wm + i * 16 + g, k = kc + 8 * c + 2 * t;
                    float a[4];  // (m, k), (m + 8, k), (m, k + 4), (m + 8, k + 4) in the mma's logical k
                    if (TA) {
                        a[0] = as[k * TileA::LD + m], a[1] = as[k * TileA::LD + m + 8];
                        a[2] = as[(k + 1) * TileA::LD + m], a[3] = as[(k + 1) * TileA::LD + m + 8];
                    } else {
                        float2 u = *reinterpret_cast<const float2*>(as + m * TileA::LD + k);
                        float2 w = *reinterpret_cast<const float2*>(as + (m + 8) * TileA::LD + k);
                        a[0] = u.x, a[1] = w.x, a[2] = u.y, a[3] = w.y;
                    }
#pragma unroll
                    for (int r = 0; r < 4; r++) tf32_split(a[r], a_hi[c][r], a_lo[c][r]);
                }
                // this chunk's products of the four tiles of row block i, the small ones first; each stage
                // issues four independent mmas
                float p[4][4];
#pragma unroll
                for (int c = 0; c < CH; c++) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (c == 0) mma_tf32_first(p[j], a_lo[c], b_hi[c][j]);
                        else mma_tf32(p[j], a_lo[c], b_hi[c][j]);
                    }
#pragma unroll
                    for (int j = 0; j < 4; j++) mma_tf32(p[j], a_hi[c], b_lo[c][j]);
#pragma unroll
                    for (int j = 0; j < 4; j++) mma_tf32(p[j], a_hi[c], b_hi[c][j]);
                }
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) acc[i][j][r] += p[j][r];
            }
        }
    }
    cp_async_wait<0>();  // no copy may outlive the block (the empty groups, past the end)

    // acc[i][j]: rows m, m + 8 (r / 2), columns n, n + 1 (r % 2)
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int m = m0 + wm + i * 16 + g + 8 * (r / 2);
            if (m >= M) continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int n = n0 + wn + j * 8 + 2 * t + r % 2;
                if (n >= N) continue;
                long long o = (long long)m * ldc + n;
                float v = alpha * acc[i][j][r];
                if (bias != nullptr) v += bias[n];
                if (beta != 0.0f) v += beta * C[o];
                if (causal == CAUSAL_OUT_LOWER && n > m) v = fill;
                C[o] = v;
            }
        }
#else
    __trap();  // the launchers never choose this variant below sm_80
#endif
}

// One kernel per (layout, tile width), named k_gemm_tc_<op(A)><op(B)>, with _n64 for the 128 x 64 tile;
// the SGEMM's arguments.
#define GEMM_TC_KERNEL(name, TA, TB, BN)                                                                       \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS)                                    \
    name(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda, int ldb,   \
         int ldc, long long strideA, long long strideB, long long strideC, float alpha, float beta,            \
         Causal causal, float fill) {                                                                          \
        gemm_tc_tile<TA, TB, BN>(C, A, B, bias, M, N, K, lda, ldb, ldc, strideA, strideB, strideC, alpha,     \
                                 beta, causal, fill);                                                                  \
    }
GEMM_TC_KERNEL(k_gemm_tc_nn, false, false, 128)
GEMM_TC_KERNEL(k_gemm_tc_nn_n64, false, false, 64)
GEMM_TC_KERNEL(k_gemm_tc_nt, false, true, 128)
GEMM_TC_KERNEL(k_gemm_tc_nt_n64, false, true, 64)
GEMM_TC_KERNEL(k_gemm_tc_tn, true, false, 128)
GEMM_TC_KERNEL(k_gemm_tc_tn_n64, true, false, 64)
GEMM_TC_KERNEL(k_gemm_tc_tt, true, true, 128)
GEMM_TC_KERNEL(k_gemm_tc_tt_n64, true, true, 64)
#undef GEMM_TC_KERNEL
