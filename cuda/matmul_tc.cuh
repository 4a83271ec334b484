// The tensor-core variant of the matrix products (sm_80 and later): matmul_fast.cuh's SGEMM, same function and
// arguments, at FP32 accuracy on the TF32 tensor cores by error-compensated TF32 ("3xTF32"): each operand x = hi +
// lo, hi its TF32 part, and hi*hi + hi*lo + lo*hi go through the tensor cores, each short slice of K's products added
// into an FP32 running sum. Where a_sums is given, the wgmma kernels with A transposed (k_gemm_wg_t*) also give the
// row sums of op(A), a linear layer's bias gradient from the dout its dW product reads anyway:
//   a_sums[m] += sum_k op(A)[m][k] (gridDim.z = 1);  a_sums[z * M + m] = sum_k op(A[z])[m][k] (split-K's slices)
#pragma once
#include <cstdint>

#include "common.cuh"
#include "matmul_fast.cuh"  // enum Causal, aligned16, aligned8, gemm_value

#define TC_BM 128
#define TC_THREADS 256
#ifndef TC_BK
#define TC_BK 32
#endif
#ifndef TC_STAGES
#define TC_STAGES 2
#endif
// How x is split into hi + lo. 0: both rounded to nearest TF32 (cvt.rna). 1: hi rounded to nearest by an
// integer add, lo = x - hi exactly, handed over as FP32 (the tensor core reads its top 19 bits). Either way an
// operand within 4096 ulps of FLT_MAX (|x| >= 3.4025e38) rounds hi up to inf, so a product that FP32 would
// still give finitely (times a factor below 1) comes out inf or NaN; the model's values are far from there.
#ifndef TC_SPLIT
#define TC_SPLIT 1
#endif

// k8 steps whose products the tensor cores sum before the FP32 add into the running sum
#ifndef TC_CHUNK
#define TC_CHUNK 1
#endif
#ifndef TC_MIN_BLOCKS
#define TC_MIN_BLOCKS 2  // blocks per SM the registers must allow: 128 registers per thread
#endif
// The wgmma path's stages: split buffers (of four 128 x 32 tiles: A hi, A lo, B hi, B lo) and raw stages (the
// two 128 x 32 tiles as they lie in global memory).
#ifndef WG_BUFS
#define WG_BUFS 2
#endif
#ifndef WG_RAW
#define WG_RAW 3
#endif
// The A-from-registers kernels' stages: k_gemm_wg_areg's and k_gemm_wg_areg_tn's each B hi, B lo and raw A (the TN
// kernel's B copied raw into B lo's place, where its producer splits it)
#ifndef WG_AREG_STAGES
#define WG_AREG_STAGES 4
#endif
#ifndef WG_AREG_TN_STAGES
#define WG_AREG_TN_STAGES 4
#endif
// k_gemm_wg_areg's stages: one fewer, so that its two store buffers fit beside them (WG_STORE_LD: a buffer's row of
// 128 floats padded, 16-byte aligned, and a warp's 8-byte writes of a fragment on 32 distinct banks)
#ifndef WG_AREG_STORE_STAGES
#define WG_AREG_STORE_STAGES 3
#endif
#define WG_STORE_LD 136
// k_gemm_wg_areg's and the fused kernels' stage: B hi and lo (128 x 32 each) and raw A (128 rows of 36)
#define WG_AREG_STAGE_BYTES ((2 * 128 * 32 + 128 * 36) * 4)
#define WG_STORE_BYTES (2 * 64 * WG_STORE_LD * 4)
// Launch sizes, mirrored in microgpt/kernels/matmul_tc.py through source.int_constants: each kernel's dynamic shared
// memory (mma.sync: TC_STAGES stages of two tiles of up to 128 x (TC_BK + 8) floats; wgmma: buffers, raw stages and
// an mbarrier pair per buffer; k_gemm_wg_areg, k_gemm_wg_areg_tn, the fused kernels on wg_areg_tiles: their stages
// and an mbarrier pair per stage, and k_gemm_wg_areg its two store buffers too), the
// wgmma kernels' threads (three warpgroups), and the split operands' padding (rows to TC_SPLIT_ROWS, K to TC_SPLIT_K:
// whole tiles, so the copies check no bounds), and the box of the tensor maps over A that wg_areg_tiles copies by.
enum TcLaunch : int {
    TC_SMEM_BYTES = TC_STAGES * 2 * TC_BM * (TC_BK + 8) * 4,
    TC_WG_SMEM_BYTES = WG_BUFS * 4 * 128 * 32 * 4 + WG_RAW * 2 * 128 * 32 * 4 + 2 * WG_BUFS * 8,
    TC_WG_THREADS = 384,
    TC_AREG_SMEM_BYTES = WG_AREG_STAGES * (WG_AREG_STAGE_BYTES + 2 * 8),
    TC_AREG_TN_SMEM_BYTES = WG_AREG_TN_STAGES * (2 * 128 * 32 + 32 * 136) * 4 + 2 * WG_AREG_TN_STAGES * 8,
    TC_AREG_STORE_SMEM_BYTES = WG_AREG_STORE_STAGES * (WG_AREG_STAGE_BYTES + 2 * 8) + WG_STORE_BYTES,
    TC_SPLIT_ROWS = 128,
    TC_SPLIT_K = 32,
    TC_A_BOX_COLS = 36,  // a tensor map's box over A for wg_areg_tiles: one raw slice, its padding included
    TC_A_BOX_ROWS = 128,
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TC_AVAILABLE 1
#else
#define TC_AVAILABLE 0
#endif
// wgmma is sm_90a's (the engine builds for sm_90a on compute capability 9.0)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_AVAILABLE 1
#else
#define WG_AVAILABLE 0
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

// v's 4 floats split, their hi at hi + at and their lo at lo + at (16-byte aligned), as TF32 bit patterns
__device__ __forceinline__ void tf32_split_store(void* hi, void* lo, int at, float4 v) {
    uint32_t h[4], l[4];
    tf32_split(v.x, h[0], l[0]);
    tf32_split(v.y, h[1], l[1]);
    tf32_split(v.z, h[2], l[2]);
    tf32_split(v.w, h[3], l[3]);
    reinterpret_cast<uint4*>(static_cast<uint32_t*>(hi) + at)[0] = make_uint4(h[0], h[1], h[2], h[3]);
    reinterpret_cast<uint4*>(static_cast<uint32_t*>(lo) + at)[0] = make_uint4(l[0], l[1], l[2], l[3]);
}

// The sum of v over the 4 lanes of the thread's quad (lanes 4q .. 4q + 3; the threads of an mma fragment's row),
// on each of them: every lane adds the same pairs, (t0 + t1) + (t2 + t3), so all four end with the same bits.
template <class T>
__device__ __forceinline__ T quad_sum(T v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// ... and the largest of v over the quad, on each of its lanes
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
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
// n (0..4) floats at gmem (16-byte aligned; `safe` any valid address, read where n = 0) to smem, the rest of the 4
// zero-filled: one 16-byte copy where n is 0 or 4, else n copies of 4 bytes, so that no read passes gmem + n (where
// a matrix's last row ends its allocation)
__device__ __forceinline__ void cp_async_upto4(float* smem, const float* gmem, int n, const float* safe) {
    if (n == 0 || n == 4) {
        cp_async16(smem, n ? gmem : safe, 4 * n);
        return;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) cp_async4(smem + q, q < n ? gmem + q : safe, q < n ? 4 : 0);
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

// One Vec (float, or float4: both addresses 16-byte aligned) from global to shared memory: by cp.async from sm_80
// (cp_async_commit, cp_async_wait and a barrier before another thread reads it), a plain copy before.
template <typename Vec>
__device__ __forceinline__ void copy_to_shared(float* smem, const float* gmem) {
#if TC_AVAILABLE
    if (sizeof(Vec) == 16) cp_async16(smem, gmem, 16);
    else cp_async4(smem, gmem, 4);
#else
    *reinterpret_cast<Vec*>(smem) = *reinterpret_cast<const Vec*>(gmem);
#endif
}

// One operand's tile in shared memory, as it lies in global memory: ROWS x COLS with COLS contiguous,
// ROWS along K (an M/N-contiguous operand, COLS = EXTENT, its 128 or 64 rows of C) or along M/N (a
// K-contiguous one, COLS = TC_BK). Row strides: COLS + 8 for K-contiguous tiles (8-byte fragment loads),
// COLS + 4 otherwise.
template <bool K_CONTIGUOUS, int EXTENT, int BK = TC_BK, int PAD = (K_CONTIGUOUS ? 8 : 4)>
struct TcTile {
    static constexpr int ROWS = K_CONTIGUOUS ? EXTENT : BK;
    static constexpr int COLS = K_CONTIGUOUS ? BK : EXTENT;
    static constexpr int LD = COLS + PAD;
    static constexpr int FLOATS = ROWS * LD;

    // copies rows [r0, r0 + ROWS) x columns [c0, c0 + COLS) of the row-major matrix p (ld), zero outside
    // [0, row_end) x [0, col_end); thread `tid` of THREADS copies every THREADS-th 16-byte chunk
    template <int THREADS = TC_THREADS>
    __device__ __forceinline__ static void load(float* s, const float* p, int ld, int r0, int c0, int row_end,
                                                int col_end, bool vec, int tid) {
        constexpr int CHUNKS = ROWS * COLS / 4;
        if (vec && r0 + ROWS <= row_end && c0 + COLS <= col_end) {  // wholly inside: no bounds to check
#pragma unroll
            for (int e = tid; e < CHUNKS; e += THREADS) {
                const int r = e / (COLS / 4), c = (e % (COLS / 4)) * 4;
                cp_async16(s + r * LD + c, p + (long long)(r0 + r) * ld + c0 + c, 16);
            }
            return;
        }
#pragma unroll
        for (int e = tid; e < CHUNKS; e += THREADS) {
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

    // elements (mn, k4 .. k4 + 3) of the tile read K-major: row mn of A's (or B's) rows, four consecutive k
    __device__ __forceinline__ static float4 k_quad(const float* s, int mn, int k4) {
        if (K_CONTIGUOUS) return *reinterpret_cast<const float4*>(s + mn * LD + k4);
        return make_float4(s[k4 * LD + mn], s[(k4 + 1) * LD + mn], s[(k4 + 2) * LD + mn], s[(k4 + 3) * LD + mn]);
    }
};

// The mma.sync kernel: a block computes a 128 x BN tile of C with 8 warps of 32 columns, the tiles of A and B copied
// into shared memory as they lie in global memory (cp.async, TC_STAGES deep). Each k8 step's logical k = t and t + 4
// are read from physical columns 2t and 2t + 1, so that a K-contiguous tile gives a fragment in one 8-byte load.
template <bool TA, bool TB, int BN>
__device__ __forceinline__ void gemm_tc_tile(float* C, const float* A, const float* B, const float* bias,
                                             int M, int N, int K, int lda, int ldb, int ldc, long long strideA,
                                             long long strideB, long long strideC, float alpha, float beta,
                                             Causal causal, float fill, float* /* a_sums: the launchers pass 0 */) {
#if TC_AVAILABLE
    constexpr int BM = TC_BM, BK = TC_BK, S = TC_STAGES, CH = TC_CHUNK;
    constexpr int WARPS_N = BN / 32, WARP_M = BM / (8 / WARPS_N), MI = WARP_M / 16;  // MI m16 tiles per warp
    using TileA = TcTile<!TA, BM>;  // A stored M x K is K-contiguous; transposed (K x M) it is M-contiguous
    using TileB = TcTile<TB, BN>;   // B stored N x K (transposed) is K-contiguous; K x N is N-contiguous
    static_assert(S * (TileA::FLOATS + TileB::FLOATS) * 4 <= TC_SMEM_BYTES, "TC_SMEM_BYTES holds the stages");
    extern __shared__ __align__(1024) float tc_smem[];  // 1024: the wgmma path's swizzled tiles
    float* As = tc_smem;                       // S stages of TileA::FLOATS
    float* Bs = tc_smem + S * TileA::FLOATS;   // S stages of TileB::FLOATS
    A += blockIdx.z * strideA;
    B += blockIdx.z * strideB;
    C += blockIdx.z * strideC;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;                  // the fragment's row group and thread in it
    const int wm = (warp / WARPS_N) * WARP_M, wn = (warp % WARPS_N) * 32;  // this warp's corner of the tile

    if (causal == CAUSAL_OUT_LOWER && gemm_fill_above_diagonal<BN>(C, m0, n0, M, N, ldc, fill)) return;
    const int k_begin = causal == CAUSAL_A_UPPER ? m0 : 0;
    const int k_end = causal == CAUSAL_A_LOWER ? min(K, m0 + BM) : K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    const bool vec_a = aligned16(A, lda), vec_b = aligned16(B, ldb);

    auto load = [&](int stage, int k0) {
        float *as = As + stage * TileA::FLOATS, *bs = Bs + stage * TileB::FLOATS;
        if (TA) TileA::load(as, A, lda, k0, m0, k_end, M, vec_a, tid);  // A stored K x M
        else TileA::load(as, A, lda, m0, k0, M, k_end, vec_a, tid);     // A stored M x K
        if (TB) TileB::load(bs, B, ldb, n0, k0, N, k_end, vec_b, tid);  // B stored N x K
        else TileB::load(bs, B, ldb, k0, n0, k_end, N, vec_b, tid);     // B stored K x N
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
                gemm_store(C, acc[i][j][r], m, n, ldc, bias, alpha, beta, causal, fill);
            }
        }
#else
    __trap();  // the launchers never choose this variant below sm_80
#endif
}

// One kernel per (layout, tile width), named k_gemm_tc_<op(A)><op(B)>, with _n64 for the 128 x 64 tile
// (GEMM_KERNEL of matmul_fast.cuh: the SGEMM's arguments).
#define GEMM_TC_KERNEL(name, TA, TB, BN) GEMM_KERNEL(name, gemm_tc_tile, TA, TB, BN, TC_THREADS, TC_MIN_BLOCKS)
GEMM_TC_KERNEL(k_gemm_tc_nn, false, false, 128)
GEMM_TC_KERNEL(k_gemm_tc_nn_n64, false, false, 64)
GEMM_TC_KERNEL(k_gemm_tc_nt, false, true, 128)
GEMM_TC_KERNEL(k_gemm_tc_nt_n64, false, true, 64)
GEMM_TC_KERNEL(k_gemm_tc_tn, true, false, 128)
GEMM_TC_KERNEL(k_gemm_tc_tn_n64, true, false, 64)
GEMM_TC_KERNEL(k_gemm_tc_tt, true, true, 128)
GEMM_TC_KERNEL(k_gemm_tc_tt_n64, true, true, 64)
#undef GEMM_TC_KERNEL

// ---------------------------------------------------------------------------------------------- wgmma (sm_90a)
// The same product on Hopper's warpgroup MMA (operands from shared memory, K-major for TF32). A block of three
// warpgroups computes a 128 x BN tile of C, one job each, so that the tensor cores do not wait for the split:
// warpgroup 0 (the producer) copies each 32-wide slice of K (WG_RAW stages), splits it into hi and lo, swizzled, in
// one of WG_BUFS buffers and marks it full; warpgroups 1 and 2 (the consumers) each multiply 64 rows, add the
// products into an FP32 running sum and mark the buffer empty. One block per SM (224 KB of shared memory).
#define WG_BK 32
#define WG_SPLIT (128 * WG_BK)  // floats of one split tile
#define WG_PRODUCERS 128        // the threads of warpgroup 0

// 128 rows x 32 floats, 128-byte rows; the 16-byte chunk c of row r is stored at chunk c ^ (r % 8)
__device__ __forceinline__ int wg_swizzled(int r, int k4) { return r * WG_BK + (((k4 >> 2) ^ (r & 7)) << 2); }

// v[0] + ... + v[N - 1] (N a power of two) as a pairwise tree, in place: a slice's 32 values of A
template <int N>
__device__ __forceinline__ float pairwise_sum(float (&v)[N]) {
    static_assert((N & (N - 1)) == 0, "a power of two");
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i < N; i += 2 * w) v[i] += v[i + w];
    return v[0];
}

// A running FP32 sum that keeps each add's rounding error (Knuth's TwoSum) and adds them back at the end, so that a
// long sum of the slices' sums is about as accurate as the slices' own trees allow. No multiplies (nothing to
// contract into an FMA) and one fixed order: the same bits every run.
struct CompensatedSum {
    float sum = 0.0f, err = 0.0f;
    __device__ __forceinline__ void add(float x) {
        const float t = sum + x, x_part = t - sum;
        err += (sum - (t - x_part)) + (x - x_part);
        sum = t;
    }
    // past FLT_MAX the errors are inf - inf: the sum's own inf, as a plain sum would give
    __device__ __forceinline__ float value() const { return isfinite(sum) ? sum + err : sum; }
};

// the shared-memory descriptor of a K-major, 128B-swizzled tile: 8-row groups 1024 bytes apart
__device__ __forceinline__ uint64_t wg_desc(const float* tile) {
    uint64_t addr = static_cast<uint64_t>(__cvta_generic_to_shared(tile));
    return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

// The buffers' barriers (mbarrier, phase parity): `count` arrivals complete a phase.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if WG_AVAILABLE
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {  // release: what this thread wrote is seen
#if WG_AVAILABLE
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}" ::"r"(smem_u32(bar))
                 : "memory");
#endif
}
// the phase of bar waits for `bytes` more, from copies that count them (complete_tx); no arrival
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if WG_AVAILABLE
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {  // until the phase of this parity completes
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
#endif
}

// count pairs of the buffers' barriers, full[i] (the producer's arrivals complete a phase: filled) and empty[i] (the
// consumers': multiplied), set up by thread 0 before any thread of the block uses them
__device__ __forceinline__ void wg_init_barriers(uint64_t* full, uint64_t* empty, int count) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < count; i++) {
            mbar_init(&full[i], WG_PRODUCERS);
            mbar_init(&empty[i], TC_WG_THREADS - WG_PRODUCERS);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the barriers seen by the bulk copies too
    }
    __syncthreads();
}

// d (+)= a @ b over one k8 step for the warpgroup's 64 x 128 tile; accumulate = 0 overwrites d
__device__ __forceinline__ void wgmma_tf32(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
#endif
}

// the same for a 64 x 64 tile (the 128 x 64 block tile of attention's products, N = d_k)
__device__ __forceinline__ void wgmma_tf32(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
#endif
}

// The consumers' steps, shared by the wgmma kernels (FRAG: a thread's share of its warpgroup's 64 x BN tile).
// A slice's 12 wgmmas into part, committed as one group: 4 k8 steps (32 bytes along the rows apart) of lo*hi,
// hi*lo, hi*hi, small products first; a descriptor's address field counts 16 bytes.
template <int FRAG>
__device__ __forceinline__ void wg_slice_products(float (&part)[FRAG], uint64_t a_hi, uint64_t a_lo, uint64_t b_hi,
                                                  uint64_t b_lo) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < WG_BK / 4; kk += 2) {
        wgmma_tf32(part, a_lo + kk, b_hi + kk, kk > 0);
        wgmma_tf32(part, a_hi + kk, b_lo + kk, 1);
        wgmma_tf32(part, a_hi + kk, b_hi + kk, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// until every wgmma group this thread has issued is done
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// once the slice's group is done: its buffer back to the producer (empty), its products into the running sum
template <int FRAG>
__device__ __forceinline__ void wg_add_slice(float (&acc)[FRAG], float (&part)[FRAG], uint64_t* empty) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < FRAG; i++) asm volatile("" : "+f"(part[i])::"memory");  // read only after the wait
    mbar_arrive(empty);
#pragma unroll
    for (int i = 0; i < FRAG; i++) acc[i] += part[i];
}

// the warpgroup's rows m0.. of C, gemm_store's values: acc[i] is column 8 (i / 4) + 2t (+1 for odd i), row 16 warp +
// g (+8 for i % 4 >= 2) of its 64. A thread's two columns go together (8 bytes) where C's rows are 8-byte aligned,
// one by one otherwise. Where beta != 0, the C of 32 values at a time is read before they are stored, so that the
// reads overlap (a read after each store would wait for it: the compiler cannot tell C's elements apart).
template <int FRAG>
__device__ __forceinline__ void wg_store(float* C, const float (&acc)[FRAG], int m0, int n0, int M, int N, int ldc,
                                         const float* bias, float alpha, float beta, Causal causal, float fill) {
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const bool pairs = aligned8(C, ldc);
    constexpr int AT_ONCE = FRAG < 32 ? FRAG : 32;
#pragma unroll
    for (int i0 = 0; i0 < FRAG; i0 += AT_ONCE) {
        float2 before[AT_ONCE / 2];
#pragma unroll
        for (int i = i0; i < i0 + AT_ONCE; i += 2) {
            const int m = m0 + warp * 16 + g + 8 * ((i % 4) / 2);
            const int n = n0 + (i / 4) * 8 + 2 * t;
            const float* c = C + (long long)m * ldc + n;
            float2 b = make_float2(0.0f, 0.0f);
            if (beta != 0.0f && m < M && n < N) {
                if (pairs && n + 1 < N) b = *reinterpret_cast<const float2*>(c);
                else b = make_float2(c[0], n + 1 < N ? c[1] : 0.0f);
            }
            before[(i - i0) / 2] = b;
        }
#pragma unroll
        for (int i = i0; i < i0 + AT_ONCE; i += 2) {
            const int m = m0 + warp * 16 + g + 8 * ((i % 4) / 2);
            const int n = n0 + (i / 4) * 8 + 2 * t;
            if (m >= M || n >= N) continue;
            float* c = C + (long long)m * ldc + n;
            const float2 b = before[(i - i0) / 2];
            const float v0 = gemm_value(acc[i], b.x, m, n, bias, alpha, beta, causal, fill);
            if (n + 1 < N) {
                const float v1 = gemm_value(acc[i + 1], b.y, m, n + 1, bias, alpha, beta, causal, fill);
                if (pairs) *reinterpret_cast<float2*>(c) = make_float2(v0, v1);
                else c[0] = v0, c[1] = v1;
            } else {
                c[0] = v0;
            }
        }
    }
}

// gemm_value at beta = 0 (alpha * acc + bias[n]) of a thread's two columns n and n + 1 of row m, each 0 past N
__device__ __forceinline__ float2 gemm_pair(float a0, float a1, int m, int n, int N, const float* bias, float alpha) {
    return make_float2(n < N ? gemm_value(a0, 0.0f, m, n, bias, alpha, 0.0f, CAUSAL_NONE, 0.0f) : 0.0f,
                       n + 1 < N ? gemm_value(a1, 0.0f, m, n + 1, bias, alpha, 0.0f, CAUSAL_NONE, 0.0f) : 0.0f);
}

// *c += v as a reduction the memory system applies (sm_90)
__device__ __forceinline__ void red_add(float* c, float v) {
#if WG_AVAILABLE
    asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(c), "f"(v) : "memory");
#endif
}
// ... c[0] += v.x, c[1] += v.y as one (c 8-byte aligned)
__device__ __forceinline__ void red_add_pair(float* c, float2 v) {
#if WG_AVAILABLE
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(c), "f"(v.x), "f"(v.y) : "memory");
#endif
}

// wg_store's C = gemm_value(acc, C, ..) for beta = 1 and no causal fill, as reductions the memory system applies:
// C[m][n] += alpha * acc (+ bias[n]), one red.add a value, or one for each pair of columns where C's rows are 8-byte
// aligned. Nothing of C comes back to the SM, so the threads go on as soon as the reductions are issued. The sums are
// gemm_value's (one rounding of C + v), but red.add.f32 flushes a subnormal addend, value of C or sum to zero.
template <int FRAG>
__device__ __forceinline__ void wg_store_add(float* C, const float (&acc)[FRAG], int m0, int n0, int M, int N,
                                             int ldc, const float* bias, float alpha) {
#if WG_AVAILABLE
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const bool pairs = aligned8(C, ldc);
    if (pairs && bias == nullptr && m0 + 64 <= M && n0 + FRAG * 2 <= N) {  // inside C: no checks, two row pointers
        float* c = C + (long long)(m0 + warp * 16 + g) * ldc + n0 + 2 * t;  // rows g and g + 8, columns 8 apart
        float* c8 = c + 8LL * ldc;
#pragma unroll
        for (int i = 0; i < FRAG; i += 4) {
            red_add_pair(c + i * 2, make_float2(alpha * acc[i], alpha * acc[i + 1]));
            red_add_pair(c8 + i * 2, make_float2(alpha * acc[i + 2], alpha * acc[i + 3]));
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < FRAG; i += 2) {
        const int m = m0 + warp * 16 + g + 8 * ((i % 4) / 2);
        const int n = n0 + (i / 4) * 8 + 2 * t;
        if (m >= M || n >= N) continue;
        float* c = C + (long long)m * ldc + n;
        const float2 v = gemm_pair(acc[i], acc[i + 1], m, n, N, bias, alpha);  // what is added
        if (pairs && n + 1 < N) {
            red_add_pair(c, v);
        } else {
            red_add(c, v.x);
            if (n + 1 < N) red_add(c + 1, v.y);
        }
    }
#endif
}

template <bool TA, bool TB, int BN>
__device__ __forceinline__ void gemm_wg_tile(float* C, const float* A, const float* B, const float* bias,
                                             int M, int N, int K, int lda, int ldb, int ldc, long long strideA,
                                             long long strideB, long long strideC, float alpha, float beta,
                                             Causal causal, float fill, float* a_sums) {
#if WG_AVAILABLE
    // as in global memory: K-contiguous, or M-contiguous transposed; unpadded, as the producer reads a
    // row's consecutive chunks (K-contiguous) or a k's consecutive floats (M-contiguous) across a warp
    using RawA = TcTile<!TA, 128, WG_BK, 0>;
    using RawB = TcTile<TB, BN, WG_BK, 0>;
    constexpr int RAW = RawA::FLOATS + RawB::FLOATS;
    static_assert(WG_BUFS * 4 * WG_SPLIT * 4 + WG_RAW * RAW * 4 + 2 * WG_BUFS * 8 <= TC_WG_SMEM_BYTES, "smem");
    extern __shared__ __align__(1024) float tc_smem[];
    float* split = tc_smem;                            // [WG_BUFS][A hi, A lo, B hi, B lo][128 x 32], 1024-aligned
    float* raw = tc_smem + WG_BUFS * 4 * WG_SPLIT;     // [WG_RAW][RawA, RawB]
    uint64_t* full = reinterpret_cast<uint64_t*>(raw + WG_RAW * RAW);  // [WG_BUFS]: split, for the consumers
    uint64_t* empty = full + WG_BUFS;                                  // [WG_BUFS]: multiplied, for the producer
    A += blockIdx.z * strideA;
    B += blockIdx.z * strideB;
    C += blockIdx.z * strideC;
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * BN;

    if (causal == CAUSAL_OUT_LOWER && gemm_fill_above_diagonal<BN>(C, m0, n0, M, N, ldc, fill)) return;
    const int k_begin = causal == CAUSAL_A_UPPER ? m0 : 0;
    const int k_end = causal == CAUSAL_A_LOWER ? min(K, m0 + 128) : K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + WG_BK - 1) / WG_BK : 0;
    wg_init_barriers(full, empty, WG_BUFS);
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

    if (wg == 0) {  // ------------------------------------------------ the producer: copy and split
        const bool vec_a = aligned16(A, lda), vec_b = aligned16(B, ldb);
        auto load = [&](int stage, int k0) {
            float *ra = raw + stage * RAW, *rb = ra + RawA::FLOATS;
            if (TA) RawA::template load<WG_PRODUCERS>(ra, A, lda, k0, m0, k_end, M, vec_a, tid);  // K x M
            else RawA::template load<WG_PRODUCERS>(ra, A, lda, m0, k0, M, k_end, vec_a, tid);     // M x K
            if (TB) RawB::template load<WG_PRODUCERS>(rb, B, ldb, n0, k0, N, k_end, vec_b, tid);  // N x K
            else RawB::template load<WG_PRODUCERS>(rb, B, ldb, k0, n0, k_end, N, vec_b, tid);     // K x N
        };
#pragma unroll
        for (int i = 0; i < WG_RAW - 1; i++) {
            if (i < n_tiles) load(i, k_begin + i * WG_BK);
            cp_async_commit();
        }
        // A stored K x M: thread tid's quads are A[k][m0 + tid] for every k of the slice (mn_a below), so each
        // thread sums its own m over all of K with no exchange between threads. One column tile's blocks do
        // it, the others' would repeat it; the tile's zero fill past M and K adds nothing.
        static_assert(WG_PRODUCERS == 128, "a producer thread per row of the 128-row tile");
        constexpr int QUADS = 128 * WG_BK / 4 / WG_PRODUCERS;
        const bool sum_rows = TA && a_sums != nullptr && blockIdx.x == 0;
        CompensatedSum row_sum;
        for (int kt = 0; kt < n_tiles; kt++) {
            cp_async_wait<WG_RAW - 2>();                       // this thread's copies of slice kt have landed
            asm volatile("bar.sync 1, %0;" ::"n"(WG_PRODUCERS) : "memory");  // ... every producer's; and
            const int next = kt + WG_RAW - 1;                  // all are done splitting slice kt - 1
            if (next < n_tiles) load(next % WG_RAW, k_begin + next * WG_BK);
            cp_async_commit();
            const int buf = kt % WG_BUFS;
            mbar_wait(&empty[buf], ((kt / WG_BUFS) & 1) ^ 1);  // the consumers are done with its last slice
            const float* ra = raw + (kt % WG_RAW) * RAW;
            const float* rb = ra + RawA::FLOATS;
            float* s = split + buf * 4 * WG_SPLIT;
            float quad_sums[QUADS];
#pragma unroll
            for (int q = 0; q < QUADS; q++) {  // quads along the raw tile's rows
                const int e = tid + q * WG_PRODUCERS;
                const int mn_a = TA ? e % 128 : e / 8, k4_a = TA ? (e / 128) * 4 : (e % 8) * 4;
                const float4 a = RawA::k_quad(ra, mn_a, k4_a);
                tf32_split_store(s, s + WG_SPLIT, wg_swizzled(mn_a, k4_a), a);
                if (sum_rows) quad_sums[q] = (a.x + a.y) + (a.z + a.w);
                if (q < BN * WG_BK / 4 / WG_PRODUCERS) {  // B's BN rows (of the tile's 128)
                    const int mn_b = TB ? e / 8 : e % BN, k4_b = TB ? (e % 8) * 4 : (e / BN) * 4;
                    tf32_split_store(s + 2 * WG_SPLIT, s + 3 * WG_SPLIT, wg_swizzled(mn_b, k4_b),
                                   RawB::k_quad(rb, mn_b, k4_b));
                }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // what was stored, the tensor cores read
            mbar_arrive(&full[buf]);
            if (sum_rows) row_sum.add(pairwise_sum(quad_sums));  // after the arrive: off the consumers' wait
        }
        if (sum_rows && m0 + tid < M) {  // the block owns rows m0.. of a_sums: no other writes them
            if (gridDim.z == 1) a_sums[m0 + tid] += row_sum.value();
            else a_sums[(long long)blockIdx.z * M + m0 + tid] = row_sum.value();
        }
        return;
    }

    // ---------------------------------------------------------------- the consumers: multiply and sum
    constexpr int FRAG = BN / 2;  // a thread's share of its warpgroup's 64 x BN
    const int half = wg - 1;      // rows 64 half .. 64 half + 63 of the tile
    float acc[FRAG];
#pragma unroll
    for (int i = 0; i < FRAG; i++) acc[i] = 0.0f;
    // slice kt's tiles: a descriptor's address field counts 16 bytes (4 floats), so tiles further on add offset / 4
    const uint64_t d_split = wg_desc(split);
    float part[FRAG];
    for (int kt = 0; kt < n_tiles; kt++) {
        const int buf = kt % WG_BUFS;
        mbar_wait(&full[buf], (kt / WG_BUFS) & 1);
        const uint64_t a_hi = d_split + (buf * 4 * WG_SPLIT + half * 64 * WG_BK) / 4,
                       b_hi = d_split + (buf * 4 + 2) * WG_SPLIT / 4;
        wg_slice_products(part, a_hi, a_hi + WG_SPLIT / 4, b_hi, b_hi + WG_SPLIT / 4);
        wg_add_slice(acc, part, &empty[buf]);
    }
    wg_store(C, acc, m0 + half * 64, n0, M, N, ldc, bias, alpha, beta, causal, fill);
#else
    __trap();  // the launchers choose this path on sm_90a only
#endif
}

// One kernel per layout and tile width, k_gemm_wg_<op(A)><op(B)>[_n64]; the SGEMM's arguments (a_sums: the
// _t* kernels'). The 128 x 128 tile of A stored K x M and B stored K x N is k_gemm_wg_areg_tn's (below).
#define GEMM_WG_KERNEL(name, TA, TB, BN) GEMM_KERNEL(name, gemm_wg_tile, TA, TB, BN, TC_WG_THREADS, 1)
GEMM_WG_KERNEL(k_gemm_wg_nn, false, false, 128)
GEMM_WG_KERNEL(k_gemm_wg_nt, false, true, 128)
GEMM_WG_KERNEL(k_gemm_wg_tt, true, true, 128)
GEMM_WG_KERNEL(k_gemm_wg_nn_n64, false, false, 64)
GEMM_WG_KERNEL(k_gemm_wg_nt_n64, false, true, 64)
GEMM_WG_KERNEL(k_gemm_wg_tn_n64, true, false, 64)
GEMM_WG_KERNEL(k_gemm_wg_tt_n64, true, true, 64)
#undef GEMM_WG_KERNEL

// ---------------------------------------------------------------------------------------------- split operands
// B split into hi and lo beforehand by tf32_split.cuh's passes, so that the producer only copies it: a split operand
// is hi then lo, each rows_pad x K_pad (rows_pad a multiple of TC_SPLIT_ROWS = 128, K_pad of TC_SPLIT_K = 32), zero
// past the matrix: op(B)^T for B. Each is laid out as the wgmma kernels' shared memory takes it, 128 x 32 tile after
// tile (the tiles of rows 0 .. 127 along K, then the next 128 rows'), each tile K-major and 128B-swizzled: a slice of
// the product is one contiguous 16 KB copy.

// where element (r, k) of a split operand lies
__device__ __forceinline__ long long split_at(long long r, int k, int K_pad) {
    const long long tile = (r / 128) * (K_pad / WG_BK) + k / WG_BK;  // 128 x 32 tiles, along K, then down
    return tile * WG_SPLIT + wg_swizzled((int)(r % 128), (k % WG_BK) & ~3) + (k & 3);
}

// The split slice of rows row0 .. row0 + 127 (a multiple of 128) and K from k0 (a multiple of 32) into tile, by the
// bulk copy engine: its 16 KB counted on bar's phase (for which the caller expects them: mbar_expect_tx)
__device__ __forceinline__ void copy_split_slice(float* tile, const uint32_t* src, long long row0, int K_pad, int k0,
                                                 uint64_t* bar) {
#if WG_AVAILABLE
    const uint32_t* from = src + split_at(row0, k0, K_pad);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(tile)),
                 "l"(from), "n"(WG_SPLIT * 4), "r"(smem_u32(bar))
                 : "memory");
#endif
}

// A tensor map (CUtensorMap's 128 opaque bytes, made on the host by cuTensorMapEncodeTiled) in global memory
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};
// Before this thread's first copy through map: the map, copied in from the host, seen by the tensor copies
__device__ __forceinline__ void tensormap_acquire(const TensorMap* map) {
#if WG_AVAILABLE
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(map) : "memory");
#endif
}
// map's box at column c0, row r0 into dst (128-byte aligned) by the tensor memory accelerator: the whole box's bytes,
// zeros where it passes the matrix's edges, counted on bar's phase (for which the caller expects them)
__device__ __forceinline__ void tma_load_2d(float* dst, const TensorMap* map, int c0, int r0, uint64_t* bar) {
#if WG_AVAILABLE
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            smem_u32(dst)),
        "l"(map), "r"(c0), "r"(r0), "r"(smem_u32(bar))
        : "memory");
#endif
}

// ---------------------------------------------------------------------------------------------- A from registers
// The same product with op(A) copied raw (FP32, as it lies in global memory) and split by each consumer thread into
// the register fragments that wgmma takes A from: only B is read from shared memory by the tensor cores. A's tiles
// cross shared memory once (copied in, each element read out once) where split ones cross it three times (hi and lo
// copied in, then read by the wgmmas: lo once, hi twice), and A needs no split pass (k_gemm_wg_areg, B split
// beforehand) or the producer splits only B (k_gemm_wg_areg_tn). The same tf32_split, the same wgmmas in the same
// order and the same FP32 adds: the bits of the wgmma kernels whose producer splits both (gemm_wg_tile).

// op(A)'s raw 128 x 32 slice: stored M x K (rows of 36 floats) or K x M (32 rows of 136), padded so that a warp's
// fragment loads (8 rows x 4 k, or 4 k x 8 rows) fall on 32 distinct banks
template <bool TA>
using WgRawA = TcTile<!TA, 128, WG_BK, TA ? 8 : 4>;

// d (+)= a @ b over one k8 step for the warpgroup's 64 x 128 tile, a from registers (wgmma_tf32's, a's fragment as
// wg_load_a lays it out)
__device__ __forceinline__ void wgmma_tf32_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate) {
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
}

// the same for a 64 x 64 tile (flash attention's products on sm_90a: N = 64 keys or d)
__device__ __forceinline__ void wgmma_tf32_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate) {
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
}

// the same for a 64 x 32 tile (flash attention's backward on sm_90a: N = 32 queries a step)
__device__ __forceinline__ void wgmma_tf32_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b, int accumulate) {
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
}

// The register file's share of the block: setmaxnreg gives the producer's registers to the consumers, whose
// fragments of A (32 registers, 64 where the next slice's are loaded ahead) come on top of the running sum and the
// slice's products (128)
__device__ __forceinline__ void wg_producer_registers() {
#if WG_AVAILABLE
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_consumer_registers() {
#if WG_AVAILABLE
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;" ::: "memory");
#endif
}

// A raw tile (Raw::ROWS x Raw::COLS of the row-major p, from row r0 and column c0) copied by producer thread tid,
// zero past row_end and col_end; where the tile lies wholly inside and p's rows are 16-byte aligned, from one address
// and constant offsets (chunk tid % (COLS / 4) of rows tid / (COLS / 4) + i * 128 / (COLS / 4))
template <class Raw>
__device__ __forceinline__ void copy_raw(float* tile, const float* p, int ld, int r0, int c0, int row_end,
                                         int col_end, bool vec, int tid) {
    constexpr int ROW_CHUNKS = Raw::COLS / 4, STEP = WG_PRODUCERS / ROW_CHUNKS;
    static_assert(WG_PRODUCERS % ROW_CHUNKS == 0 && Raw::ROWS % STEP == 0, "whole rows a pass of the producers");
    if (vec && r0 + Raw::ROWS <= row_end && c0 + Raw::COLS <= col_end) {
        const int r = tid / ROW_CHUNKS, c = (tid % ROW_CHUNKS) * 4;
        const float* from = p + (long long)(r0 + r) * ld + c0 + c;
        float* to = tile + r * Raw::LD + c;
        const long long rows = (long long)STEP * ld;
#pragma unroll
        for (int i = 0; i < Raw::ROWS / STEP; i++) cp_async16(to + i * STEP * Raw::LD, from + i * rows, 16);
        return;
    }
    Raw::template load<WG_PRODUCERS>(tile, p, ld, r0, c0, row_end, col_end, vec, tid);
}

// True where A's rows are not 16-byte aligned but shifted_a_copy (K x M) or shifted_rows_copy (M x K) can copy them by
// 16-byte chunks: p (and each of a batch's products, stride floats apart) 16-byte aligned, ld not a multiple of 4
__device__ __forceinline__ bool shifted_a(const float* p, int ld, long long stride) {
    return ((reinterpret_cast<unsigned long long>(p) & 15) == 0) && (ld & 3) != 0 && (stride & 3) == 0;
}

// The floats by which shifted_a_copy and shifted_rows_copy move row r of a slice (r0 a multiple of 4, c0 of 4):
// (r ld) mod 4
__device__ __forceinline__ int a_shift(int r, int ld) { return (r * ld) & 3; }

// copy_raw for a K x M tile of A (WgRawA<true>: 32 rows of 128, LD 136) whose rows are not 16-byte aligned
// (shifted_a): row r's 128 floats from column c0 land at tile + r * LD + a_shift(r, ld) + 0 .., copied as the 33
// aligned 16-byte chunks that hold them, zero past row_end; the chunks' floats past col_end are zero and those
// before c0 (the shift) are the row's or the one before's, never read. Producer thread tid copies chunk tid % 32 of
// rows tid / 32 + 4 i, so one shift for all its rows; lane 31 also the 33rd chunk where the shift is not 0. Bounds
// are checked only for a tile at the matrix's edge (its rows past row_end, or col_end within 4 of its last column).
__device__ __forceinline__ void shifted_a_copy(float* tile, const float* p, int ld, int r0, int c0, int row_end,
                                               int col_end, int tid) {
    using Raw = WgRawA<true>;
    static_assert(Raw::ROWS == 32 && Raw::COLS == 128 && Raw::LD >= 132 && WG_PRODUCERS == 128, "the tile above");
    const int c = tid % 32, r = tid / 32, shift = a_shift(r, ld);
    const int first = c0 - shift + 4 * c;  // chunk c's first column
    const float* from = p + (long long)(r0 + r) * ld + first;
    float* to = tile + r * Raw::LD + 4 * c;
    if (r0 + Raw::ROWS <= row_end && c0 + Raw::COLS + 4 <= col_end) {  // every chunk whole: no bounds to check
#pragma unroll
        for (int i = 0; i < Raw::ROWS / 4; i++) {
            cp_async16(to + 4 * i * Raw::LD, from + (long long)(4 * i) * ld, 16);
            if (c == 31 && shift != 0) cp_async16(to + 4 * i * Raw::LD + 4, from + (long long)(4 * i) * ld + 4, 16);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < Raw::ROWS / 4; i++) {
        const bool in_row = r0 + r + 4 * i < row_end;
        const float* src = from + (long long)(4 * i) * ld;
        const int n = in_row ? max(0, min(4, col_end - first)) : 0;
        cp_async_upto4(to + 4 * i * Raw::LD, src, n, p);
        if (c == 31 && shift != 0) {
            const int n32 = in_row ? max(0, min(4, col_end - first - 4)) : 0;
            cp_async_upto4(to + 4 * i * Raw::LD + 4, src + 4, n32, p);
        }
    }
}

// copy_raw for an M x K tile of A (WgRawA<false>: 128 rows of 32, LD 36) whose rows are not 16-byte aligned
// (shifted_a): row r's 32 floats from column c0 land at tile + r * LD + a_shift(r, ld) + 0 .., copied as the aligned
// 16-byte chunks that hold them (8, and a ninth in the row's padding where the shift is not 0), zero past row_end
// and col_end; the floats before c0 (the shift) are the row's or the one before's, never read. Producer thread tid
// copies chunk tid % 8 of rows tid / 8 + 16 i, and the ninth of row tid. Bounds are checked only for a tile at the
// matrix's edge (its rows past row_end, or col_end within 4 of its last column).
__device__ __forceinline__ void shifted_rows_copy(float* tile, const float* p, int ld, int r0, int c0, int row_end,
                                                  int col_end, int tid) {
    using Raw = WgRawA<false>;
    static_assert(Raw::ROWS == 128 && Raw::COLS == 32 && Raw::LD >= 36 && WG_PRODUCERS == 128, "the tile above");
    const bool whole = r0 + Raw::ROWS <= row_end && c0 + Raw::COLS + 4 <= col_end;  // every chunk: no bounds to check
    auto chunk = [&](int r, int c) {
        const int first = c0 - a_shift(r, ld) + 4 * c;  // chunk c's first column
        const float* src = p + (long long)(r0 + r) * ld + first;
        if (whole) {
            cp_async16(tile + r * Raw::LD + 4 * c, src, 16);
        } else {
            const int n = r0 + r < row_end ? max(0, min(4, col_end - first)) : 0;
            cp_async_upto4(tile + r * Raw::LD + 4 * c, src, n, p);
        }
    };
#pragma unroll
    for (int i = 0; i < Raw::ROWS / 16; i++) chunk(tid / 8 + 16 * i, tid % 8);
    if (a_shift(tid, ld) != 0) chunk(tid, 8);
}

// wgmma's fragment of A for k8 step kk of the slice, split: for the warpgroup's rows 64 half .., thread (warp, g =
// lane / 4, t = lane % 4) holds (row, k) = (r, t), (r + 8, t), (r, t + 4), (r + 8, t + 4), r = 16 warp + g, k past
// 8 kk; rows[2] are rows r's and r + 8's 2 values of the step, for op(A)'s row sums
template <bool TA>
__device__ __forceinline__ void wg_load_a(uint32_t (&hi)[4], uint32_t (&lo)[4], float (&rows)[2][2],
                                          const float* raw, int half, int kk) {
    using Raw = WgRawA<TA>;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int r = half * 64 + warp * 16 + lane / 4, k = kk * 8 + lane % 4;
#pragma unroll
    for (int v = 0; v < 4; v++) {
        const int m = r + 8 * (v % 2), kv = k + 4 * (v / 2);
        const float x = TA ? raw[kv * Raw::LD + m] : raw[m * Raw::LD + kv];
        rows[v % 2][v / 2] = x;
        tf32_split(x, hi[v], lo[v]);
    }
}

// A consumer thread's share of one slice of A: its wgmma fragments of the 4 k8 steps, split (wg_load_a's), and where
// summing (SUM), the slice's sums of rows r and r + 8 over the thread's 8 k, each a pairwise tree
struct WgAregSlice {
    uint32_t hi[4][4], lo[4][4];
    float row_part[2];
};

template <bool TA, bool SUM>
__device__ __forceinline__ void wg_areg_load(WgAregSlice& a, const float* raw, int half) {
    float rows[2][8];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        float step[2][2];
        wg_load_a<TA>(a.hi[kk], a.lo[kk], step, raw, half, kk);
        rows[0][2 * kk] = step[0][0], rows[0][2 * kk + 1] = step[0][1];
        rows[1][2 * kk] = step[1][0], rows[1][2 * kk + 1] = step[1][1];
    }
    if (SUM) {
        a.row_part[0] = pairwise_sum(rows[0]);
        a.row_part[1] = pairwise_sum(rows[1]);
    }
}

// the same 12 wgmmas as wg_slice_products on a's fragments (lo*hi, hi*lo, hi*hi of each k8 step, into part),
// committed as one group. They read a's registers until the group is waited for; ptxas keeps those registers from
// other values until then (the next slice's loads go to the other WgAregSlice).
__device__ __forceinline__ void wg_areg_issue(float (&part)[64], const WgAregSlice& a, uint64_t b_hi, uint64_t b_lo) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        wgmma_tf32_rs(part, a.lo[kk], b_hi + 2 * kk, kk > 0);
        wgmma_tf32_rs(part, a.hi[kk], b_lo + 2 * kk, 1);
        wgmma_tf32_rs(part, a.hi[kk], b_hi + 2 * kk, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// nothing ahead of a tile's epilogue
struct NoAhead {
    template <class... Args>
    __device__ void operator()(Args...) const {}
};

// The consumers of k_gemm_wg_areg and the fused kernels: the n_tiles slices of one tile, the producer's slices q0,
// q0 + 1, .. of the stages (each B hi, B lo, then raw A, M x K, at A_AT floats, which this thread reads a_at floats
// further on: the shift of its rows by shifted_rows_copy), into acc as wg_store lays it out. A slice's A is loaded and
// split while the slice before's wgmmas run (two WgAregSlices taking turns); each slice's products are then added into
// acc in order. ahead() runs once a tile, while its second slice's wgmmas run (its first's, where it has only one; at
// once, where none): work for the tile's epilogue that the products can hide.
template <int STAGES, int STAGE, int A_AT, class Ahead = NoAhead>
__device__ __forceinline__ void wg_areg_consume(float (&acc)[64], float* stages, uint64_t* full, uint64_t* empty,
                                                int q0, int n_tiles, int a_at = 0, Ahead ahead = {}) {
    const int half = threadIdx.x / 128 - 1;
    const uint64_t d = wg_desc(stages);
    float part[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    auto load = [&](int kt, WgAregSlice& a) {  // slice kt's A, once its stage has landed
        const int q = q0 + kt;
        mbar_wait(&full[q % STAGES], (q / STAGES) & 1);
        wg_areg_load<false, false>(a, stages + q % STAGES * STAGE + A_AT + a_at, half);
    };
    auto slice = [&](int kt, WgAregSlice& cur, WgAregSlice& next) {
        const int s = (q0 + kt) % STAGES;
        const uint64_t b_hi = d + s * STAGE / 4;
        wg_areg_issue(part, cur, b_hi, b_hi + WG_SPLIT / 4);
        if (kt == min(1, n_tiles - 1)) ahead();
        if (kt + 1 < n_tiles) load(kt + 1, next);
        wg_add_slice(acc, part, &empty[s]);
    };
    WgAregSlice x, y;
    if (n_tiles == 0) ahead();
    if (n_tiles > 0) load(0, x);
    for (int kt = 0; kt < n_tiles; kt += 2) {
        slice(kt, x, y);
        if (kt + 1 < n_tiles) slice(kt + 1, y, x);
    }
}

// Tiles first, first + stride, .. (count of them) of A @ op(B), tile t the 128 x 128 one at rows 128 (t / n_cols)
// and columns 128 (t % n_cols), A stored M x K (lda) as it lies and B split beforehand (b_split: n_cols * 128 x
// K_pad, hi then lo, as tf32_split.cuh makes it; K_pad = ceil(K / 32) * 32), each tile then epilogue(acc, m0, n0) in
// the consumers; in the kernel's dynamic shared memory (S stages and their mbarriers first). Warpgroup 0 copies B's
// split slices (thread 0, each a bulk copy) and A's raw ones, S deep, on into the next tile's while the consumers
// finish this one: A's by thread 0 too, a box of a_map a slice, where the host made one (a tensor map over A, M x K,
// in boxes of TC_A_BOX_COLS x TC_A_BOX_ROWS; the box's last 4 columns land in the slice's padding), else by
// cp.async (16-byte chunks, shifted where A's rows are not aligned: shifted_rows_copy); warpgroups 1 and 2 split A
// as they read it and multiply, each ending a tile with its 64 rows (m0 + 64 * (warpgroup - 1) ..) in acc, as
// wg_store lays them out. An epilogue that reuses the stages (once the two have passed consumers_sync()) takes one
// tile: the next tile's slices would be copied into them. The epilogue is called inside the consumers' branch, so
// that ptxas gives it the consumers' registers (setmaxnreg). ahead(m0, n0, i), where given, runs in each consumer
// thread early in the block's i-th tile (wg_areg_consume_slices).
template <int S = WG_AREG_STAGES, class Epilogue, class Ahead = NoAhead>
__device__ __forceinline__ void wg_areg_tiles(float* stages, const float* A, int lda, const TensorMap* a_map, int M,
                                              int K, const uint32_t* b_split, int n_cols, int K_pad, int first,
                                              int stride, int count, Epilogue epilogue, Ahead ahead = {}) {
#if WG_AVAILABLE
    constexpr int STAGE = 2 * WG_SPLIT + WgRawA<false>::FLOATS;  // B hi, B lo, raw A
    static_assert(STAGE % 256 == 0, "every stage's B tiles 1024-byte aligned, as their swizzle needs");
    static_assert(WgRawA<false>::LD == TC_A_BOX_COLS && WgRawA<false>::ROWS == TC_A_BOX_ROWS, "A's box: a slice");
    static_assert(S * STAGE * 4 + 2 * S * 8 <= TC_AREG_SMEM_BYTES, "TC_AREG_SMEM_BYTES holds the stages");
    uint64_t* full = reinterpret_cast<uint64_t*>(stages + S * STAGE);
    uint64_t* empty = full + S;
    const int slices = K_pad / WG_BK;
    wg_init_barriers(full, empty, S);
    if (threadIdx.x < WG_PRODUCERS) {  // the producer: copy the tiles' slices, one after another (q). Slice q - (S -
        wg_producer_registers();       // 1) is handed over before slice q's stage is waited for: the consumers, done
        const int tid = threadIdx.x;   // with slice q - S, want q - (S - 1) next
        const long long b_lo = (long long)n_cols * 128 * K_pad;
        const bool vec_a = aligned16(A, lda), shift_a = shifted_a(A, lda, 0);
        const uint32_t bytes = (2 * WG_SPLIT + (a_map ? WgRawA<false>::FLOATS : 0)) * 4;  // thread 0's copies a slice
        if (a_map && tid == 0) tensormap_acquire(a_map);
        const int jobs = count * slices;
        int tile = first, j = 0;  // slice q's tile and its slice of it
        for (int q = 0; q < jobs + S - 1; q++) {
            if (q >= S - 1) {
                cp_async_wait<S - 2>();  // groups 0 .. q - 1 committed: this thread's slice q - (S - 1) landed
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                mbar_arrive(&full[(q - (S - 1)) % S]);
            }
            if (q < jobs) {
                const int s = q % S, m0 = tile / n_cols * 128, n0 = tile % n_cols * 128;
                mbar_wait(&empty[s], ((q / S) & 1) ^ 1);  // the consumers are done with slice q - S
                float* t = stages + s * STAGE;
                if (tid == 0) {  // B's hi and lo by the bulk copy engine (A's by the TMA): the phase waits for
                    mbar_expect_tx(&full[s], bytes);  // them, and for this thread's arrival S - 1 slices on
                    copy_split_slice(t, b_split, n0, K_pad, j * WG_BK, &full[s]);
                    copy_split_slice(t + WG_SPLIT, b_split + b_lo, n0, K_pad, j * WG_BK, &full[s]);
                    if (a_map) tma_load_2d(t + 2 * WG_SPLIT, a_map, j * WG_BK, m0, &full[s]);
                }
                if (!a_map && shift_a) shifted_rows_copy(t + 2 * WG_SPLIT, A, lda, m0, j * WG_BK, M, K, tid);
                else if (!a_map) copy_raw<WgRawA<false>>(t + 2 * WG_SPLIT, A, lda, m0, j * WG_BK, M, K, vec_a, tid);
                if (++j == slices) j = 0, tile += stride;
            }
            cp_async_commit();
        }
    } else {  // the consumers: split A, multiply and sum, then the epilogue, tile after tile
        wg_consumer_registers();
        // where A's rows were copied shifted, this thread's rows' shift (its rows r and r + 8: 8 ld is a multiple of 4)
        const int a_at = shifted_a(A, lda, 0) ? a_shift(threadIdx.x % 32 / 4, lda) : 0;
        for (int i = 0; i < count; i++) {
            const int tile = first + i * stride;
            float acc[64];
            wg_areg_consume<S, STAGE, 2 * WG_SPLIT>(acc, stages, full, empty, i * slices, slices, a_at,
                                                    [&] { ahead(tile / n_cols * 128, tile % n_cols * 128, i); });
            epilogue(acc, tile / n_cols * 128, tile % n_cols * 128);
        }
    }
#endif
}

// True where wg_store_bulk can write the tile of C at column n0: beta = 0 (C not read), and each of the tile's rows,
// 128 floats or N's last ones, one bulk copy (16-byte aligned, a multiple of 16 bytes)
__device__ __forceinline__ bool bulk_store_fits(const float* C, int N, int ldc, float beta, int n0) {
    return beta == 0.0f && aligned16(C, ldc) && (n0 + 128 <= N || (N & 3) == 0);
}

// Once every thread of the warpgroup has written its values of the tile's rows m0 .. m0 + 63 into its buffer (64
// rows of WG_STORE_LD floats): threads 0 .. 63 each hand one row (columns n0 .., as many as the tile has of N) to
// the bulk copy engine (cp.async.bulk) into C and go on, the rows written while the next tile's products run. Before
// the buffer is written again, the threads that handed its rows over wait until the engine has read them
// (cp.async.bulk.wait_group.read); the kernel waits for the last ones before it exits (wg_store_bulk_done).
__device__ __forceinline__ void wg_store_bulk_send(const float* buf, float* C, int m0, int n0, int M, int N, int ldc,
                                                   int half) {
#if WG_AVAILABLE
    const int tid = threadIdx.x % 128;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes seen by the bulk copies
    asm volatile("bar.sync %0, 128;" ::"r"(3 + half) : "memory");
    if (tid < 64 && m0 + tid < M) {
        const uint32_t from = static_cast<uint32_t>(__cvta_generic_to_shared(buf + tid * WG_STORE_LD));
        const int bytes = 4 * min(128, N - n0);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(C + (long long)(m0 + tid) *
                     ldc + n0), "r"(from), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
#endif
}

// wg_store's C for beta = 0 (bulk_store_fits), by way of this warpgroup's buffer: its threads write their values
// there once the buffer's last rows are read out, then wg_store_bulk_send. The same gemm_value for every element:
// the same bits as wg_store.
__device__ __forceinline__ void wg_store_bulk(float* buf, float* C, const float (&acc)[64], int m0, int n0, int M,
                                              int N, int ldc, const float* bias, float alpha, int half) {
#if WG_AVAILABLE
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    if (tid < 64) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the last tile's rows read
    asm volatile("bar.sync %0, 128;" ::"r"(3 + half) : "memory");
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
        const int r = warp * 16 + g + 8 * ((i % 4) / 2), c = (i / 4) * 8 + 2 * t, n = n0 + c;
        const float2 v = gemm_pair(acc[i], acc[i + 1], m0 + r, n, N, bias, alpha);
        *reinterpret_cast<float2*>(buf + r * WG_STORE_LD + c) = v;
    }
    wg_store_bulk_send(buf, C, m0, n0, M, N, ldc, half);
#endif
}
// ... before the kernel exits: this thread's last rows read out of its buffer
__device__ __forceinline__ void wg_store_bulk_done() {
#if WG_AVAILABLE
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

// C (M x N, ldc) = alpha * A @ op(B) + bias[n] + beta * C, A stored M x K (lda) as it lies (a_map: a tensor map over
// it, or null) and B split beforehand (wg_areg_tiles, WG_AREG_STORE_STAGES deep): the forward's and the dX products,
// with no pass splitting A. One block per SM (TC_AREG_STORE_SMEM_BYTES), gridDim.x of them, each taking the tiles
// blockIdx.x, blockIdx.x + gridDim.x, .. of the ceil(M / 128) x ceil(N / 128) in row-major order: a grid of one block a
// tile, or fewer, each block's next tile's first slices then copied while it stores the last one's. Where
// bulk_store_fits (every tile but the last column's, where N is not a multiple of 4), a tile's rows are written by the
// bulk copy engine from the warpgroups' buffers (wg_store_bulk) while the block goes on to its next tile.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_wg_areg(float* C, const float* A, const TensorMap* a_map, const uint32_t* b_split, const float* bias, int M,
                   int N, int K, int lda, int K_pad, int ldc, float alpha, float beta) {
#if WG_AVAILABLE
    constexpr int S = WG_AREG_STORE_STAGES, STAGES_BYTES = S * (2 * WG_SPLIT + WgRawA<false>::FLOATS) * 4 + 2 * S * 8;
    static_assert(STAGES_BYTES % 16 == 0 && STAGES_BYTES + WG_STORE_BYTES <= TC_AREG_STORE_SMEM_BYTES,
                  "TC_AREG_STORE_SMEM_BYTES holds the stages, their barriers and the two store buffers");
    static_assert(TC_AREG_STORE_SMEM_BYTES <= 227 * 1024, "within sm_90's dynamic shared memory a block");
    // [WG_AREG_STORE_STAGES][B hi, B lo, raw A], the barriers, the store buffers
    extern __shared__ __align__(1024) float areg_smem[];
    float* buffers = areg_smem + STAGES_BYTES / 4;
    const int n_cols = (N + 127) / 128, tiles = n_cols * ((M + 127) / 128);
    const int count = (int)blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    wg_areg_tiles<S>(areg_smem, A, lda, a_map, M, K, b_split, n_cols, K_pad, blockIdx.x, gridDim.x, count,
                     [&](const float (&acc)[64], int m0, int n0) {
                         const int half = threadIdx.x / 128 - 1;
                         if (bulk_store_fits(C, N, ldc, beta, n0))
                             wg_store_bulk(buffers + half * 64 * WG_STORE_LD, C, acc, m0 + half * 64, n0, M, N, ldc,
                                           bias, alpha, half);
                         else
                             wg_store(C, acc, m0 + half * 64, n0, M, N, ldc, bias, alpha, beta, CAUSAL_NONE, 0.0f);
                     });
    wg_store_bulk_done();  // (none to wait for where no tile was stored so)
#else
    __trap();  // the launchers choose this kernel on sm_90a only
#endif
}

// The TN kernel's stage: B hi, B lo (split, swizzled; raw B, K x N as it lies, copied into B lo's place first), raw A
// (K x M, padded)
using WgTnRawA = WgRawA<true>;
using WgTnRawB = TcTile<false, 128, WG_BK, 0>;  // the producer reads a k's 128 floats across a warp
static_assert(WgTnRawB::FLOATS == WG_SPLIT, "raw B fills B lo's place");
constexpr int WG_TN_A_AT = 2 * WG_SPLIT, WG_TN_B_AT = WG_SPLIT;
constexpr int WG_TN_STAGE = WG_TN_A_AT + WgTnRawA::FLOATS;
static_assert(WG_TN_STAGE % 256 == 0, "every stage's B tiles 1024-byte aligned, as their swizzle needs");
static_assert(WG_AREG_TN_STAGES * WG_TN_STAGE * 4 + 2 * WG_AREG_TN_STAGES * 8 <= TC_AREG_TN_SMEM_BYTES,
              "TC_AREG_TN_SMEM_BYTES holds the stages");

// producer thread tid's share of a stage's B: row tid of B's 128, read whole from raw B (every producer's read before
// any writes over it: barrier 2), split into the K-major hi and lo tiles the wgmmas read; then the stores made visible
// to the tensor cores (async proxy)
__device__ __forceinline__ void wg_tn_split_b(float* stage, int tid) {
    float4 raw[WG_BK / 4];
#pragma unroll
    for (int q = 0; q < WG_BK / 4; q++) raw[q] = WgTnRawB::k_quad(stage + WG_TN_B_AT, tid, 4 * q);  // across the warp
    asm volatile("bar.sync 2, %0;" ::"n"(WG_PRODUCERS) : "memory");
#pragma unroll
    for (int q = 0; q < WG_BK / 4; q++) tf32_split_store(stage, stage + WG_SPLIT, wg_swizzled(tid, 4 * q), raw[q]);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A flag between the blocks of one launch (global memory, gpu scope), a warpgroup at a time (named barrier 3 + half,
// the consumer warpgroup's own): its thread 0 waits until *flag == value, and the warpgroup's later reads see what
// the setter's warpgroup stored before it set the flag
__device__ __forceinline__ void wg_flag_wait(const int* flag, int value, int half) {
#if WG_AVAILABLE
    if (threadIdx.x % 128 == 0) {
        int seen;
        do asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
        while (seen != value);
    }
    asm volatile("bar.sync %0, 128;" ::"r"(3 + half) : "memory");
#endif
}
// ... once every thread of the warpgroup has stored: *flag = value
__device__ __forceinline__ void wg_flag_set(int* flag, int value, int half) {
#if WG_AVAILABLE
    asm volatile("bar.sync %0, 128;" ::"r"(3 + half) : "memory");
    if (threadIdx.x % 128 == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
#endif
}

// The SGEMM's product for A stored K x M and B stored K x N (a linear layer's dW = dout^T @ inp; attention's dK and
// dV at d_k 128) with A from registers, on a block an SM: the producer copies both raw, WG_AREG_TN_STAGES deep, and
// splits B into its K-major tiles; the consumers split A. The SGEMM's arguments and contract for `batch` products
// (causal modes too), and K cut into `splits` parts added into C one after another (serial split-K). Job
// j = z * batch * tiles + b * tiles + t is part z of product b's tile t (128 x 128, row-major), part z its slices
// [z S / splits, (z + 1) S / splits) of the tile's S slices of 32; block i takes jobs i, i + gridDim.x, .. and its
// producer copies on into the next job while the consumers store, with the next job's first slice issued before the
// store, so that its wgmmas run meanwhile. Part 0 stores alpha * its product + bias + beta *
// C; part z > 0 waits until flags[2 (b tiles + t) + half] = z (part z - 1's rows stored), then adds alpha * its
// product into C; the last part sets the flag back to 0 (flags: 2 batch tiles ints, zero before the first launch;
// unread where splits = 1). Where a_sums is given (one product), a_sums[m] += op(A)'s row sums,
// each part's from the first column tile's jobs in the same order: each row's 8 values of a slice by a pairwise
// tree, the slices by a compensated running sum, the row's 4 threads in a fixed tree. Every output sees the parts in
// order: the same bits every run for a given grid. Every block must be resident at once (gridDim.x at most the SMs,
// one block each): a job waits only on a lower job of its tile.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_wg_areg_tn(float* C, const float* A, const float* B, const float* bias, int M, int N, int K, int lda,
                      int ldb, int ldc, long long strideA, long long strideB, long long strideC, float alpha,
                      float beta, Causal causal, float fill, float* a_sums, int batch, int splits, int* flags) {
#if WG_AVAILABLE
    constexpr int S = WG_AREG_TN_STAGES, STAGE = WG_TN_STAGE;
    extern __shared__ __align__(1024) float tn_smem[];  // [WG_AREG_TN_STAGES][B hi, B lo, raw A], the barriers
    uint64_t* full = reinterpret_cast<uint64_t*>(tn_smem + S * STAGE);
    uint64_t* empty = full + S;
    const int n_cols = (N + 127) / 128, tiles = n_cols * ((M + 127) / 128), jobs = splits * batch * tiles;
    struct Job {
        int b, t, z, m0, n0, k_end, lo, hi;  // its product, tile and part; the tile's corner, K's end, its slices
    };
    auto job_at = [&](int j) {
        Job o;
        o.t = j % tiles, o.b = j / tiles % batch, o.z = j / tiles / batch;
        o.m0 = o.t / n_cols * 128, o.n0 = o.t % n_cols * 128;
        const int k_begin = causal == CAUSAL_A_UPPER ? o.m0 : 0;  // a multiple of 32
        o.k_end = causal == CAUSAL_A_LOWER ? min(K, o.m0 + 128) : K;
        const bool above = causal == CAUSAL_OUT_LOWER && o.n0 > o.m0 + 127;  // all fill: no product
        const int first = k_begin / WG_BK;
        const int n = above || o.k_end <= k_begin ? 0 : (o.k_end + WG_BK - 1) / WG_BK - first;
        o.lo = first + (int)((long long)o.z * n / splits), o.hi = first + (int)((long long)(o.z + 1) * n / splits);
        return o;
    };
    const bool shift_a = shifted_a(A, lda, strideA);  // A's unaligned rows copied by 16-byte chunks even so
    wg_init_barriers(full, empty, S);
    if (threadIdx.x < WG_PRODUCERS) {  // the producer: copy both, then split B, job after job (q: its slices in turn)
        wg_producer_registers();
        const int tid = threadIdx.x;
        int total = 0;
        for (int j = blockIdx.x; j < jobs; j += gridDim.x) {
            const Job job = job_at(j);
            total += job.hi - job.lo;
        }
        int j = blockIdx.x;
        Job job = job_at(j);
        int k = job.lo;
        for (int q = 0; q < total + S - 1; q++) {
            const int kt = q - (S - 1);
            if (kt >= 0) {
                cp_async_wait<S - 2>();  // this thread's slice kt landed, and every producer's (barrier 2: the
                asm volatile("bar.sync 2, %0;" ::"n"(WG_PRODUCERS) : "memory");  // consumers' take 3 and 4)
                wg_tn_split_b(tn_smem + (kt % S) * STAGE, tid);
                mbar_arrive(&full[kt % S]);
            }
            if (q < total) {
                while (k == job.hi) {  // this block's next job with a slice to copy
                    j += gridDim.x;
                    job = job_at(j);
                    k = job.lo;
                }
                const int s = q % S;
                mbar_wait(&empty[s], ((q / S) & 1) ^ 1);  // the consumers are done with slice q - S
                float* st = tn_smem + s * STAGE;
                const float *a = A + job.b * strideA, *b = B + job.b * strideB;
                float* raw_a = st + WG_TN_A_AT;
                if (shift_a) shifted_a_copy(raw_a, a, lda, k * WG_BK, job.m0, job.k_end, M, tid);
                else copy_raw<WgTnRawA>(raw_a, a, lda, k * WG_BK, job.m0, job.k_end, M, aligned16(a, lda), tid);
                copy_raw<WgTnRawB>(st + WG_TN_B_AT, b, ldb, k * WG_BK, job.n0, job.k_end, N, aligned16(b, ldb), tid);
                k++;
            }
            cp_async_commit();
        }
    } else {  // the consumers: split A, multiply and sum, then store the job's part or add it into C
        wg_consumer_registers();
        const int half = threadIdx.x / 128 - 1, lane = threadIdx.x % 32;
        const int a_at = shift_a ? a_shift(lane % 4, lda) : 0;
        const uint64_t d = wg_desc(tn_smem);
        float part[64];
        WgAregSlice a;
        int q = 0;  // the block's next slice to multiply
        // slice q's wgmmas into part, once its stage has landed; A's row sums loaded too where `with_sums` (for a job
        // that sums rows, and for the block's first slice: no branch there between the loads and the wgmmas, across
        // which ptxas adds fences)
        auto issue = [&](bool with_sums) {
            const int s = q % S;
            const float* raw = tn_smem + s * STAGE + WG_TN_A_AT + a_at;
            mbar_wait(&full[s], (q / S) & 1);
            if (with_sums) wg_areg_load<true, true>(a, raw, half);
            else wg_areg_load<true, false>(a, raw, half);
            wg_areg_issue(part, a, d + s * STAGE / 4, d + (s * STAGE + WG_SPLIT) / 4);
            q++;
        };
        auto add = [&](float (&acc)[64], CompensatedSum (&sums)[2], bool sum_rows) {  // ... slice q - 1 into acc
            wg_add_slice(acc, part, &empty[(q - 1) % S]);
            if (sum_rows) sums[0].add(a.row_part[0]), sums[1].add(a.row_part[1]);
        };
        // a job sums its slices' A rows where a_sums is given and it is of the first column tile
        auto sums_rows = [&](const Job& jb) { return a_sums != nullptr && jb.n0 == 0; };
        // Each job's first slice is issued before the epilogue of the job before, whose stores then overlap it, and
        // waited for after it on every path (wg_wait_all), so that ptxas finds no group in flight where paths join.
        Job job = job_at(blockIdx.x);
        if ((int)blockIdx.x < jobs && job.hi > job.lo) issue(true);
        wg_wait_all();
        for (int j = blockIdx.x; j < jobs; j += gridDim.x) {
            const bool sum_rows = sums_rows(job);
            float acc[64];
            CompensatedSum sums[2];
#pragma unroll
            for (int i = 0; i < 64; i++) acc[i] = 0.0f;
            if (job.hi > job.lo) add(acc, sums, sum_rows);
            for (int k = job.lo + 1; k < job.hi; k++) {
                issue(sum_rows);
                add(acc, sums, sum_rows);
            }
            const Job done = job;
            if (j + (int)gridDim.x < jobs) {
                job = job_at(j + gridDim.x);
                if (job.hi > job.lo) issue(sums_rows(job));
            }
            int* flag = flags + 2 * (done.b * tiles + done.t) + half;
            if (done.z > 0) wg_flag_wait(flag, done.z, half);
            const int row0 = done.m0 + half * 64, r = row0 + (threadIdx.x % 128) / 32 * 16 + lane / 4;
            if (causal == CAUSAL_NONE && (done.z > 0 || beta == 1.0f))  // C + the part: no read of C
                wg_store_add(C + done.b * strideC, acc, row0, done.n0, M, N, ldc, done.z == 0 ? bias : nullptr, alpha);
            else
                wg_store(C + done.b * strideC, acc, row0, done.n0, M, N, ldc, done.z == 0 ? bias : nullptr, alpha,
                         done.z == 0 ? beta : 1.0f, causal, fill);  // a tile above the diagonal: all fill
            if (sum_rows) {  // the tile's rows of a_sums: only its jobs write them. t = 0 .. 3: (t0 + t1) + (t2 + t3)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const float v = quad_sum(sums[i].value());
                    if (lane % 4 == 0 && r + 8 * i < M) a_sums[r + 8 * i] += v;
                }
            }
            if (splits > 1) wg_flag_set(flag, done.z + 1 == splits ? 0 : done.z + 1, half);
            wg_wait_all();
        }
    }
#else
    __trap();  // the launchers choose this kernel on sm_90a only
#endif
}
