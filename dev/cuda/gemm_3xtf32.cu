// Prototype for the tensor-core variant of the matrix products (issue 11): C = A @ B^T on the tensor
// cores at FP32 accuracy, error-compensated TF32 ("3xTF32"): each FP32 operand x is split into a TF32 high
// part and a TF32 low part (x = hi + lo, both rounded to nearest), and hi*hi + hi*lo + lo*hi are
// accumulated in FP32 registers (lo*lo is below FP32's resolution). Built and checked by dev/gemm_3xtf32.py;
// not part of the engine yet.
//
//   A (M x K) and B (N x K) row-major, both K-contiguous, as the linear layer's forward reads inp and W;
//   K % 4 == 0 and 16-byte aligned rows (the 16-byte cp.async); M and N any.
//
// A block computes a 128 x 128 tile with 8 warps (2 along M x 4 along N), each warp 64 x 32 as 4 x 4
// mma.m16n8k8 tiles. K steps by 16 through shared memory, two stages deep (cp.async: the next tile is in
// flight while this one is multiplied). Shared rows are padded to 20 floats so that the fragment loads
// (lane = 4 * row + k) fall in 32 distinct banks.
#include <cstdint>

#define BM 128
#define BN 128
#define BK 16
#define LDS (BK + 4)
#define THREADS 256

__device__ __forceinline__ uint32_t tf32_rna(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// x = hi + lo, both TF32
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
    hi = tf32_rna(x);
    lo = tf32_rna(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16 bytes from global to shared, zero-filled where the row is outside the matrix
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool inside) {
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    int src_bytes = inside ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}

// SUM_IN_REGISTERS: the three products of one k8 step go into a zeroed fragment, which is then added to the
// running sum with ordinary FP32 adds (round to nearest). Without it the tensor cores accumulate the whole of
// K themselves, and their accumulation, which is not round-to-nearest, lets the error grow with K.
template <bool SUM_IN_REGISTERS>
__device__ __forceinline__ void gemm_nt_3xtf32(float* C, const float* A, const float* B, const float* bias,
                                               int M, int N, int K) {
    __shared__ __align__(16) float As[2][BM][LDS];
    __shared__ __align__(16) float Bs[2][BN][LDS];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;             // the mma fragment's row group and thread in group
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // this warp's 64 x 32 corner of the tile
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    // each thread copies two 16-byte chunks of A's tile and two of B's: rows tid/4 and tid/4 + 64, chunk tid%4
    auto load = [&](int stage, int k0) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = tid / 4 + 64 * r, k = k0 + (tid % 4) * 4;
            bool a_in = m0 + row < M && k < K, b_in = n0 + row < N && k < K;
            cp_async16(&As[stage][row][(tid % 4) * 4], a_in ? A + (long long)(m0 + row) * K + k : A, a_in);
            cp_async16(&Bs[stage][row][(tid % 4) * 4], b_in ? B + (long long)(n0 + row) * K + k : B, b_in);
        }
        asm volatile("cp.async.commit_group;");
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

    const int k_tiles = (K + BK - 1) / BK;
    load(0, 0);
    for (int kt = 0; kt < k_tiles; kt++) {
        const int stage = kt & 1;
        if (kt + 1 < k_tiles) {
            load(stage ^ 1, (kt + 1) * BK);
            asm volatile("cp.async.wait_group 1;");  // this tile has landed; the next is in flight
        } else {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            uint32_t a_hi[4][4], a_lo[4][4], b_hi[4][2], b_lo[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = wm + i * 16 + g;
                split(As[stage][r][kk + t], a_hi[i][0], a_lo[i][0]);
                split(As[stage][r + 8][kk + t], a_hi[i][1], a_lo[i][1]);
                split(As[stage][r][kk + t + 4], a_hi[i][2], a_lo[i][2]);
                split(As[stage][r + 8][kk + t + 4], a_hi[i][3], a_lo[i][3]);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = wn + j * 8 + g;
                split(Bs[stage][c][kk + t], b_hi[j][0], b_lo[j][0]);
                split(Bs[stage][c][kk + t + 4], b_hi[j][1], b_lo[j][1]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {  // the small products first
                    if (SUM_IN_REGISTERS) {
                        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_tf32(p, a_lo[i], b_hi[j]);
                        mma_tf32(p, a_hi[i], b_lo[j]);
                        mma_tf32(p, a_hi[i], b_hi[j]);
#pragma unroll
                        for (int r = 0; r < 4; r++) acc[i][j][r] += p[r];
                    } else {
                        mma_tf32(acc[i][j], a_lo[i], b_hi[j]);
                        mma_tf32(acc[i][j], a_hi[i], b_lo[j]);
                        mma_tf32(acc[i][j], a_hi[i], b_hi[j]);
                    }
                }
        }
        __syncthreads();  // every warp is done with this stage before it is loaded again
    }

    // c0, c1: row g, columns 2t and 2t+1; c2, c3: row g+8
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = m0 + wm + i * 16 + g + 8 * h;
                const int n = n0 + wn + j * 8 + 2 * t;
                if (m >= M) continue;
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (n + e < N)
                        C[(long long)m * N + n + e] = acc[i][j][2 * h + e] + (bias != nullptr ? bias[n + e] : 0.0f);
            }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
k_gemm_nt_3xtf32(float* C, const float* A, const float* B, const float* bias, int M, int N, int K) {
    gemm_nt_3xtf32<false>(C, A, B, bias, M, N, K);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
k_gemm_nt_3xtf32_regsum(float* C, const float* A, const float* B, const float* bias, int M, int N, int K) {
    gemm_nt_3xtf32<true>(C, A, B, bias, M, N, K);
}
