// Flash attention forward on the tensor cores at FP32 accuracy (3xTF32), the next step of issue 12 after the
// SIMT version in flash_attention.cu (correct, but 0.676 ms forward at B=8, 12 heads, T=1024, d_k=64, against
// SDPA's 0.511 and the goal of 0.40). Not part of the engine yet: dev/flash_attention.py --tc checks it against
// float64 and the fast pipeline and times it. Written without a GPU: it has not run yet.
//
// The same schedule and arguments as k_flash_fwd: a block owns 64 query rows of one head (blockIdx.y =
// b * NH + h), the longest rows first, and streams 64-key tiles up to the diagonal; an online softmax in FP32
// (a running max and sum per row); lse[i] = max + log(sum) for the backward. Four warps, each 16 query rows
// (one m16 tile of mma.sync m16n8k8).
//   - S = Q K^T: each operand split into a TF32 high part and the rest (a warp's own Q rows as it reads them,
//     the K rows every warp reads once, as they are stored to shared memory); hi*lo + lo*hi + hi*hi on the
//     tensor cores for each 8 of d, added into an FP32 running sum; then times 1.0f / sqrtf(d_k), as the
//     literal line scales the dot product.
//   - P V: P stays in registers. The accumulator layout of S (row g: columns 2t, 2t+1 of each 8) is the A
//     operand's layout once the 8 keys of a step are relabelled (logical column t = key 2t, t + 4 = key
//     2t + 1), so P feeds the next mma without a trip through shared memory; V's rows are read with the same
//     relabelling. Again three products a step of 8 keys, added into FP32.
// Deterministic: every sum in a fixed order, no atomics.
#include "matmul_tc.cuh"  // tf32_split, mma_tf32, mma_tf32_first

#define FT_ROWS 64  // query rows a block: four warps of 16
#define FT_KEYS 64  // keys a tile
#define FT_THREADS 128

// Shared memory at row stride D + 8 (d_k padded to 32, 64 or 128): tiles of 64 rows, raw or split into hi and
// lo. Row pairs of d (float2) then fall on distinct banks across a warp; the split tiles are also read 8 d
// apart across a quad, which their swizzle (ft_load_split) keeps off each other's banks. The forward holds Q
// raw and K, V split; the backward two operands raw, two split, and a query tile's lse and delta.
template <int D>
struct FtLayout {
    static constexpr int LD = D + 8, TILE = 64 * LD;
    static constexpr int FWD_FLOATS = 5 * TILE, BWD_FLOATS = 6 * TILE + 2 * 64;
};

// rows [r0, r0 + 64) of the (T, d_k) matrix p, split into hi and lo, zero past T and past d_k up to D (zeros
// split into zeros: the padding adds exact zeros to every product); column d of row r at r * ld + (d ^ ((r & 4)
// << 1)), swizzled for reads both as row pairs of d and 8 d apart across a quad (ft_rows_dot, ft_weigh)
template <int D>
__device__ __forceinline__ void ft_load_split(float* hi, float* lo, int ld, const float* p, int r0, int T, int d_k) {
    for (int e = threadIdx.x; e < 64 * D; e += FT_THREADS) {
        const int r = e / D, d = e % D;
        const float x = (r0 + r < T && d < d_k) ? p[(long long)(r0 + r) * d_k + d] : 0.0f;
        uint32_t h, l;
        tf32_split(x, h, l);
        const int at = r * ld + (d ^ ((r & 4) << 1));
        hi[at] = __uint_as_float(h);
        lo[at] = __uint_as_float(l);
    }
}

// rows [r0, r0 + 64) of the (T, d_k) matrix p as they are: s[row * ld + d], zero past T and past d_k up to D
template <int D>
__device__ __forceinline__ void ft_load(float* s, int ld, const float* p, int r0, int T, int d_k) {
    for (int e = threadIdx.x; e < 64 * D; e += FT_THREADS) {
        const int r = e / D, d = e % D;
        s[r * ld + d] = (r0 + r < T && d < d_k) ? p[(long long)(r0 + r) * d_k + d] : 0.0f;
    }
}

// acc[j] (n8 tile j of 64 columns) = A B^T over d: A the warp's 16 rows (raw, at a: row stride lda), B 64 rows
// (split, b_hi/b_lo: row stride ldb); three products for each 8 of d, added into the FP32 sum
template <int D>
__device__ __forceinline__ void ft_rows_dot(float (&acc)[8][4], const float* a, int lda, const float* b_hi,
                                            const float* b_lo, int ldb) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 1  // unrolled, the backward's two products of a tile interleave and spill (dK, dV at d_k 32)
    for (int kk = 0; kk < D; kk += 8) {
        uint32_t a_hi[4], a_lo[4];
        const float2 u = *reinterpret_cast<const float2*>(a + g * lda + kk + 2 * t);
        const float2 w = *reinterpret_cast<const float2*>(a + (g + 8) * lda + kk + 2 * t);
        const float av[4] = {u.x, w.x, u.y, w.y};  // (g, d 2t), (g + 8, 2t), (g, 2t + 1), (g + 8, 2t + 1)
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(av[r], a_hi[r], a_lo[r]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int at = (8 * j + g) * ldb + ((kk + 2 * t) ^ ((g & 4) << 1));  // row 8j + g, swizzled
            const float2 bh = *reinterpret_cast<const float2*>(b_hi + at);
            const float2 bl = *reinterpret_cast<const float2*>(b_lo + at);
            const uint32_t bhi[2] = {__float_as_uint(bh.x), __float_as_uint(bh.y)};
            const uint32_t blo[2] = {__float_as_uint(bl.x), __float_as_uint(bl.y)};
            float p[4];
            mma_tf32_first(p, a_lo, bhi);
            mma_tf32(p, a_hi, blo);
            mma_tf32(p, a_hi, bhi);
#pragma unroll
            for (int r = 0; r < 4; r++) acc[j][r] = kk == 0 ? p[r] : acc[j][r] + p[r];
        }
    }
}

// out += W M: W the warp's 16 x 64 weights in the accumulator layout (w[j]: columns 8j + 2t, + 1), M 64 rows of
// D (split: row stride ld); each step of 8 rows of M relabelled as the forward's P V
template <int D>
__device__ __forceinline__ void ft_weigh(float (&out)[D / 8][4], const float (&w)[8][4], const float* m_hi,
                                         const float* m_lo, int ld) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        uint32_t a_hi[4], a_lo[4];
        const float a[4] = {w[kb][0], w[kb][2], w[kb][1], w[kb][3]};
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(a[r], a_hi[r], a_lo[r]);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            // M[row 8kb + 2t][d 8n + g] and the next row, swizzled alike (rows 2t, 2t + 1 share bit 2): without
            // it rows 2t and 2t + 4, 16 rows of D + 8 apart, share banks
            const int at = (8 * kb + 2 * t) * ld + ((8 * n + g) ^ ((t & 2) << 2));
            const uint32_t b_hi[2] = {__float_as_uint(m_hi[at]), __float_as_uint(m_hi[at + ld])};
            const uint32_t b_lo[2] = {__float_as_uint(m_lo[at]), __float_as_uint(m_lo[at + ld])};
            float p[4];
            mma_tf32_first(p, a_lo, b_hi);
            mma_tf32(p, a_hi, b_lo);
            mma_tf32(p, a_hi, b_hi);
#pragma unroll
            for (int r = 0; r < 4; r++) out[n][r] += p[r];
        }
    }
}

// the max and the sum over the four threads of a quad (the threads holding one row's columns)
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// ---------------------------------------------------------------------------------------------- forward
template <int D>
__device__ void flash_tc_fwd(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {
#if TC_AVAILABLE
    using L = FtLayout<D>;
    constexpr int ND = D / 8;  // n8 tiles of the output's d
    extern __shared__ __align__(16) float ft_smem[];
    float* qs = ft_smem;  // raw
    float* k_hi = qs + L::TILE;
    float* k_lo = k_hi + L::TILE;
    float* v_hi = k_lo + L::TILE;
    float* v_lo = v_hi + L::TILE;
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, o += head;
    lse += (long long)blockIdx.y * T;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FT_ROWS;  // the longest rows first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;  // this thread's two query rows
    const float scale = 1.0f / sqrtf((float)d_k);

    ft_load<D>(qs, L::LD, q, q0, T, d_k);
    const float* q_w = qs + warp * 16 * L::LD;  // the warp's 16 rows
    float acc[ND][4];  // O: of n8 tile n, (row_a, 8n + 2t), (row_a, 8n + 2t + 1), (row_b, ...), (row_b, ...)
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[n][r] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += FT_KEYS) {
        __syncthreads();  // the previous tile's K and V are read (and, the first time, Q is stored)
        ft_load_split<D>(k_hi, k_lo, L::LD, k, k0, T, d_k);
        ft_load_split<D>(v_hi, v_lo, L::LD, v, k0, T, d_k);
        __syncthreads();

        // s[j]: this warp's 16 rows against keys k0 + 8 j .. + 7, in the accumulator layout
        float s[8][4];
        ft_rows_dot<D>(s, q_w, L::LD, k_hi, k_lo, L::LD);

        // scale and mask; the online softmax of rows a (s[j][0..1]) and b (s[j][2..3])
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + 8 * j + 2 * t + e;
                s[j][e] = (key <= row_a && key < T) ? s[j][e] * scale : -INFINITY;
                s[j][2 + e] = (key <= row_b && key < T) ? s[j][2 + e] * scale : -INFINITY;
                mx_a = fmaxf(mx_a, s[j][e]);
                mx_b = fmaxf(mx_b, s[j][2 + e]);
            }
        // finite: key k0 <= q0 <= row is in every tile, for the padding rows past T too
        const float new_a = fmaxf(m_a, quad_max(mx_a)), new_b = fmaxf(m_b, quad_max(mx_b));
        const float alpha_a = expf(m_a - new_a), alpha_b = expf(m_b - new_b);
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[j][e] = expf(s[j][e] - new_a);
                s[j][2 + e] = expf(s[j][2 + e] - new_b);
                sum_a += s[j][e];
                sum_b += s[j][2 + e];
            }
        l_a = l_a * alpha_a + quad_sum(sum_a);
        l_b = l_b * alpha_b + quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            acc[n][0] *= alpha_a, acc[n][1] *= alpha_a;
            acc[n][2] *= alpha_b, acc[n][3] *= alpha_b;
        }

        // O += P V; P's accumulator layout is the A operand's, relabelled (ft_weigh)
        ft_weigh<D>(acc, s, v_hi, v_lo, L::LD);
    }

#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (row_a < T) o[(long long)row_a * d_k + d] = acc[n][e] / l_a;
            if (row_b < T) o[(long long)row_b * d_k + d] = acc[n][2 + e] / l_b;
        }
    if (t == 0) {
        if (row_a < T) lse[row_a] = m_a + logf(l_a);
        if (row_b < T) lse[row_b] = m_b + logf(l_b);
    }
#else
    __trap();  // mma.sync TF32 needs sm_80
#endif
}

// ---------------------------------------------------------------------------------------------- backward
// The SIMT kernels' schedule (flash_attention.cu: dq with delta = rowsum(P dP) from a first pass, then dK and dV
// for a block of keys from the diagonal on) with every product on the tensor cores as in the forward. A warp's
// own 16 rows of an operand are read raw and split as they are loaded (no other warp reads them), as the
// forward's Q; the rows all four warps read are split once, as they are stored to shared memory. Not yet run
// on a GPU.

// dq = scale * sum over keys of ds k, ds = p (dp - delta), dp = do v^T, p = exp(q k^T * scale - lse); delta
// (the row's sum of p dp, from a first pass) written for the dK, dV kernel
template <int D>
__device__ void flash_tc_bwd_dq(float* dq, float* delta, const float* q, const float* k, const float* v,
                                const float* d_o, const float* lse, int T, int d_k) {
#if TC_AVAILABLE
    using L = FtLayout<D>;
    constexpr int ND = D / 8;
    extern __shared__ __align__(16) float ft_smem[];
    float* qs = ft_smem;            // raw
    float* dos = qs + L::TILE;      // raw
    float* k_hi = dos + L::TILE;
    float* k_lo = k_hi + L::TILE;
    float* v_hi = k_lo + L::TILE;
    float* v_lo = v_hi + L::TILE;
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, d_o += head, dq += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FT_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const float lse_a = row_a < T ? lse[row_a] : 0.0f, lse_b = row_b < T ? lse[row_b] : 0.0f;

    ft_load<D>(qs, L::LD, q, q0, T, d_k);
    ft_load<D>(dos, L::LD, d_o, q0, T, d_k);
    const float* q_w = qs + warp * 16 * L::LD;
    const float* do_w = dos + warp * 16 * L::LD;
    // p and dp of one key tile (p zero where the mask or the padding hides the key), as both passes see them
    auto scores = [&](float (&p)[8][4], float (&dp)[8][4], int k0) {
        ft_rows_dot<D>(p, q_w, L::LD, k_hi, k_lo, L::LD);
        ft_rows_dot<D>(dp, do_w, L::LD, v_hi, v_lo, L::LD);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + 8 * j + 2 * t + e;
                // _rn: s * scale rounded as the forward rounds it (no FMA with lse), so p is 1 where it was
                const bool seen_a = key <= row_a && key < T && row_a < T, seen_b = key <= row_b && key < T && row_b < T;
                p[j][e] = seen_a ? expf(__fmul_rn(p[j][e], scale) - lse_a) : 0.0f;
                p[j][2 + e] = seen_b ? expf(__fmul_rn(p[j][2 + e], scale) - lse_b) : 0.0f;
            }
    };
    auto load_kv = [&](int k0) {
        __syncthreads();  // the previous tile is read (and, the first time, Q and dO are stored)
        ft_load_split<D>(k_hi, k_lo, L::LD, k, k0, T, d_k);
        ft_load_split<D>(v_hi, v_lo, L::LD, v, k0, T, d_k);
        __syncthreads();
    };

    float delta_a = 0.0f, delta_b = 0.0f;
    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += FT_KEYS) {  // pass 1: delta
        load_kv(k0);
        float p[8][4], dp[8][4];
        scores(p, dp, k0);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                delta_a += p[j][e] * dp[j][e];
                delta_b += p[j][2 + e] * dp[j][2 + e];
            }
    }
    delta_a = quad_sum(delta_a), delta_b = quad_sum(delta_b);
    if (t == 0) {
        if (row_a < T) delta[row_a] = delta_a;
        if (row_b < T) delta[row_b] = delta_b;
    }

    float acc[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[n][r] = 0.0f;
    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += FT_KEYS) {  // pass 2: dq
        load_kv(k0);
        float p[8][4], dp[8][4];
        scores(p, dp, k0);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                p[j][e] *= dp[j][e] - delta_a;  // ds
                p[j][2 + e] *= dp[j][2 + e] - delta_b;
            }
        ft_weigh<D>(acc, p, k_hi, k_lo, L::LD);
    }
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (row_a < T) dq[(long long)row_a * d_k + d] = acc[n][e] * scale;
            if (row_b < T) dq[(long long)row_b * d_k + d] = acc[n][2 + e] * scale;
        }
#else
    __trap();
#endif
}

// for a block of 64 keys: dv = sum over queries of p^T do, dk = scale * sum of ds^T q; a warp owns 16 keys
template <int D>
__device__ void flash_tc_bwd_dkdv(float* dk, float* dv, const float* q, const float* k, const float* v,
                                  const float* d_o, const float* lse, const float* delta, int T, int d_k) {
#if TC_AVAILABLE
    using L = FtLayout<D>;
    constexpr int ND = D / 8;
    extern __shared__ __align__(16) float ft_smem[];
    float* ks = ft_smem;            // raw: the block's keys
    float* vs = ks + L::TILE;       // raw
    float* q_hi = vs + L::TILE;
    float* q_lo = q_hi + L::TILE;
    float* do_hi = q_lo + L::TILE;
    float* do_lo = do_hi + L::TILE;
    float* tile_lse = do_lo + L::TILE;  // [64]
    float* tile_delta = tile_lse + 64;  // [64]
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, d_o += head, dk += head, dv += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const int k0 = blockIdx.x * FT_KEYS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int key_a = k0 + warp * 16 + g, key_b = key_a + 8;  // this thread's two key rows
    const float scale = 1.0f / sqrtf((float)d_k);

    ft_load<D>(ks, L::LD, k, k0, T, d_k);
    ft_load<D>(vs, L::LD, v, k0, T, d_k);
    const float* k_w = ks + warp * 16 * L::LD;
    const float* v_w = vs + warp * 16 * L::LD;
    float acc_k[ND][4], acc_v[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc_k[n][r] = 0.0f, acc_v[n][r] = 0.0f;
    for (int q0 = k0; q0 < T; q0 += FT_ROWS) {  // the queries that see these keys: from the diagonal on
        __syncthreads();  // the previous tile is read (and, the first time, K and V are stored)
        ft_load_split<D>(q_hi, q_lo, L::LD, q, q0, T, d_k);
        ft_load_split<D>(do_hi, do_lo, L::LD, d_o, q0, T, d_k);
        if (threadIdx.x < 64) {
            const int qi = q0 + threadIdx.x;
            tile_lse[threadIdx.x] = qi < T ? lse[qi] : 0.0f;
            tile_delta[threadIdx.x] = qi < T ? delta[qi] : 0.0f;
        }
        __syncthreads();
        // p^T and dp^T: rows this warp's keys, columns the tile's queries 8j + 2t (+ 1)
        float pt[8][4], dpt[8][4];
        ft_rows_dot<D>(pt, k_w, L::LD, q_hi, q_lo, L::LD);
        ft_rows_dot<D>(dpt, v_w, L::LD, do_hi, do_lo, L::LD);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 8 * j + 2 * t + e, qi = q0 + col;
                const float l = tile_lse[col], dl = tile_delta[col];
                const bool seen_a = key_a <= qi && qi < T && key_a < T, seen_b = key_b <= qi && qi < T && key_b < T;
                pt[j][e] = seen_a ? expf(__fmul_rn(pt[j][e], scale) - l) : 0.0f;
                pt[j][2 + e] = seen_b ? expf(__fmul_rn(pt[j][2 + e], scale) - l) : 0.0f;
                dpt[j][e] = pt[j][e] * (dpt[j][e] - dl);  // ds^T
                dpt[j][2 + e] = pt[j][2 + e] * (dpt[j][2 + e] - dl);
            }
        ft_weigh<D>(acc_v, pt, do_hi, do_lo, L::LD);
        ft_weigh<D>(acc_k, dpt, q_hi, q_lo, L::LD);
    }
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (key_a < T) {
                dk[(long long)key_a * d_k + d] = acc_k[n][e] * scale;
                dv[(long long)key_a * d_k + d] = acc_v[n][e];
            }
            if (key_b < T) {
                dk[(long long)key_b * d_k + d] = acc_k[n][2 + e] * scale;
                dv[(long long)key_b * d_k + d] = acc_v[n][2 + e];
            }
        }
#else
    __trap();
#endif
}

// The kernels, one per padded width, with the SIMT kernels' arguments: grid (ceil(T / 64), B * NH), FT_THREADS
// threads, the shared memory dev/flash_attention.py computes from D.
#define FLASH_TC_KERNELS(D)                                                                                    \
    extern "C" __global__ void __launch_bounds__(FT_THREADS) k_flash_tc_fwd_d##D(                             \
        float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {               \
        flash_tc_fwd<D>(o, lse, q, k, v, T, d_k);                                                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(FT_THREADS) k_flash_tc_bwd_dq_d##D(                          \
        float* dq, float* delta, const float* q, const float* k, const float* v, const float* d_o,             \
        const float* lse, int T, int d_k) {                                                                    \
        flash_tc_bwd_dq<D>(dq, delta, q, k, v, d_o, lse, T, d_k);                                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(FT_THREADS) k_flash_tc_bwd_dkdv_d##D(                        \
        float* dk, float* dv, const float* q, const float* k, const float* v, const float* d_o,                \
        const float* lse, const float* delta, int T, int d_k) {                                                \
        flash_tc_bwd_dkdv<D>(dk, dv, q, k, v, d_o, lse, delta, T, d_k);                                        \
    }
FLASH_TC_KERNELS(32)
FLASH_TC_KERNELS(64)
FLASH_TC_KERNELS(128)
#undef FLASH_TC_KERNELS
