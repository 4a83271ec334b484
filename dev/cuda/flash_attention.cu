// Flash attention, first version: the FlashAttention-2 schedule in FP32 on the SIMT cores, causal, forward
// and backward, written for correctness first (issue 12). Not part of the engine yet: dev/flash_attention.py
// builds it, checks it against float64 and the fast variant's pipeline, and times it beside PyTorch's SDPA.
//
// q, k, v, o, do, dq, dk, dv: (B, NH, T, d_k) contiguous, as split_heads writes them; lse, delta: (B, NH, T).
// A block owns 64 rows (queries forward and for dQ, keys for dK and dV) of one head (blockIdx.y = b * NH + h)
// and streams the other side's 64-row tiles through shared memory; tiles wholly above the diagonal are
// skipped. The scores are dot(Q[i], K[j]) * (1.0f / sqrtf(d_k)), as the literal line computes them; the
// softmax is online (a running max and sum per row, FP32), and the backward recomputes P from the saved
// log-sum-exp. No atomics: dQ (with each row's delta) and then (dK, dV) come from separate kernels, each
// summing in a fixed order.
//
// 256 threads as 16 x 16: thread (ty, tx) holds rows 4 ty .. 4 ty + 3 of its block's 64 and, of a 64-wide
// score tile, columns 4 tx .. 4 tx + 3; of a D-wide output, columns tx * D/16 .. + D/16 - 1. D is d_k
// padded to 32, 64 or 128 (the padding is zero in shared memory, so it adds exact zeros).
#include "common.cuh"

#define FA_TILE 64
#define FA_THREADS 256
#define FA_LD (FA_TILE + 4)  // a transposed tile's row: 4-float aligned, rows 4 banks apart

// rows [r0, r0 + 64) of the (T, d_k) matrix p, transposed into s[d][row] (row stride FA_LD), zero past T
// and past d_k up to D
template <int D>
__device__ __forceinline__ void fa_load_t(float* s, const float* p, int r0, int T, int d_k) {
    for (int e = threadIdx.x; e < FA_TILE * D; e += FA_THREADS) {
        const int r = e / D, d = e % D;
        s[d * FA_LD + r] = (r0 + r < T && d < d_k) ? p[(long long)(r0 + r) * d_k + d] : 0.0f;
    }
}
// the same rows as they lie: s[row][d] (row stride D + 4)
template <int D>
__device__ __forceinline__ void fa_load(float* s, const float* p, int r0, int T, int d_k) {
    for (int e = threadIdx.x; e < FA_TILE * D; e += FA_THREADS) {
        const int r = e / D, d = e % D;
        s[r * (D + 4) + d] = (r0 + r < T && d < d_k) ? p[(long long)(r0 + r) * d_k + d] : 0.0f;
    }
}

// acc[i][j] = sum over d of a_t[d][4 ty + i] * b_t[d][4 tx + j]: a 64 x 64 tile of products of rows
template <int D>
__device__ __forceinline__ void fa_rows_dot(float (&acc)[4][4], const float* a_t, const float* b_t, int ty, int tx) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll 8
    for (int d = 0; d < D; d++) {
        const float4 a = *reinterpret_cast<const float4*>(a_t + d * FA_LD + 4 * ty);
        const float4 b = *reinterpret_cast<const float4*>(b_t + d * FA_LD + 4 * tx);
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
    }
}

// out[i][j] += sum over r < 64 of w_t[r][4 ty + i] * m[r][tx * D/16 + j]: a 64-row weighting of m's rows
template <int D>
__device__ __forceinline__ void fa_weigh(float (&out)[4][D / 16], const float* w_t, const float* m, int ty, int tx) {
    constexpr int DT = D / 16;
#pragma unroll 4
    for (int r = 0; r < FA_TILE; r++) {
        const float4 w = *reinterpret_cast<const float4*>(w_t + r * FA_LD + 4 * ty);
        const float wv[4] = {w.x, w.y, w.z, w.w};
        float mv[DT];
#pragma unroll
        for (int j = 0; j < DT; j++) mv[j] = m[r * (D + 4) + tx * DT + j];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < DT; j++) out[i][j] += wv[i] * mv[j];
    }
}

// this thread's 4 x 4 of a 64 x 64 tile (rows 4 ty + i, columns 4 tx + j) stored transposed: w_t[col][row]
__device__ __forceinline__ void fa_store_t(float* w_t, const float (&v)[4][4], int ty, int tx) {
#pragma unroll
    for (int j = 0; j < 4; j++)
        *reinterpret_cast<float4*>(w_t + (4 * tx + j) * FA_LD + 4 * ty) =
            make_float4(v[0][j], v[1][j], v[2][j], v[3][j]);
}

// v reduced over the 16 threads of a row (a half-warp), the same order in every thread
__device__ __forceinline__ float fa_row_max(float v) {
    for (int off = 8; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}
__device__ __forceinline__ float fa_row_sum(float v) {
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

// ---------------------------------------------------------------------------------------------- forward
// o = softmax(causal(q k^T * scale)) v; lse[i] = the log of row i's sum of exp, plus its max
template <int D>
__device__ void flash_fwd(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {
    constexpr int DT = D / 16;
    extern __shared__ __align__(16) float fa_smem[];
    float* q_t = fa_smem;              // [D][FA_LD]
    float* k_t = q_t + D * FA_LD;      // [D][FA_LD]
    float* vs = k_t + D * FA_LD;       // [64][D + 4]
    float* p_t = vs + FA_TILE * (D + 4);  // [64 keys][FA_LD]
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, o += head;
    lse += (long long)blockIdx.y * T;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_TILE;  // the longest rows first
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const float scale = 1.0f / sqrtf((float)d_k);

    fa_load_t<D>(q_t, q, q0, T, d_k);
    float m[4], l[4], acc[4][DT];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < DT; j++) acc[i][j] = 0.0f;
    }
    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += FA_TILE) {
        __syncthreads();  // the previous tile's k, v and p are read
        fa_load_t<D>(k_t, k, k0, T, d_k);
        fa_load<D>(vs, v, k0, T, d_k);
        __syncthreads();
        float s[4][4];
        fa_rows_dot<D>(s, q_t, k_t, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int qi = q0 + 4 * ty + i;
            float row_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int kj = k0 + 4 * tx + j;
                s[i][j] = (kj <= qi && kj < T) ? s[i][j] * scale : -INFINITY;
                row_max = fmaxf(row_max, s[i][j]);
            }
            const float m_new = fmaxf(m[i], fa_row_max(row_max));  // finite: key k0 <= qi is in every tile
            const float alpha = expf(m[i] - m_new);
            float row_sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = expf(s[i][j] - m_new);
                row_sum += s[i][j];
            }
            l[i] = l[i] * alpha + fa_row_sum(row_sum);
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < DT; j++) acc[i][j] *= alpha;
        }
        fa_store_t(p_t, s, ty, tx);
        __syncthreads();
        fa_weigh<D>(acc, p_t, vs, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * ty + i;
        if (qi >= T) continue;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            const int d = tx * DT + j;
            if (d < d_k) o[(long long)qi * d_k + d] = acc[i][j] / l[i];
        }
        if (tx == 0) lse[qi] = m[i] + logf(l[i]);
    }
}

// ---------------------------------------------------------------------------------------------- backward
// dq = scale * sum over keys of ds k, ds = p (dp - delta), dp = do v^T, p = exp(q k^T * scale - lse).
// delta[i] = sum over keys of p dp, from the same p and dp as ds (a first pass over the key tiles), written
// for k_flash_bwd_dkdv: FlashAttention-2's rowsum(do * o) is the same number, but from the rounded o its
// error does not cancel within the row, and at short T dQ and dK came out up to 2.6x the fast pipeline's
// error (a review's emulation; at T = 1 a residue where the exact gradient is 0).
template <int D>
__device__ void flash_bwd_dq(float* dq, float* delta, const float* q, const float* k, const float* v,
                             const float* d_o, const float* lse, int T, int d_k) {
    constexpr int DT = D / 16;
    extern __shared__ __align__(16) float fa_smem[];
    float* q_t = fa_smem;                 // [D][FA_LD]
    float* do_t = q_t + D * FA_LD;        // [D][FA_LD]
    float* k_t = do_t + D * FA_LD;        // [D][FA_LD]
    float* v_t = k_t + D * FA_LD;         // [D][FA_LD]
    float* ks = v_t + D * FA_LD;          // [64][D + 4]
    float* ds_t = ks + FA_TILE * (D + 4);  // [64 keys][FA_LD]
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, d_o += head, dq += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_TILE;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const float scale = 1.0f / sqrtf((float)d_k);

    fa_load_t<D>(q_t, q, q0, T, d_k);
    fa_load_t<D>(do_t, d_o, q0, T, d_k);
    float row_lse[4], row_delta[4], acc[4][DT];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * ty + i;
        row_lse[i] = qi < T ? lse[qi] : 0.0f;
        row_delta[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < DT; j++) acc[i][j] = 0.0f;
    }
    // p and dp of one key tile, as both passes compute them
    auto scores = [&](float (&p)[4][4], float (&dp)[4][4], int k0) {
        fa_rows_dot<D>(p, q_t, k_t, ty, tx);
        fa_rows_dot<D>(dp, do_t, v_t, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int qi = q0 + 4 * ty + i;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int kj = k0 + 4 * tx + j;
                p[i][j] = (kj <= qi && kj < T && qi < T) ? expf(p[i][j] * scale - row_lse[i]) : 0.0f;
            }
        }
    };
    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += FA_TILE) {  // pass 1: delta
        __syncthreads();
        fa_load_t<D>(k_t, k, k0, T, d_k);
        fa_load_t<D>(v_t, v, k0, T, d_k);
        __syncthreads();
        float p[4][4], dp[4][4];
        scores(p, dp, k0);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) row_delta[i] += p[i][j] * dp[i][j];
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        row_delta[i] = fa_row_sum(row_delta[i]);
        const int qi = q0 + 4 * ty + i;
        if (tx == 0 && qi < T) delta[qi] = row_delta[i];
    }
    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += FA_TILE) {  // pass 2: dq
        __syncthreads();
        fa_load_t<D>(k_t, k, k0, T, d_k);
        fa_load_t<D>(v_t, v, k0, T, d_k);
        fa_load<D>(ks, k, k0, T, d_k);
        __syncthreads();
        float p[4][4], dp[4][4];
        scores(p, dp, k0);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) p[i][j] *= dp[i][j] - row_delta[i];  // ds
        fa_store_t(ds_t, p, ty, tx);
        __syncthreads();
        fa_weigh<D>(acc, ds_t, ks, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * ty + i;
        if (qi >= T) continue;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            const int d = tx * DT + j;
            if (d < d_k) dq[(long long)qi * d_k + d] = acc[i][j] * scale;
        }
    }
}

// for a block of 64 keys: dv = sum over queries of p^T do, dk = scale * sum of ds^T q
template <int D>
__device__ void flash_bwd_dkdv(float* dk, float* dv, const float* q, const float* k, const float* v,
                               const float* d_o, const float* lse, const float* delta, int T, int d_k) {
    constexpr int DT = D / 16;
    extern __shared__ __align__(16) float fa_smem[];
    float* k_t = fa_smem;                  // [D][FA_LD]
    float* v_t = k_t + D * FA_LD;          // [D][FA_LD]
    float* q_t = v_t + D * FA_LD;          // [D][FA_LD]
    float* do_t = q_t + D * FA_LD;         // [D][FA_LD]
    float* qs = do_t + D * FA_LD;          // [64][D + 4]
    float* dos = qs + FA_TILE * (D + 4);   // [64][D + 4]
    float* w_t = dos + FA_TILE * (D + 4);  // [64 queries][FA_LD]: p^T, then ds^T
    float* row_lse = w_t + FA_TILE * FA_LD;  // [64]
    float* row_delta = row_lse + FA_TILE;    // [64]
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, d_o += head, dk += head, dv += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const int k0 = blockIdx.x * FA_TILE;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const float scale = 1.0f / sqrtf((float)d_k);

    fa_load_t<D>(k_t, k, k0, T, d_k);
    fa_load_t<D>(v_t, v, k0, T, d_k);
    float acc_k[4][DT], acc_v[4][DT];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < DT; j++) acc_k[i][j] = 0.0f, acc_v[i][j] = 0.0f;
    for (int q0 = k0; q0 < T; q0 += FA_TILE) {  // the queries that see these keys: from the diagonal on
        __syncthreads();
        fa_load_t<D>(q_t, q, q0, T, d_k);
        fa_load_t<D>(do_t, d_o, q0, T, d_k);
        fa_load<D>(qs, q, q0, T, d_k);
        fa_load<D>(dos, d_o, q0, T, d_k);
        if (threadIdx.x < FA_TILE) {
            const int qi = q0 + threadIdx.x;
            row_lse[threadIdx.x] = qi < T ? lse[qi] : 0.0f;
            row_delta[threadIdx.x] = qi < T ? delta[qi] : 0.0f;
        }
        __syncthreads();
        // s^T and dp^T: rows are this block's keys (4 ty + i), columns the tile's queries (4 tx + j)
        float s[4][4], dp[4][4];
        fa_rows_dot<D>(s, k_t, q_t, ty, tx);
        fa_rows_dot<D>(dp, v_t, do_t, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int kj = k0 + 4 * ty + i;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int qi = q0 + 4 * tx + j;
                const bool seen = kj <= qi && qi < T && kj < T;
                s[i][j] = seen ? expf(s[i][j] * scale - row_lse[4 * tx + j]) : 0.0f;  // p^T
                dp[i][j] = s[i][j] * (dp[i][j] - row_delta[4 * tx + j]);              // ds^T
            }
        }
        fa_store_t(w_t, s, ty, tx);
        __syncthreads();
        fa_weigh<D>(acc_v, w_t, dos, ty, tx);
        __syncthreads();  // p^T is read: ds^T takes its place
        fa_store_t(w_t, dp, ty, tx);
        __syncthreads();
        fa_weigh<D>(acc_k, w_t, qs, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int kj = k0 + 4 * ty + i;
        if (kj >= T) continue;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            const int d = tx * DT + j;
            if (d < d_k) {
                dk[(long long)kj * d_k + d] = acc_k[i][j] * scale;
                dv[(long long)kj * d_k + d] = acc_v[i][j];
            }
        }
    }
}

// The kernels, one per padded width: grid (ceil(T / 64), B * NH), FA_THREADS threads, the shared memory
// dev/flash_attention.py computes from D.
#define FLASH_KERNELS(D)                                                                                         \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) k_flash_fwd_d##D(                                 \
        float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {                 \
        flash_fwd<D>(o, lse, q, k, v, T, d_k);                                                                  \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) k_flash_bwd_dq_d##D(                              \
        float* dq, float* delta, const float* q, const float* k, const float* v, const float* d_o,              \
        const float* lse, int T, int d_k) {                                                                     \
        flash_bwd_dq<D>(dq, delta, q, k, v, d_o, lse, T, d_k);                                                  \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) k_flash_bwd_dkdv_d##D(                            \
        float* dk, float* dv, const float* q, const float* k, const float* v, const float* d_o,                 \
        const float* lse, const float* delta, int T, int d_k) {                                                 \
        flash_bwd_dkdv<D>(dk, dv, q, k, v, d_o, lse, delta, T, d_k);                                            \
    }
FLASH_KERNELS(32)
FLASH_KERNELS(64)
FLASH_KERNELS(128)
